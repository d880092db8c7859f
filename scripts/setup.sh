#!/usr/bin/env bash
# Creates a virtual environment with torch and builds customops into it (editable install).
#
#   bash scripts/setup.sh                      CPU torch and CPU kernels, unless a GPU is visible
#   CUSTOMOPS_WITH_CUDA=1 bash scripts/setup.sh   CUDA torch and CUDA kernels (no GPU needed to build)
#
#   VENV=.venv  TORCH_SPEC=...  PYTHON=python3  MAX_JOBS=2  TORCH_CUDA_ARCH_LIST=...
#
# TORCH_SPEC defaults to torch==2.14.1 (a CUDA 13.0 build) for CUDA and torch==2.13.0 for the
# CPU (a CPU-only build on this project's package registry; elsewhere pass a CPU wheel's spec).
# Compiled objects persist in build/, so running this again recompiles only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
export MAX_JOBS=${MAX_JOBS:-2}
if [ -z "${CUSTOMOPS_WITH_CUDA:-}" ]; then
  if nvidia-smi -L > /dev/null 2>&1; then CUSTOMOPS_WITH_CUDA=1; else CUSTOMOPS_WITH_CUDA=0; fi
fi
export CUSTOMOPS_WITH_CUDA
if [ "$CUSTOMOPS_WITH_CUDA" = 1 ]; then
  TORCH_SPEC=${TORCH_SPEC:-torch==2.14.1}
  what="CUDA torch ($TORCH_SPEC, about 5.5 GB) and the CPU and CUDA kernels (about 11 minutes on 2 cores the first time, torch included; seconds when nothing changed)"
else
  TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
  what="CPU torch ($TORCH_SPEC) and the CPU kernels (about 5 minutes on 2 cores the first time, seconds when nothing changed)"
fi
echo "customops setup: $VENV with $what"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
quiet_pip() {  # pip -q, without the lines about this machine's unused local package folders
  "${pip[@]}" install -q "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2)
}
# What is already installed is not re-resolved: a second run costs seconds, not minutes. The
# stamp hashes pyproject.toml and this script, so a change to a package list here installs again.
stamp="$VENV/.customops-setup"
want="$TORCH_SPEC cuda=$CUSTOMOPS_WITH_CUDA $(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  quiet_pip --upgrade pip "setuptools>=77" wheel
  quiet_pip "$TORCH_SPEC" ninja numpy
  # CUTLASS headers for the Hopper GEMM kernels: a build dependency only. --no-deps: the
  # package's Python code generator (and its dependencies) is not used, only its C++ headers.
  if [ "$CUSTOMOPS_WITH_CUDA" = 1 ]; then quiet_pip --no-deps "nvidia-cutlass==4.2.0.0"; fi
  # The extras' dependencies (pyproject.toml), the lint tools of scripts/lint.sh among them (the
  # formatters pinned: their output changes between versions); customops itself is installed
  # with --no-deps below. --no-warn-conflicts: nvidia-cutlass's own requirements are
  # deliberately missing.
  # nvidia-pytriton and tritonclient: the serving tests (customops[serve]; pyproject.toml says
  # why >=0.7, which brings numpy<2); about 1 minute more.
  quiet_pip --no-warn-conflicts pytest hypothesis scikit-learn tqdm onnx onnxscript onnxruntime matplotlib \
    "nvidia-pytriton>=0.7" "tritonclient[http,grpc]" ruff==0.17.6 clang-format==23.1.5 "pre-commit>=3.2" pre-commit-hooks
  # torchvision, to compare deform_conv2d with (a test dependency): 0.29.1 loads with torch 2.14.1
  # only (its wheels here do not load under the CPU-only torch 2.13), so it is installed where
  # that torch is; elsewhere the comparisons skip, saying why. --no-deps: keep the torch above.
  if "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.__version__.split("+")[0] != "2.14.1")'; then
    quiet_pip --no-deps "torchvision==0.29.1"
  fi
fi
# The op library must be compiled against the torch it runs with: no build isolation. pip
# prints the build's output only with -v; of that, show ninja's [n/N] progress with the file
# names and customops' own lines, and keep the whole log in build/setup.log.
mkdir -p build
export PATH="$(cd "$VENV/bin" && pwd):$PATH"  # ninja
: > build/setup.log  # emptied before tail opens it
"${pip[@]}" install -v --no-deps --no-build-isolation -e . >> build/setup.log 2>&1 < /dev/null &
pid=$!
tail -n +1 -f --pid=$pid build/setup.log \
  | grep --line-buffered -E '^ *(\[[0-9]+/[0-9]+\]|customops: )' \
  | sed -u -E 's/^ *(\[[0-9]+\/[0-9]+\]) .* -c (\S+\.(cpp|cu)) .*/\1 \2/; s/^ +//' | sed -u "s#$PWD/##" || true
if ! wait $pid; then
  echo "customops setup: the build failed; the end of build/setup.log:" >&2
  tail -40 build/setup.log >&2
  exit 1
fi
echo "$want" > "$stamp"
"$VENV/bin/python" -c "import customops, torch; print('customops', customops.__version__, 'on torch', torch.__version__, 'kernels:', customops.compiled_backends())"
