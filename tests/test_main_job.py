import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FORMS = [
    "eager",
    "torch.compile",
    "TorchScript (.pt, loaded)",
    "AOTInductor (.pt2, Python)",
    "ONNX Runtime (.onnx, CPU)",
    "C++ customops_serve (.pt)",
    "C++ customops_serve (.pt2)",
]


def _rows(text, header):
    """The rows of the table whose header line contains header: {first cell: cells}."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| ") and header in line) + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.split("|")[1:-1]]
        rows[cells[0]] = cells[1:]
    return rows


def test_main_job_trains_and_all_forms_agree(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "train_digits.py"),
            "--epochs",
            "8",
            "--seg-epochs",
            "3",
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
    # It removes its export folders (customops-digits-*, customops-segmentation-*; torch.compile's
    # cache and other libraries' files in TMPDIR are theirs), and prints only its report: no
    # warnings from torch's deprecations or from missing optional packages. The segmentation
    # stage's own torchvision comparison (its result, or one line saying why it is skipped)
    # is the one place that names torchvision.
    assert [p.name for p in tmp.iterdir() if p.name.startswith("customops")] == []
    digits, _, segmentation = out.stdout.partition("\nsegmentation: ")
    assert segmentation, out.stdout
    report, _, torchvision = segmentation.partition("\ntorchvision comparison")
    assert torchvision, out.stdout
    for noise in ("Warning", "No CUDA runtime is found", "torchvision", "input_handles"):
        assert noise not in digits + report + out.stderr, out.stdout + out.stderr
    assert "Warning" not in torchvision, out.stdout

    rows = _rows(digits, "test accuracy")
    assert list(rows)[:3] == FORMS[:3]
    assert "ONNX Runtime (.onnx, CPU)" in rows
    assert {"C++ customops_serve (.pt)", "C++ customops_serve (.pt2)"} <= set(rows), out.stdout  # shipped
    for name, cells in rows.items():
        if not cells[0].startswith("skipped:"):
            assert float(cells[0]) > 0.85, (name, cells)

    # Per-class IoU of the 11 classes and the mIoU, far above the all-background baseline (the
    # background's IoU over 11 classes, about 0.09), after 3 epochs.
    ious = _rows(report, "IoU (held-out canvases)")
    assert list(ious) == ["background"] + [f"digit {d}" for d in range(10)] + ["mIoU"], report
    miou = float(ious["mIoU"][0])
    assert miou > 0.4, report
    forms = _rows(report, "pixels as eager")
    ran = {name: cells for name, cells in forms.items() if not cells[0].startswith("skipped:")}
    assert set(FORMS) - {"AOTInductor (.pt2, Python)"} <= set(ran), report  # as the digits' forms
    for name, (_, form_miou, agree, diff, _) in ran.items():
        assert abs(float(form_miou) - miou) < 1e-3, (name, form_miou)
        assert float(agree.rstrip("%")) >= 99.99 and float(diff) < 1e-3, (name, agree, diff)
    if torchvision.startswith(": skipped: "):
        assert "\n" not in torchvision.strip(), torchvision
    else:  # the same network on torchvision's op: the same predictions, and both latencies
        assert "100.00% of pixels agree" in torchvision, torchvision
        timed = list(_rows(torchvision, "speed-up"))
        assert timed[0].startswith("the 2 ModulatedDeformConv2d layers") and timed[1] == "the whole network", timed
