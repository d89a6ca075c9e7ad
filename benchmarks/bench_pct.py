"""PCT sigmoid attention: time (ratio to softmax SDPA) and peak memory vs sequence length.

Forward + backward of one attention call, B=1, H heads, complex head dim d (real head dim 2d), causal,
through `zpx_hf.ops_pct.pct_attention(..., kernel=...)`:

* `naive`         the formula with a full [B, H, L, L] gate tensor (`ops_pct_naive.py`)
* `panel`         query panels with a recomputing backward (`ops_pct_panel.py`; the CPU path; once `cpu`, `tiled`)
* `triton`        the fused kernels (`ops_pct_triton.py`; CUDA only: on CPU Triton only has its
                  interpreter, which is a correctness tool, not a fast path)
* `sdpa-softmax`  `torch.nn.functional.scaled_dot_product_attention` at the same real head dim 2d
                  (the softmax baseline; not the same function, only the same shapes)

Time: one worker per length runs every method in interleaved rounds and reports medians over the rounds
after a warm-up, and each method's ratio to SDPA from the same rounds (wall clock: run it on an idle machine).
Peak memory: a fresh worker per (method, length), the growth of peak RSS over the RSS just before the
first call (CPU) or `torch.cuda.max_memory_allocated` above the inputs (CUDA). Both as every benchmark
measures them (benchmarks/measure.py). CPU workers use `--threads` (default 1).

Usage:  python benchmarks/bench_pct.py [--lengths 512 1024 2048 4096 8192] [--cuda-lengths ...]
        python benchmarks/bench_pct.py --quick        # smoke run: tiny sizes, prints only
Writes benchmarks/results/pct_bench_cpu.md, and pct_bench_cuda.md (fp32 and bf16 rows) when CUDA is
available.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from measure import interleaved_times, median_ratio, medians, peak_memory, run_worker  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("naive", "panel", "triton", "sdpa-softmax")


def make_op(method: str, length: int, device: str, dtype_name: str, heads: int, complex_dim: int):
    """A closure running one forward + backward of `method` on inputs made once."""
    import torch
    import torch.nn.functional as F

    from zpx_hf.ops_pct import pct_attention

    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    dim = 2 * complex_dim  # real head dim: [re | im]
    tau = torch.full((heads,), complex_dim**0.5, device=device, requires_grad=True)
    bias = torch.full((heads,), -float(torch.log(torch.tensor(float(length)))), device=device, requires_grad=True)

    def make(*shape: int) -> torch.Tensor:
        return F.normalize(torch.randn(*shape, device=device), dim=-1).to(dtype).requires_grad_()

    q, k, v = make(1, heads, length, dim), make(1, heads, length, dim), make(1, heads, length, dim)

    def step() -> None:
        if method == "sdpa-softmax":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = pct_attention(q, k, v, tau, bias, causal=True, kernel=method)
        out.float().sum().backward()
        q.grad = k.grad = v.grad = tau.grad = bias.grad = None

    return step


def memory_worker(
    threads: int, method: str, length: int, device: str, dtype_name: str, heads: int, complex_dim: int
) -> dict:
    import torch

    if device == "cpu":
        torch.set_num_threads(threads)
    step = make_op(method, length, device, dtype_name, heads, complex_dim)
    return {"peak_mib": peak_memory(step, device) / 2**20}


def time_worker(
    threads: int, methods: list[str], length: int, device: str, dtype_name: str, heads: int, complex_dim: int
) -> dict:
    """Median ms per method over interleaved rounds (first round is warm-up), and ratios to sdpa-softmax."""
    import torch

    if device == "cpu":
        torch.set_num_threads(threads)
    steps = {m: make_op(m, length, device, dtype_name, heads, complex_dim) for m in methods}
    times, errors = interleaved_times(steps, rounds=6 if device == "cpu" else 10, device=device)
    if errors:
        raise RuntimeError("; ".join(f"{method}: {error}" for method, error in errors.items()))
    ms = {m: seconds * 1e3 for m, seconds in medians(times).items()}
    ratio = {m: median_ratio(times, m, "sdpa-softmax") if "sdpa-softmax" in times else float("nan") for m in methods}
    return {m: {"ms": ms[m], "ratio": ratio[m]} for m in methods}


def table(rows: dict, lengths: list[int], methods: list[str], title: str) -> list[str]:
    header = "| L | " + " | ".join(f"{m} ms | {m} / SDPA | {m} peak MiB" for m in methods) + " |"
    lines = [title, "", header, "|---:|" + "---:|---:|---:|" * len(methods)]
    for length in lengths:
        cells = []
        for method in methods:
            timing, memory = rows.get((length, method, "time")), rows.get((length, method, "memory"), {})
            if timing is None:
                cells += ["-", "-", "-"]
            elif "error" in timing:
                cells += [f"failed ({timing['error'][:30]})", "-", "-"]
            else:
                peak = f"{memory['peak_mib']:.0f}" if "peak_mib" in memory else "-"
                cells += [f"{timing['ms']:,.1f}", f"{timing['ratio']:.2f}x", peak]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return lines


def run_device(device: str, lengths: list[int], dtypes: list[str], methods: list[str], args) -> list[str]:
    lines = []
    for dtype in dtypes:
        rows: dict = {}
        for length in lengths:
            active = [m for m in methods if m != "naive" or length <= args.naive_max]
            spec = [active, length, device, dtype, args.heads, args.complex_dim]
            timing = run_worker(__file__, ["time", args.threads, *spec])
            for method in active:
                rows[(length, method, "time")] = timing if "error" in timing else timing[method]
                memory = run_worker(__file__, ["memory", args.threads, method, *spec[1:]])
                rows[(length, method, "memory")] = memory
            print(device, dtype, length, timing, flush=True)
        title = (
            f"PCT attention, forward + backward, B=1, H={args.heads}, complex d={args.complex_dim} "
            f"(real {2 * args.complex_dim}), causal, {dtype}, device={device}"
            + (f", {args.threads} CPU thread(s)" if device == "cpu" else "")
            + f"; `{args.command}`. Time: median over interleaved rounds in one process"
            + ", ratio to SDPA from the same rounds; peak memory: a fresh process per point."
        )
        lines += table(rows, lengths, methods, title) + [""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--cuda-lengths", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--complex-dim", type=int, default=32)
    parser.add_argument("--naive-max", type=int, default=4096, help="skip the L x L naive form beyond this L")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, prints only")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.cuda_lengths, args.heads, args.complex_dim = [64, 128], [256], 2, 8

    if args.worker:
        kind, *spec = json.loads(args.worker)
        print(json.dumps((time_worker if kind == "time" else memory_worker)(*spec)))
        return
    args.command = "python benchmarks/bench_pct.py " + " ".join(sys.argv[1:])

    import torch

    RESULTS.mkdir(parents=True, exist_ok=True)
    cpu_methods = ["naive", "panel", "sdpa-softmax"]
    lines = run_device("cpu", args.lengths, ["float32"], cpu_methods, args)
    lines.append(
        "CPU has no Triton fast path (the interpreter only checks correctness), so the kernel rows are GPU-only."
    )
    print("\n".join(lines))
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "pct_bench_cpu.md").write_text("\n".join(lines) + "\n")
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        lines = [f"GPU: {name}.", ""]
        lines += run_device("cuda", args.cuda_lengths, ["float32", "bfloat16"], list(METHODS), args)
        print("\n".join(lines))
        if not args.quick:
            (RESULTS / "pct_bench_cuda.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
