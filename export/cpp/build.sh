#!/usr/bin/env bash
# Builds customops_serve against the torch and op library of PYTHON (default: the repo's .venv),
# installs it with the CMake package into build/cpp/install, then builds the find_package
# example against that install. Prints the binary's path last.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-$root/.venv/bin/python}
BUILD=${BUILD:-$root/build/cpp}
mkdir -p "$BUILD"
prefix=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
library=$("$PYTHON" -c 'import customops; print(customops.library_path())')
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# With a CUDA torch, torch's CMake config looks for the CUDA toolkit; pip's CUDA torch keeps
# cuBLAS/cuDNN headers and nvrtc in site-packages rather than in the toolkit: point CMake there.
mapfile -t cuda_args < <("$PYTHON" - <<'PY'
import glob, os, torch
if torch.version.cuda is not None:
    home = os.environ["CUDA_HOME"]
    roots = [home]
    try:
        import nvidia
        roots += list(nvidia.__path__)
    except ImportError:
        pass
    def first(*patterns):
        for root in roots:
            for pattern in patterns:
                hits = sorted(glob.glob(os.path.join(root, pattern)))
                if hits:
                    return hits[0]
    print(f"-DCUDA_TOOLKIT_ROOT_DIR={home}")
    for var, patterns in [("CUDA_CUDART_LIBRARY", ("lib64/libcudart.so", "lib/libcudart.so", "*/lib/libcudart.so*")),
                          ("CUDA_nvrtc_LIBRARY", ("lib64/libnvrtc.so", "lib/libnvrtc.so", "*/lib/libnvrtc.so*"))]:
        hit = first(*patterns)
        if hit:
            print(f"-D{var}={hit}")
    includes = [d for root in roots[1:] for d in sorted(glob.glob(os.path.join(root, "*", "include")))]
    if includes:
        print("-DCUSTOMOPS_CUDA_INCLUDE_DIRS=" + ";".join(includes))
PY
)
cmake -S "$root/export/cpp" -B "$BUILD/serve" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCUSTOMOPS_LIBRARY="$library" "${cuda_args[@]}" > "$BUILD/serve.log" 2>&1 \
  || { tail -30 "$BUILD/serve.log"; exit 1; }
cmake --build "$BUILD/serve" -j "${MAX_JOBS:-2}" >> "$BUILD/serve.log" 2>&1 || { tail -30 "$BUILD/serve.log"; exit 1; }
cmake --install "$BUILD/serve" --prefix "$BUILD/install" >> "$BUILD/serve.log" 2>&1
# The example is configured as a user's project would be: with the install prefix alone (the
# installed customopsConfig.cmake knows where torch and its CUDA pieces are).
cmake -S "$root/export/cpp/example" -B "$BUILD/example" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$BUILD/install" > "$BUILD/example.log" 2>&1 \
  || { tail -30 "$BUILD/example.log"; exit 1; }
cmake --build "$BUILD/example" -j "${MAX_JOBS:-2}" >> "$BUILD/example.log" 2>&1 || { tail -30 "$BUILD/example.log"; exit 1; }
echo "$BUILD/install/bin/customops_serve"
