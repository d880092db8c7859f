import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_main_job_trains_and_all_forms_agree(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "train_digits.py"),
            "--epochs",
            "8",
            "--device",
            "cpu",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TMPDIR=str(tmp)),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # It removes its export folder (customops-digits-*; torch.compile's cache and other
    # libraries' files in TMPDIR are theirs), and prints only its report: no warnings from
    # torch's deprecations or from missing optional packages.
    assert [p.name for p in tmp.iterdir() if p.name.startswith("customops")] == []
    for noise in ("Warning", "No CUDA runtime is found", "torchvision", "input_handles"):
        assert noise not in out.stdout + out.stderr, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "accuracy" not in line]
    names = [r.split("|")[1].strip() for r in rows]
    assert names[:3] == ["eager", "torch.compile", "TorchScript (.pt, loaded)"]
    assert "ONNX Runtime (.onnx, CPU)" in names
    assert {"C++ customops_serve (.pt)", "C++ customops_serve (.pt2)"} <= set(names), out.stdout  # shipped
    for row in rows:
        if "skipped:" in row:
            continue
        accuracy = float(row.split("|")[2])
        assert accuracy > 0.85, row
