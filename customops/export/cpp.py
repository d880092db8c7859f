"""Building and running the C++ server, export/cpp/customops_serve, from Python (tests and the
main job use it)."""

import os
import re
import shutil
import subprocess
import sys
from typing import Optional, Tuple

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_SCRIPT = os.path.join(REPO, "export", "cpp", "build.sh")
DEFAULT_BUILD = os.path.join(REPO, "build", "cpp")


def build_serve(build_dir: str = DEFAULT_BUILD) -> str:
    """Builds (or brings up to date) customops_serve and the find_package example against this
    Python's torch and op library; returns the installed binary's path. Needs cmake and a C++
    compiler. Raises RuntimeError with the build log's tail on failure."""
    if shutil.which("cmake") is None:
        raise RuntimeError("customops: building customops_serve needs cmake on PATH")
    env = dict(os.environ, PYTHON=sys.executable, BUILD=build_dir)
    out = subprocess.run(["bash", BUILD_SCRIPT], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"customops: building customops_serve failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def run_serve(binary: str, model_path: str, x: torch.Tensor, work_dir: str, runs: int = 50,
              device: Optional[str] = None) -> Tuple[torch.Tensor, float, float]:
    """Runs customops_serve on x; returns (output, median ms, p99 ms)."""
    inp, outp = os.path.join(work_dir, "serve_in.pt"), os.path.join(work_dir, "serve_out.pt")
    torch.save(x.detach().cpu(), inp)
    cmd = [binary, model_path, inp, outp, "--runs", str(runs), "--device", device or x.device.type]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"customops_serve failed ({out.returncode}): {out.stderr.strip()}")
    match = re.search(r"median ([\d.]+) ms, p99 ([\d.]+) ms", out.stdout)
    return torch.load(outp), float(match.group(1)), float(match.group(2))
