"""Compile the PCT Triton kernels for an sm_90 GPU without one (see helpers_triton_compile)."""

import pytest
from helpers_triton_compile import SM90_SHARED_MEMORY, compile_for_sm90

pytest.importorskip("triton")

BODY = """
from zpx_hf import ops_pct_triton

strides = ("sqb", "sqh", "sqm", "sqd", "skb", "skh", "skn", "skd", "svb", "svh", "svn", "svd", "sob", "soh",
           "som", "sod", "s_kpm", "s_doc", "s_part", "H", "GROUP", "L_Q", "L_K", "D", "OFFSET")

def types(dtype):
    t = {n: "*" + dtype for n in ("Q", "K", "V", "O", "DO", "DK", "DV", "DQ")}
    t.update({n: "*fp32" for n in ("TAU", "BIAS", "DTAU", "DBIAS")}, KPM="*i8")
    t.update({n: "*i32" for n in ("DOC", "DOC_FIRST", "DOC_END")})
    t.update({n: "i32" for n in strides})
    return t

# The default 64 x 64 tile at the largest head size (most shared memory), fp32 (ieee) and bf16.
for dtype, precision in (("fp32", "ieee"), ("bf16", "tf32")):
    flags = dict(CAUSAL=True, HAS_KPM=True, HAS_DOC=True, PRECISION=precision, BLOCK_D=128, BLOCK_M=64, BLOCK_N=64)
    for kernel in (
        ops_pct_triton._pct_fwd_kernel,
        ops_pct_triton._pct_bwd_dkdv_kernel,
        ops_pct_triton._pct_bwd_dq_kernel,
    ):
        compile_kernel(kernel, types(dtype), flags, num_warps=4, num_stages=2, tag=dtype)
"""


def test_pct_kernels_compile_for_sm90_within_shared_memory(tmp_path):
    results = compile_for_sm90(BODY, tmp_path)
    assert len(results) == 2 * 3
    # Larger autotune configs that do not fit are pruned by the autotuner at run time.
    for name, dtype, shared in results:
        assert shared <= SM90_SHARED_MEMORY, f"{name} {dtype} D=128 64x64 needs {shared} bytes"
