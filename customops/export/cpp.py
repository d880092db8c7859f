"""Running the C++ server customops_serve, which the package ships (``customops.server_path()``),
from Python: the tests, the doctor and the main job use it."""

import os
import re
import subprocess
from typing import Optional, Tuple

import torch

from .._library import server_path


def run_serve(
    binary: Optional[str],
    model_path: str,
    x: torch.Tensor,
    work_dir: str,
    runs: int = 50,
    device: Optional[str] = None,
    warmup: Optional[int] = None,
) -> Tuple[torch.Tensor, float, float]:
    """Runs customops_serve (``binary``, default the package's) on x, ``warmup`` untimed runs
    (default the server's) then ``runs`` timed ones; returns (output, median ms, p99 ms). Raises
    RuntimeError with the server's message when it fails."""
    inp, outp = os.path.join(work_dir, "serve_in.pt"), os.path.join(work_dir, "serve_out.pt")
    torch.save(x.detach().cpu(), inp)
    cmd = [binary or server_path(), model_path, inp, outp, "--runs", str(runs), "--device", device or x.device.type]
    if warmup is not None:
        cmd += ["--warmup", str(warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"customops_serve failed ({out.returncode}): {out.stderr.strip()}")
    match = re.search(r"median ([\d.]+) ms, p99 ([\d.]+) ms", out.stdout)
    return torch.load(outp), float(match.group(1)), float(match.group(2))
