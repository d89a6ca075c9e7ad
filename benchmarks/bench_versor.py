"""Versor: time and peak memory vs sequence length for GPA and RRA (issue #5).

Forward + backward of one op call, B=1, causal:

GPA, H=2 heads, c=2 multivector channels per head (D=64):
* `gpa-reference`  `gpa_reference`: materialises the [B, H, L, L, 11] scalar/bivector products
* `gpa-triton`     `gpa_triton`, the flash-style kernel (CUDA only: on CPU Triton only has its
                   interpreter, a correctness tool, not a fast path)
* `sdpa-scalar`    `gpa_scalar_sdpa`: the gamma = 0 special case through SDPA (a baseline: the scalar part only)

RRA, H=4 rotor heads, c=2 value channels per head (the whole op: rotor exponentials, scan, sandwich):
* `rra-sequential` the loop R_t = R_{t-1} dR_t
* `rra-chunked`    the chunked parallel scan
* `rra-triton`     the Triton scan kernel (CUDA only)

Each point runs in a fresh subprocess. Peak memory is the growth of peak RSS over the RSS just before the
op (CPU) or `torch.cuda.max_memory_allocated` above the inputs (CUDA). `us/token` = time / (B * L): flat
in L means linear scaling.

Usage:  python benchmarks/bench_versor.py [--gpa-lengths 256 512 1024] [--rra-lengths 1024 4096 16384 65536]
Writes benchmarks/results/versor_bench_cpu.md, and versor_bench_cuda.md (GPU rows, fp32 and bf16 for GPA)
when CUDA is available.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from measure import peak_rss_growth, rss_bytes, run_worker  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"
GPA_METHODS = ("gpa-reference", "gpa-triton", "sdpa-scalar")
RRA_METHODS = ("rra-sequential", "rra-chunked", "rra-triton")


def worker(method: str, length: int, device: str, dtype_name: str) -> dict:
    import torch

    if device == "cpu":
        torch.set_num_threads(1)  # small ops; reproducible on a shared machine
    from zpx_hf.ops_gpa import gpa_reference, gpa_scalar_sdpa, gpa_triton
    from zpx_hf.ops_rra import recursive_rotor_accumulator

    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    if method.startswith("rra"):
        heads, channels = 4, 2
        bivectors = (0.5 * torch.randn(1, length, heads, 10, device=device)).requires_grad_()
        values = torch.randn(1, length, heads, channels, 32, device=device, dtype=dtype).requires_grad_()
        kernel = method.split("-")[1]

        def op() -> torch.Tensor:
            return recursive_rotor_accumulator(bivectors, values, kernel=kernel)[0]

        leaves = (bivectors, values)
    else:
        heads, dim = 2, 64
        q, k, v = (torch.randn(1, heads, length, dim, device=device, dtype=dtype).requires_grad_() for _ in range(3))
        gamma = torch.full((heads,), 0.1, device=device, requires_grad=True)
        ops = {
            "gpa-reference": lambda: gpa_reference(q, k, v, gamma, is_causal=True)[0],
            "gpa-triton": lambda: gpa_triton(q, k, v, gamma, is_causal=True)[0],
            "sdpa-scalar": lambda: gpa_scalar_sdpa(q, k, v, is_causal=True),
        }
        op = ops[method]
        leaves = (q, k, v, gamma)

    def step() -> None:
        op().float().sum().backward()

    step()  # warm-up (allocator, kernel compilation)
    for leaf in leaves:
        leaf.grad = None
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss_bytes()
    repeats = 5 if device == "cuda" else 2
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = peak_rss_growth(base)
    seconds = (time.perf_counter() - start) / repeats
    return {"ms": seconds * 1e3, "us_per_token": seconds * 1e6 / length, "peak_mib": max(peak, 0) / 2**20}


def table(rows: dict, lengths: list[int], methods: list[str], title: str) -> list[str]:
    header = "| L | " + " | ".join(f"{m} ms | {m} us/tok | {m} peak MiB" for m in methods) + " |"
    lines = [title, "", header, "|---:|" + "---:|---:|---:|" * len(methods)]
    for length in lengths:
        cells = []
        for method in methods:
            row = rows.get((method, length))
            if row is None:
                cells += ["-", "-", "-"]
            elif "error" in row:
                cells += [f"failed ({row['error'][:40]})", "-", "-"]
            else:
                cells += [f"{row['ms']:,.1f}", f"{row['us_per_token']:,.1f}", f"{row['peak_mib']:,.0f}"]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return lines + [""]


def sweep(methods, lengths, device, dtype, limits) -> dict:
    rows = {}
    for method in methods:
        for length in lengths:
            if length > limits.get(method, 1 << 30):
                continue
            rows[(method, length)] = run_worker(__file__, [method, length, device, dtype])
            print(method, length, device, dtype, rows[(method, length)], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--gpa-lengths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--rra-lengths", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--sequential-max", type=int, default=16384, help="longest L for the Python loop")
    parser.add_argument("--cuda-gpa-lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--cuda-rra-lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))))
        return

    import torch

    RESULTS.mkdir(parents=True, exist_ok=True)
    cpu_gpa = sweep(("gpa-reference", "sdpa-scalar"), args.gpa_lengths, "cpu", "float32", {})
    cpu_rra = sweep(
        ("rra-sequential", "rra-chunked"), args.rra_lengths, "cpu", "float32", {"rra-sequential": args.sequential_max}
    )
    lines = [
        f"# Versor benchmark (CPU, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread per run)",
        "",
    ]
    lines += table(
        cpu_gpa,
        args.gpa_lengths,
        ["gpa-reference", "sdpa-scalar"],
        "GPA, forward + backward, B=1, H=2, D=64 (2 multivectors per head), causal, float32:",
    )
    lines += table(
        cpu_rra,
        args.rra_lengths,
        ["rra-sequential", "rra-chunked"],
        "RRA (rotor exp + scan + sandwich), forward + backward, B=1, H=4, 2 value channels per head, float32:",
    )
    lines.append(
        "CPU has no Triton fast path (the interpreter only checks correctness), so the kernel rows are GPU-only; "
        "`python benchmarks/bench_versor.py` on a CUDA machine writes them to versor_bench_cuda.md."
    )
    (RESULTS / "versor_bench_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    if torch.cuda.is_available():
        lines = [f"# Versor benchmark ({torch.cuda.get_device_name()}, torch {torch.__version__})", ""]
        for dtype in ("float32", "bfloat16"):
            rows = sweep(GPA_METHODS, args.cuda_gpa_lengths, "cuda", dtype, {"gpa-reference": 4096})
            lines += table(rows, args.cuda_gpa_lengths, list(GPA_METHODS), f"GPA, forward + backward, {dtype}:")
        rows = sweep(RRA_METHODS, args.cuda_rra_lengths, "cuda", "float32", {"rra-sequential": 16384})
        lines += table(rows, args.cuda_rra_lengths, list(RRA_METHODS), "RRA, forward + backward, float32:")
        (RESULTS / "versor_bench_cuda.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
