"""Compile Triton kernels for an sm_90 GPU without one, in a subprocess without TRITON_INTERPRET.

Catches what the interpreter cannot: compiled control flow, tile shapes `tl.dot` rejects, and shared
memory over the device limit (227 KiB on H100/H200).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SM90_SHARED_MEMORY = 227 * 1024

_PREAMBLE = textwrap.dedent(
    """
    import json
    import multiprocessing
    import os

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    jobs = []

    def compile_kernel(fn, types, constexprs, num_warps=4, num_stages=None, tag=""):
        jobs.append((fn, types, constexprs, num_warps, num_stages, tag))

    def compile_job(index):
        fn, types, constexprs, num_warps, num_stages, tag = jobs[index]
        while not isinstance(fn, triton.runtime.JITFunction):  # autotune/heuristics wrap the JIT function
            fn = fn.fn
        names = fn.arg_names
        signature = {n: "constexpr" if n in constexprs else types[n] for n in names}
        source = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in constexprs.items()})
        options = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
        kernel = triton.compile(source, target=target, options=options)
        return [fn.__name__, tag or str(constexprs), kernel.metadata.shared]
    """
)
# Each compilation is single-threaded (LLVM, then ptxas) and independent of the others: one forked process per core
# (each inherits the kernels `body` defined) instead of one after another; results in the order `body` asked.
_RUN_JOBS = textwrap.dedent(
    """
    with multiprocessing.get_context("fork").Pool(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        results = pool.map(compile_job, range(len(jobs)), chunksize=1)
    print(json.dumps(results))
    """
)


def compile_for_sm90(body: str, tmp_path: Path) -> list[list]:
    """Run `body` (which calls `compile_kernel(...)`) and return [[kernel, tag, shared bytes], ...]."""
    script = _PREAMBLE + textwrap.dedent(body) + _RUN_JOBS
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton_cache")
    completed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if completed.returncode != 0 and "ptxas" in completed.stderr and "not found" in completed.stderr:
        pytest.skip("the Triton install has no CUDA compiler toolchain (ptxas)")
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])
