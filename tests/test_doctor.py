"""python -m customops.doctor: the health report runs every path and reports failures."""

import dataclasses
import json
import subprocess
import sys

import customops.doctor as doctor
from conftest import HAS_CUDA
from customops.testing import OP_SPECS


def test_every_path_passes_on_this_machine(tmp_path):
    report = tmp_path / "doctor.json"
    proc = subprocess.run(
        [sys.executable, "-m", "customops.doctor", "--json", str(report)], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    devices = ["cpu", "cuda"] if HAS_CUDA else ["cpu"]
    assert set(data["matrix"]) == {f"{s.name} ({d})" for s in OP_SPECS for d in devices}
    specs = {f"{s.name} ({d})": s for s in OP_SPECS for d in devices}
    for name, row in data["matrix"].items():
        assert set(row) == set(doctor.PATHS)
        for path in ("eager", "autograd", "compile", "export", "torchscript"):
            # A path the spec declares unsupported shows n/a with the spec's reason.
            expected = f"n/a: {specs[name].unsupported[path]}" if path in specs[name].unsupported else "pass"
            assert row[path] == expected, row
    assert "kernels compiled: CPU" in proc.stdout
    assert "every applicable path passes" in proc.stdout


def test_a_wrong_result_is_reported_as_a_failure():
    sigmoid = next(s for s in OP_SPECS if s.name == "sigmoid")
    broken = dataclasses.replace(sigmoid, reference=lambda x: x)  # wrong reference
    matrix = doctor.run_matrix(["cpu"], specs=[broken])
    row = matrix["sigmoid (cpu)"]
    assert row["eager"].startswith("FAIL: AssertionError")
    assert row["autograd"] == "pass"  # gradcheck does not use the reference
    assert doctor.format_report({}, matrix).count("FAIL") == sum(v.startswith("FAIL") for v in row.values())


def test_a_path_an_op_declares_unsupported_is_na_with_the_reason():
    sigmoid = next(s for s in OP_SPECS if s.name == "sigmoid")
    declared = dataclasses.replace(sigmoid, unsupported={"onnx": "no translation yet"})
    row = doctor.run_matrix(["cpu"], specs=[declared])["sigmoid (cpu)"]
    assert row["onnx"] == "n/a: no translation yet"
