"""Compile the PCT Triton kernels for an sm_90 GPU without one (catches what the interpreter cannot:
compiled control flow, tile shapes `tl.dot` rejects, shared memory over the device limit)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from zpx_hf import ops_pct

    target = GPUTarget("cuda", 90, 32)
    results = []
    strides = ("sqb", "sqh", "sqm", "sqd", "skb", "skh", "skn", "skd", "svb", "svh", "svn", "svd", "sob", "soh",
               "som", "sod", "s_kpm", "s_part", "H", "L_Q", "L_K", "D", "OFFSET")

    def types(dtype):
        t = {n: "*" + dtype for n in ("Q", "K", "V", "O", "DO", "DK", "DV", "DQ")}
        t.update({n: "*fp32" for n in ("TAU", "BIAS", "DTAU", "DBIAS")}, KPM="*i8")
        t.update({n: "i32" for n in strides})
        return t

    kernels = (ops_pct._pct_fwd_kernel, ops_pct._pct_bwd_dkdv_kernel, ops_pct._pct_bwd_dq_kernel)
    # The default 64 x 64 tile at the largest head size (most shared memory), fp32 (ieee) and bf16.
    for dtype, precision in (("fp32", "ieee"), ("bf16", "tf32")):
        for block_d in (128,):
            for block_m, block_n, warps, stages in ((64, 64, 4, 2),):
                flags = dict(CAUSAL=True, HAS_KPM=True, PRECISION=precision, BLOCK_D=block_d, BLOCK_M=block_m,
                             BLOCK_N=block_n)
                for tuned in kernels:
                    fn = tuned.fn
                    names = fn.arg_names
                    t = types(dtype)
                    signature = {n: "constexpr" if n in flags else t[n] for n in names}
                    source = ASTSource(fn=fn, signature=signature,
                                       constexprs={(names.index(k),): v for k, v in flags.items()})
                    kernel = triton.compile(source, target=target, options={"num_warps": warps, "num_stages": stages})
                    results.append([fn.__name__, dtype, block_d, block_m, block_n, kernel.metadata.shared])
    print(json.dumps(results))
    """
)


def test_pct_kernels_compile_for_sm90_within_shared_memory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton_cache")
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if completed.returncode != 0 and "ptxas" in completed.stderr and "not found" in completed.stderr:
        pytest.skip("the Triton install has no CUDA compiler toolchain (ptxas)")
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    assert len(results) == 2 * 3
    # Must fit an H100/H200's 227 KiB of shared memory; larger autotune configs that do not fit are
    # pruned by the autotuner at run time.
    for name, dtype, block_d, block_m, block_n, shared in results:
        assert shared <= 227 * 1024, f"{name} {dtype} D={block_d} {block_m}x{block_n} needs {shared} bytes"
