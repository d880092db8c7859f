"""scripts/sanitizer_reports.py, which decides scripts/sanitize.sh's verdict. The log lines are in
compute-sanitizer's formats (one from the 2026-11-29 racecheck run that caught a race in a
small-M kernel design), including reports that follow pytest's progress dots on the same line."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "sanitizer_reports.py")

CUBLAS_RACE = (
    "....========= Error: Race reported between Read access at nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_bias_TNT+0xb30\n"
    "=========     and Write access at nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_bias_TNT+0x2f60 [512 hazards]\n"
    "========= \n"
)
ATEN_MEMCHECK = (
    "========= Invalid __global__ read of size 16 bytes\n"
    "=========     at void at::native::vectorized_elementwise_kernel<(int)8, at::native::sigmoid_kernel_cuda>(int)+0xc0\n"
    "=========     by thread (32,0,0) in block (8,0,0)\n"
    "=========         Host Frame: cudaLaunchKernel [0x745b7] in libcudart.so.13\n"
)
OURS_MEMCHECK = (
    "========= Invalid __global__ read of size 16 bytes\n"
    "=========     at void customops::fls_cuda::<unnamed>::small_m_kernel<c10::BFloat16, (int)1>(customops::fls_cuda::<unnamed>::Args)+0x1a0 in fused_linear_sigmoid_small_m_cuda.cu:150\n"
    "=========     by thread (3,0,0) in block (7,0,0)\n"
)
OURS_RACE = (
    ".========= Error: Race reported between Write access at void customops::fls_cuda::<unnamed>::small_m_kernel"
    "<c10::BFloat16, (int)1, (int)1>(customops::fls_cuda::<unnamed>::Args)+0x3730\n"
)
OURS_RACE_WARNING = "========= Warning: Race reported between Read access at void customops::cuda::elementwise_kernel<float>(int)+0x40\n"
API_ERROR = '========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaMemcpyAsync.\n'
PYTEST = "=============================== warnings summary ===============================\n124 passed in 8.1s\n"


def _run(tmp_path, tool, text, summary=None):
    log = tmp_path / "tool.log"
    n = summary if summary is not None else text.count("Race reported" if tool == "racecheck" else "=========     at")
    log.write_text("========= COMPUTE-SANITIZER\n" + text + PYTEST + f"========= ERROR SUMMARY: {n} errors\n")
    return subprocess.run([sys.executable, SCRIPT, "--tool", tool, str(log)], capture_output=True, text=True)


@pytest.mark.parametrize("tool,text", [("racecheck", CUBLAS_RACE), ("memcheck", ATEN_MEMCHECK), ("memcheck", "")])
def test_reports_only_in_other_libraries_are_listed_and_pass(tmp_path, tool, text):
    proc = _run(tmp_path, tool, text)
    assert proc.returncode == 0, proc.stdout
    assert "reports in our kernels: 0" in proc.stdout and "clean for our kernels" in proc.stdout
    assert f"reports in other libraries' kernels: {1 if text else 0}" in proc.stdout


@pytest.mark.parametrize(
    "tool,ours", [("memcheck", OURS_MEMCHECK), ("racecheck", OURS_RACE), ("racecheck", OURS_RACE_WARNING)]
)
def test_a_report_in_our_kernel_fails(tmp_path, tool, ours):
    other = CUBLAS_RACE if tool == "racecheck" else ATEN_MEMCHECK
    proc = _run(tmp_path, tool, other + ours)
    assert proc.returncode == 1, proc.stdout
    assert "reports in our kernels: 1" in proc.stdout and "customops::" in proc.stdout


def test_reports_it_cannot_attribute_fail(tmp_path):
    proc = _run(tmp_path, "memcheck", API_ERROR, summary=1)
    assert proc.returncode == 1 and "name no kernel" in proc.stdout, proc.stdout
    # More reports in the summary than printed (--print-limit): the rest are unknown.
    proc = _run(tmp_path, "memcheck", ATEN_MEMCHECK, summary=60)
    assert proc.returncode == 1 and "the summary counts 60 reports and 1 were printed" in proc.stdout, proc.stdout


def test_every_initcheck_report_fails(tmp_path):
    # initcheck names the reader, so an output our kernel left unwritten shows up in ATen's kernel.
    proc = _run(
        tmp_path, "initcheck", ATEN_MEMCHECK.replace("Invalid __global__ read", "Uninitialized __global__ memory read")
    )
    assert proc.returncode == 1 and "names the reader" in proc.stdout, proc.stdout
    assert _run(tmp_path, "initcheck", "").returncode == 0
