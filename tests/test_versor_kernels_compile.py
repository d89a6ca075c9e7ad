"""Compile the Versor Triton kernels for an sm_90 GPU without one (see helpers_triton_compile)."""

import pytest
from helpers_triton_compile import SM90_SHARED_MEMORY, compile_for_sm90

pytest.importorskip("triton")

BODY = """
from zpx_hf import ops_gpa_triton

from zpx_hf import ops_rra_triton as rra_kernels

def gpa_types(dtype):
    p, f = "*" + dtype, "*fp32"
    types = dict(Q=p, K=p, V=p, O=p, DO=p, DK=p, DV=p, DQ=p, GAMMA=f, FORM_SIGN=f, QUERY_SIGN=f, LSE=f, DELTA=f,
                 DGAMMA=f, FORM_INDEX="*i32", KEY_VALID="*i8", DOCS="*i32",
                 DOC_FIRST="*i32", DOC_END="*i32", scale="fp32", eps="fp32")
    types.update({n: "i32" for n in ("num_heads", "group", "q_len", "k_len", "dim", "q_offset", "num_key_blocks")})
    return types

kernels = (ops_gpa_triton._gpa_fwd_kernel, ops_gpa_triton._gpa_bwd_dkdv_kernel, ops_gpa_triton._gpa_bwd_dq_kernel)
for dtype, precision in (("fp32", "tf32x3"), ("bf16", "default")):
    flags = dict(IS_CAUSAL=True, HAS_PADDING=True, HAS_DOCS=True, BIVECTOR=True, PRECISION=precision, BLOCK_M=64,
                 BLOCK_N=32, BLOCK_D=64)
    for fn in kernels:
        compile_kernel(fn, gpa_types(dtype), flags)
rotor_types = {n: "*fp32" for n in ("ROTORS", "INITIAL", "OUT", "GRAD", "GRAD_ROTORS", "GRAD_INITIAL")}
rotor_types.update(RESTARTS="*i8", num_seq="i32", seq_len="i32", renorm_every="i32")
compile_kernel(rra_kernels._rotor_scan_fwd_kernel, rotor_types, dict(BLOCK_S=32, RENORM=True, HAS_RESTARTS=True))
compile_kernel(rra_kernels._rotor_scan_bwd_kernel, rotor_types, dict(BLOCK_S=32, HAS_RESTARTS=True))
"""


def test_kernels_compile_for_sm90_within_shared_memory(tmp_path):
    results = compile_for_sm90(BODY, tmp_path)
    assert len(results) == 8
    for name, flags, shared in results:
        assert shared <= SM90_SHARED_MEMORY, f"{name} {flags} needs {shared} bytes of shared memory"
