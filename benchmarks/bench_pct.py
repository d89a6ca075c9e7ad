"""PCT sigmoid attention: throughput and peak memory vs sequence length (issue #4).

Forward + backward of one attention call, B=1, H heads, complex head dim d (real head dim 2d), causal:

* `materialised`  the formula with a full [B, H, L, L] gate tensor (plain autograd) - the seed's form
* `reference`     `pct_attention_reference`: (query block x key block) tiles, recomputing backward
* `triton`        `pct_attention_triton`, the fused kernel (CUDA only: on CPU Triton only has its
                  interpreter, which is a correctness tool, not a fast path)
* `sdpa-softmax`  `torch.nn.functional.scaled_dot_product_attention` at the same real head dim 2d
                  (the softmax baseline; not the same function, only the same shapes)

Each point runs in a fresh subprocess. Peak memory is the growth of peak RSS over the RSS just before
the first call (CPU) or `torch.cuda.max_memory_allocated` above the inputs (CUDA). Tokens/s = B * L / time of
one forward + backward (best of the repeats). CPU workers use `--threads` (default 1): tile loops
of small ops suffer badly from OpenMP oversubscription on a shared machine.

Usage:  python benchmarks/bench_pct.py [--lengths 512 1024 2048 4096 8192] [--cuda-lengths ...]
Writes benchmarks/results/pct_bench_cpu.md, and pct_bench_cuda.md (fp32 and bf16 rows) when CUDA is
available.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from measure import peak_rss_growth, rss_bytes, run_worker  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("materialised", "reference", "triton", "sdpa-softmax")


def worker(method: str, length: int, device: str, dtype_name: str, heads: int, complex_dim: int, threads: int) -> dict:
    import torch
    import torch.nn.functional as F

    from zpx_hf.ops_pct import pct_attention_reference, pct_attention_triton

    torch.manual_seed(0)
    if device == "cpu":
        torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    dim = 2 * complex_dim  # real head dim: [re | im]
    tau = torch.full((heads,), complex_dim**0.5, device=device, requires_grad=True)
    bias = torch.full((heads,), -float(torch.log(torch.tensor(float(length)))), device=device, requires_grad=True)

    def make(*shape: int) -> torch.Tensor:
        return F.normalize(torch.randn(*shape, device=device), dim=-1).to(dtype).requires_grad_()

    q, k, v = make(1, heads, length, dim), make(1, heads, length, dim), make(1, heads, length, dim)

    def materialised() -> torch.Tensor:
        scores = tau[:, None, None] * (q.float() @ k.float().transpose(-1, -2)) + bias[:, None, None]
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        gates = torch.sigmoid(scores) * causal
        return (gates @ v.float()).to(dtype)

    ops = {
        "materialised": materialised,
        "reference": lambda: pct_attention_reference(q, k, v, tau, bias, causal=True),
        "triton": lambda: pct_attention_triton(q, k, v, tau, bias, causal=True),
        "sdpa-softmax": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    op = ops[method]

    def step() -> None:
        op().float().sum().backward()

    # CPU: peak RSS over the RSS before the first call (the warm-up's peak counts: memory freed after it
    # would hide the op's peak from a later baseline). CUDA: peak allocation after the warm-up.
    base = rss_bytes() if device == "cpu" else 0
    step()  # warm-up (allocator, autotuning, kernel compilation)
    q.grad = k.grad = v.grad = tau.grad = bias.grad = None
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(5 if device == "cuda" else 3):
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = peak_rss_growth(base)
    seconds = min(times)  # best of the repeats: robust to other load on a shared machine
    return {"ms": seconds * 1e3, "tokens_per_s": length / seconds, "peak_mib": max(peak, 0) / 2**20}


def table(rows: list[dict], lengths: list[int], methods: list[str], title: str) -> list[str]:
    by = {(r["L"], r["method"]): r for r in rows}
    header = "| L | " + " | ".join(f"{m} tok/s | {m} peak MiB" for m in methods) + " |"
    lines = [title, "", header, "|---:|" + "---:|---:|" * len(methods)]
    for length in lengths:
        cells = []
        for method in methods:
            row = by.get((length, method))
            if row is None:
                cells += ["-", "-"]
            elif "error" in row:
                cells += [f"failed ({row['error'][:30]})", "-"]
            else:
                cells += [f"{row['tokens_per_s']:,.0f}", f"{row['peak_mib']:.0f}"]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return lines


def run_device(device: str, lengths: list[int], dtypes: list[str], methods: list[str], args) -> list[str]:
    lines = []
    for dtype in dtypes:
        rows = []
        for length in lengths:
            for method in methods:
                if method == "materialised" and length > args.materialised_max:
                    continue
                spec = [method, length, device, dtype, args.heads, args.complex_dim, args.threads]
                rows.append({"L": length, "method": method, **run_worker(__file__, spec)})
                print(device, dtype, rows[-1], flush=True)
        title = (
            f"PCT attention, forward + backward, B=1, H={args.heads}, complex d={args.complex_dim} "
            f"(real {2 * args.complex_dim}), causal, {dtype}, device={device}"
            + (f", {args.threads} CPU thread(s)" if device == "cpu" else "")
            + "; tokens/s from the best of 3-5 repeats:"
        )
        lines += table(rows, lengths, methods, title) + [""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--cuda-lengths", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--complex-dim", type=int, default=32)
    parser.add_argument("--materialised-max", type=int, default=8192, help="skip the L x L form beyond this L")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))))
        return

    import torch

    RESULTS.mkdir(parents=True, exist_ok=True)
    cpu_methods = ["materialised", "reference", "sdpa-softmax"]
    lines = run_device("cpu", args.lengths, ["float32"], cpu_methods, args)
    lines.append(
        "CPU has no Triton fast path (the interpreter only checks correctness), so the kernel rows are GPU-only."
    )
    (RESULTS / "pct_bench_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        lines = [f"GPU: {name}.", ""]
        lines += run_device("cuda", args.cuda_lengths, ["float32", "bfloat16"], list(METHODS), args)
        (RESULTS / "pct_bench_cuda.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
