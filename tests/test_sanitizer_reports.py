"""scripts/sanitizer_reports.py, which decides scripts/sanitize.sh's verdict: a compute-sanitizer
report that names one of our kernels fails the run; reports in cuBLAS's or ATen's kernels (reached
through the generic path) are listed apart. The log lines are in compute-sanitizer's formats,
including a report that follows pytest's progress dots on the same line."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "sanitizer_reports.py")

CUBLAS_RACE = (
    "....========= Error: Race reported between Read access at nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_bias_TNT+0xb30\n"
    "=========     and Write access at nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_bias_TNT+0x2f60 [512 hazards]\n"
)
ATEN_INIT = (
    "========= Uninitialized __global__ memory read of size 16 bytes\n"
    "=========     at void at::native::vectorized_elementwise_kernel<(int)8, at::native::sigmoid_kernel_cuda>(int)+0xc0\n"
    "=========     by thread (32,0,0) in block (8,0,0)\n"
)
OURS_MEMCHECK = (
    "========= Invalid __global__ read of size 16 bytes\n"
    "=========     at void customops::fls_cuda::(anonymous namespace)::small_m_kernel<c10::BFloat16, 1>(customops::fls_cuda::(anonymous namespace)::Args)+0x1a0\n"
    "=========     by thread (3,0,0) in block (7,0,0)\n"
)
OURS_RACE = "========= Error: Race reported between Write access at void customops::cuda::elementwise_kernel<float>(int)+0x40\n"


def _run(tmp_path, text):
    log = tmp_path / "tool.log"
    log.write_text("============================= test session starts ==============================\n" + text
                   + "========= ERROR SUMMARY: 1 error\n")
    return subprocess.run([sys.executable, SCRIPT, str(log)], capture_output=True, text=True)


def test_reports_in_other_libraries_are_listed_and_pass(tmp_path):
    proc = _run(tmp_path, CUBLAS_RACE + ATEN_INIT)
    assert proc.returncode == 0, proc.stdout
    assert "reports in our kernels: 0" in proc.stdout
    assert "reports in other libraries' kernels: 2" in proc.stdout
    assert "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_bias_TNT" in proc.stdout
    assert "at::native::vectorized_elementwise_kernel" in proc.stdout


def test_a_report_in_our_kernel_fails(tmp_path):
    for ours in (OURS_MEMCHECK, OURS_RACE):
        proc = _run(tmp_path, CUBLAS_RACE + ours)
        assert proc.returncode == 1, proc.stdout
        assert "reports in our kernels: 1" in proc.stdout
        assert "customops::" in proc.stdout


def test_a_clean_log_passes(tmp_path):
    proc = _run(tmp_path, "........ [100%]\n")
    assert proc.returncode == 0 and "reports in our kernels: 0" in proc.stdout
