"""Versor: time and peak memory vs sequence length for GPA and RRA (issue #5).

Forward + backward of one op call, B=1, causal:

GPA, H=2 heads, c=2 multivector channels per head (D=64), `geometric_product_attention(kernel=...)`:
* `gpa-naive`      materialises the [B, H, L, L, 11] scalar/bivector products (the reference)
* `gpa-chunked`    kernel "chunk": query panels x causal key blocks, online softmax, recomputing backward: O(L) memory
* `gpa-triton`     the flash-style kernel (CUDA only: on CPU Triton only has its interpreter)
* `sdpa`           torch SDPA softmax attention on the same q, k, v (the baseline of the ratios)
On CPU the GPA times come from one process per L that runs the methods interleaved, round after round
(`--gpa-rounds`, medians), so the ratios to SDPA share the machine's load; peak memory comes from a
fresh process per method and L.

RRA, H=4 rotor heads, c=2 value channels per head (the whole op, default accumulate="compact": rotor
exponentials, scan, sandwich; the state it carries is one rotor, [B, H, 32] float32, whatever L):
* `rra-sequential` kernel "naive": the loop R_t = R_{t-1} dR_t with matrix exponentials (the reference)
* `rra-scan`       kernel "scan": closed-form rotors, log-depth scan, structure-of-arrays complex products
* `rra-triton`     the Triton scan kernel (CUDA only)
* `rra-sdpa`       torch SDPA, causal, on q, k, v of the same B, H and width (D = 32 c = 64): the baseline
On CPU the RRA times come from one process per L running the methods interleaved (`--rra-rounds`,
medians), like GPA's.

Each point's peak memory comes from a fresh subprocess, measured before any other call of the op: the growth
of peak RSS over the RSS just before its first call (CPU) or `torch.cuda.max_memory_allocated` above the
inputs (CUDA); times are wall-clock medians (benchmarks/measure.py). `us/token` = time / (B * L): flat in L
means linear scaling.

Usage:  python benchmarks/bench_versor.py [--gpa-lengths 512 1024 2048 4096] [--rra-lengths 1024 4096 16384 65536]
        python benchmarks/bench_versor.py --quick      # smoke run: tiny sizes, prints only
Writes benchmarks/results/versor_bench_cpu.md, and versor_bench_cuda.md (GPU rows, fp32 and bf16 for GPA)
when CUDA is available.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from measure import interleaved_times, median_ratio, medians, peak_memory, run_worker  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"
GPA_METHODS = ("gpa-naive", "gpa-chunked", "gpa-triton", "sdpa")
GPA_CPU_METHODS = ("sdpa", "gpa-chunked", "gpa-naive")
GPA_HEADS, GPA_CHANNELS = 2, 2
RRA_METHODS = ("rra-sequential", "rra-scan", "rra-triton", "rra-sdpa")
RRA_CPU_METHODS = ("rra-sdpa", "rra-scan", "rra-sequential")
RRA_HEADS, RRA_CHANNELS = 4, 2
# each method's `kernel=` in the ops' one vocabulary (ops_common.KERNEL_NAMES); the labels are the results'
KERNELS = {"gpa-naive": "naive", "gpa-chunked": "chunk", "gpa-triton": "triton"}
KERNELS.update({"rra-sequential": "naive", "rra-scan": "scan", "rra-triton": "triton"})


def worker(method: str, length: int, device: str, dtype_name: str) -> dict:
    import torch

    if device == "cpu":
        torch.set_num_threads(1)  # small ops; reproducible on a shared machine
    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    op, leaves = (rra_op if method.startswith("rra") else gpa_op)(method, length, device, dtype)

    def step() -> None:
        op().float().sum().backward()
        for leaf in leaves:
            leaf.grad = None

    peak = peak_memory(step, device)  # before any other call: a warm-up would hide the CPU peak (measure.py)
    times, errors = interleaved_times({method: step}, rounds=5 if device == "cuda" else 2, warmup=0, device=device)
    if errors:
        raise RuntimeError(errors[method])
    seconds = medians(times)[method]
    return {"ms": seconds * 1e3, "us_per_token": seconds * 1e6 / length, "peak_mib": peak / 2**20}


def gpa_op(method: str, length: int, device: str, dtype):
    """(op, leaves): one GPA method (or the SDPA baseline) on B=1, H=GPA_HEADS, D=32*GPA_CHANNELS inputs."""
    import torch
    import torch.nn.functional as F

    from zpx_hf.ops_gpa import geometric_product_attention

    generator = torch.Generator(device=device).manual_seed(0)
    shape = (1, GPA_HEADS, length, 32 * GPA_CHANNELS)
    q, k, v = (torch.randn(shape, device=device, generator=generator).to(dtype).requires_grad_() for _ in range(3))
    gamma = torch.full((GPA_HEADS,), 0.1, device=device, requires_grad=True)
    if method == "sdpa":
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), (q, k, v)
    kernel = KERNELS[method]
    return (lambda: geometric_product_attention(q, k, v, gamma, causal=True, kernel=kernel)), (q, k, v, gamma)


def rra_op(method: str, length: int, device: str, dtype):
    """(op, leaves): the RRA op with the method's kernel, or SDPA on the same B=1, H and width."""
    import torch
    import torch.nn.functional as F

    from zpx_hf.ops_rra import recursive_rotor_accumulator

    generator = torch.Generator(device=device).manual_seed(0)
    if method == "rra-sdpa":
        shape = (1, RRA_HEADS, length, 32 * RRA_CHANNELS)
        q, k, v = (torch.randn(shape, device=device, generator=generator).to(dtype).requires_grad_() for _ in range(3))
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), (q, k, v)
    # the model's bivectors: s tanh(W x), s = 1
    bivectors = torch.tanh(torch.randn(1, length, RRA_HEADS, 10, device=device, generator=generator))
    values = torch.randn(1, length, RRA_HEADS, RRA_CHANNELS, 32, device=device, generator=generator).to(dtype)
    leaves = (bivectors.requires_grad_(), values.requires_grad_())
    kernel = KERNELS[method]
    return (lambda: recursive_rotor_accumulator(*leaves, kernel=kernel)[0]), leaves


def gpa_time_worker(length: int, methods: list[str], rounds: int) -> dict:
    """CPU, 1 thread: the methods' forward + backward interleaved, `rounds` times after a warm-up round; per
    method the median ms and the median of its per-round time ratio to `methods[0]` (the SDPA baseline)."""
    import torch

    torch.set_num_threads(1)
    steps = {}
    for method in methods:
        op, leaves = (rra_op if method.startswith("rra") else gpa_op)(method, length, "cpu", torch.float32)

        def step(op=op, leaves=leaves) -> None:
            op().sum().backward()
            for leaf in leaves:
                leaf.grad = None

        steps[method] = step
    times, errors = interleaved_times(steps, rounds)
    if errors:
        raise RuntimeError("; ".join(f"{method}: {error}" for method, error in errors.items()))
    ms = medians(times)
    return {method: {"ms": ms[method] * 1e3, "ratio": median_ratio(times, method, methods[0])} for method in methods}


def gpa_cpu_sweep(
    lengths: list[int], rounds: int, naive_max: int, methods: tuple = GPA_CPU_METHODS, naive: str = "gpa-naive"
) -> dict:
    """{(method, L): {"ms", "peak_mib"}}: interleaved medians for time, a fresh process per point for memory
    (`naive` only up to L = `naive_max`). RRA uses it too."""
    rows = {}
    all_methods = methods
    for length in lengths:
        methods = [m for m in all_methods if m != naive or length <= naive_max]
        times = run_worker(__file__, ["gpa-time", length, methods, rounds])
        for method in methods:
            memory = run_worker(__file__, [method, length, "cpu", "float32"])
            if "error" in times or "error" in memory:
                rows[(method, length)] = {"error": times.get("error") or memory["error"]}
            else:
                rows[(method, length)] = {**times[method], "peak_mib": memory["peak_mib"]}
            print(method, length, rows[(method, length)], flush=True)
    return rows


def gpa_ratio_table(
    rows: dict, lengths: list[int], rounds: int, methods: tuple = GPA_CPU_METHODS, title: str | None = None
) -> list[str]:
    """Per L and method: median ms, x SDPA time (median of the per-round ratios), peak MiB, x SDPA memory (the
    baseline: `methods[0]`)."""
    lines = [
        title
        or f"GPA, forward + backward, B=1, H={GPA_HEADS}, {GPA_CHANNELS} multivector channels per head "
        f"(D={32 * GPA_CHANNELS}), causal, float32, 1 thread; time = median of {rounds} interleaved rounds, "
        "ratios to SDPA from the same process:",
        "",
        "| L | method | ms | x SDPA time | peak MiB | x SDPA memory |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for length in lengths:
        base = rows.get((methods[0], length), {})
        for method in methods:
            row = rows.get((method, length))
            if row is None:
                continue
            if "error" in row or "error" in base:
                lines.append(f"| {length} | {method} | failed ({(row.get('error') or base['error'])[:40]}) | | | |")
                continue
            memory_ratio = row["peak_mib"] / max(base["peak_mib"], 1.0)
            lines.append(
                f"| {length} | {method} | {row['ms']:,.1f} | {row['ratio']:.2f} | "
                f"{row['peak_mib']:,.0f} | {memory_ratio:.1f} |"
            )
    return lines + [""]


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
    parser.add_argument("--gpa-lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--gpa-rounds", type=int, default=5, help="interleaved timing rounds per L (CPU)")
    parser.add_argument("--gpa-naive-max", type=int, default=2048, help="longest L for the O(L^2) reference")
    parser.add_argument("--rra-lengths", type=int, nargs="+", default=[256, 1024, 2048, 4096])
    parser.add_argument("--rra-rounds", type=int, default=5, help="interleaved timing rounds per L (CPU)")
    parser.add_argument("--sequential-max", type=int, default=1024, help="longest L for the Python loop")
    parser.add_argument("--cuda-gpa-lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--cuda-rra-lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, 2 rounds, prints only")
    args = parser.parse_args()
    if args.quick:
        args.gpa_lengths, args.rra_lengths, args.gpa_rounds, args.rra_rounds = [64, 128], [64, 128], 2, 2
        args.cuda_gpa_lengths, args.cuda_rra_lengths = [256], [256]
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(gpa_time_worker(*spec[1:]) if spec[0] == "gpa-time" else worker(*spec)))
        return

    import torch

    cpu_gpa = gpa_cpu_sweep(args.gpa_lengths, args.gpa_rounds, args.gpa_naive_max)
    cpu_rra = gpa_cpu_sweep(args.rra_lengths, args.rra_rounds, args.sequential_max, RRA_CPU_METHODS, "rra-sequential")
    lines = [
        f"# Versor benchmark (CPU, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread per run)",
        "",
    ]
    lines += gpa_ratio_table(cpu_gpa, args.gpa_lengths, args.gpa_rounds)
    rra_title = (
        f"RRA, forward + backward, B=1, H={RRA_HEADS}, {RRA_CHANNELS} value channels per head, accumulate='compact', "
        f"float32, 1 thread; the state carried between calls is [B, H, 32] float32 whatever L; time = median of "
        f"{args.rra_rounds} interleaved rounds, ratios to SDPA (causal, D={32 * RRA_CHANNELS}) from the same process:"
    )
    lines += gpa_ratio_table(cpu_rra, args.rra_lengths, args.rra_rounds, RRA_CPU_METHODS, rra_title)
    lines.append(
        "CPU has no Triton fast path (the interpreter only checks correctness), so the kernel rows are GPU-only; "
        "`python benchmarks/bench_versor.py` on a CUDA machine writes them to versor_bench_cuda.md."
    )
    print("\n".join(lines))
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "versor_bench_cpu.md").write_text("\n".join(lines) + "\n")

    if torch.cuda.is_available():
        lines = [f"# Versor benchmark ({torch.cuda.get_device_name()}, torch {torch.__version__})", ""]
        for dtype in ("float32", "bfloat16"):
            rows = sweep(GPA_METHODS, args.cuda_gpa_lengths, "cuda", dtype, {"gpa-naive": 4096})
            lines += table(rows, args.cuda_gpa_lengths, list(GPA_METHODS), f"GPA, forward + backward, {dtype}:")
        rows = sweep(RRA_METHODS, args.cuda_rra_lengths, "cuda", "float32", {"rra-sequential": 4096})
        lines += table(rows, args.cuda_rra_lengths, list(RRA_METHODS), "RRA, forward + backward, float32:")
        print("\n".join(lines))
        if not args.quick:
            (RESULTS / "versor_bench_cuda.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
