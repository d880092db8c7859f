import shutil
import subprocess
import sys


def test_main_job_trains_and_all_forms_agree():
    out = subprocess.run(
        [sys.executable, "-m", "customops.train_digits", "--epochs", "8", "--device", "cpu", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "accuracy" not in line]
    names = [r.split("|")[1].strip() for r in rows]
    assert names[:3] == ["eager", "torch.compile", "TorchScript (.pt, loaded)"]
    assert "ONNX Runtime (.onnx, CPU)" in names
    if shutil.which("cmake"):
        assert {"C++ customops_serve (.pt)", "C++ customops_serve (.pt2)"} <= set(names), out.stdout
    for row in rows:
        if "skipped:" in row:
            continue
        accuracy = float(row.split("|")[2])
        assert accuracy > 0.85, row
