#!/usr/bin/env bash
# Device-side diagnosis of the segfault in tests/test_errors.py (torch 2.11, H200 machine).
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
g++ --version | head -1
python3 -c "import torch; c = torch.__config__.show(); print([l.strip() for l in c.splitlines() if 'CXX_COMPILER' in l or 'CXX_FLAGS' in l or 'GCC' in l][:3])"
python3 scripts/diag/error_cases.py
cuda-gdb -batch -ex run -ex bt --args python3 scripts/diag/error_cases.py cpu 4 2>&1 | grep -E "^#|signal|SIG" | head -40
