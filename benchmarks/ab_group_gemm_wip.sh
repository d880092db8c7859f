set -uo pipefail
pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$SECONDS
python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { tail -50 $OUT/build.log; exit 1; }
echo "build $((SECONDS-t0)) s"; t0=$SECONDS
timeout 150 python3 benchmarks/ab_group_gemm_wip.py > $OUT/ab_group.txt 2>&1; echo "ab rc $? $((SECONDS-t0)) s"; t0=$SECONDS
timeout 70 python3 -m pytest -q -x tests/test_deform_conv2d.py -k "cuda and (group or weight)" -p no:cacheprovider > $OUT/tests.txt 2>&1; echo "tests rc $? $((SECONDS-t0)) s"; tail -2 $OUT/tests.txt
python3 benchmarks/ab_deform_conv2d.py report $OUT/ab_group.txt old rule | tee $OUT/report_rule.md
python3 benchmarks/ab_deform_conv2d.py report $OUT/ab_group.txt old loop > $OUT/report_loop.md
python3 benchmarks/ab_deform_conv2d.py report $OUT/ab_group.txt tv rule > $OUT/report_tv.md
