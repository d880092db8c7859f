"""Runs one error case of tests/test_errors.py in this process (argv: device case), or, with no
arguments, every case in its own process, 16 at a time, and prints each exit code. Diagnoses a
segfault seen on the H200 machine (torch 2.11) on 2026-11-29."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))

if len(sys.argv) == 3:
    import faulthandler

    faulthandler.enable()
    import torch  # noqa: F401
    from test_errors import _cases

    op, args, _ = _cases(sys.argv[1])[int(sys.argv[2])]
    try:
        op(*args)
        print("no error raised")
    except RuntimeError as e:
        print("raised:", str(e).splitlines()[0][:90])
    sys.exit(0)

devices = ["cpu", "cuda"]


def _cases_count():
    import torch  # noqa: F401
    from test_errors import _cases

    return _cases("cpu")



def run(job):
    r = subprocess.run([sys.executable, __file__, *job], capture_output=True, text=True, timeout=300)
    return job, r.returncode, (r.stdout.strip().splitlines() or [""])[-1]


with ThreadPoolExecutor(16) as pool:
    for (dev, case), rc, tail in pool.map(run, [(d, str(c)) for d in devices for c in range(len(_cases_count()))]):
        print(f"{dev} case {case}: exit {rc} {tail}", flush=True)
