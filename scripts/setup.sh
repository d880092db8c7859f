#!/usr/bin/env bash
# Creates a virtual environment with torch, builds customops (CPU kernels, plus CUDA kernels
# when torch is a CUDA build and a CUDA toolkit is found) and installs it in editable mode.
#
#   VENV=.venv  TORCH_SPEC=torch==2.14.1  PYTHON=python3  MAX_JOBS=2  bash scripts/setup.sh
#
# TORCH_SPEC=torch==2.13.0 gives a CPU-only torch (CPU kernels only) where that wheel is available.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.14.1}
export MAX_JOBS=${MAX_JOBS:-2}
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip "setuptools>=77" wheel
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC" ninja numpy
# CUTLASS headers for the Hopper GEMM kernels: a build dependency only. --no-deps: the package's
# Python code generator (and its dependencies) is not used, only the C++ headers it carries.
"$VENV/bin/python" -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"
# The op library must be compiled against the torch it runs with: no build isolation.
# --no-warn-conflicts: pip's after-install check would otherwise print an "ERROR" that
# nvidia-cutlass's own (unused, deliberately not installed) requirements are missing; the
# resolver still resolves every requirement of this install.
"$VENV/bin/python" -m pip install -q --no-warn-conflicts --no-build-isolation -e ".[test,examples,export,bench]"
"$VENV/bin/python" -c "import customops, torch; print('customops', customops.__version__, 'on torch', torch.__version__, 'kernels:', customops.compiled_backends())"
