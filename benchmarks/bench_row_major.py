"""Decoding-step linears on the CPU: `F.linear` with the [N, K] weight vs a GEMM on a row-major copy of W^T.

    python benchmarks/bench_row_major.py              # writes benchmarks/results/bench_row_major.md
    python benchmarks/bench_row_major.py --quick      # smoke run: fewer calls and rounds, prints only

The number behind `modeling_blocks.row_major_transpose` (and PCT's stacked complex weights, which use it):
for the 1 or 2 rows of a decoding step a linear layer's cost is reading its weight, and a CPU GEMM reads a
row-major [K, N] W^T faster than the [N, K] weight `F.linear` passes it. Shapes are bench_step.py's models
(hidden 256, intermediate 688, vocabulary 260): q/k/v fused, SwiGLU gate + up fused, down, the LM head, and
PCT's stacked [A; B]^T (real width 362, complex 181 -> 184). float32, 1 torch thread; one worker process;
both forms take turns in every round (benchmarks/measure.py), each timed over `calls` calls; speed-up =
`F.linear` time / row-major time, median over the rounds of the per-round ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from measure import interleaved_times, median_ratio, medians, run_worker  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"
# (name, K = input width, N = output width)
SHAPES = [
    ("q/k/v fused, hidden 256", 256, 768),
    ("SwiGLU gate + up, 256 -> 2 x 688", 256, 1376),
    ("SwiGLU down, 688 -> 256", 688, 256),
    ("LM head, 256 -> 260", 256, 260),
    ("PCT stacked [A; B]^T, q/k/v, 184 -> 2 x 552", 184, 1104),
]
FULL = {"rows": [1, 2], "calls": 200, "rounds": 15}
QUICK = {"rows": [1, 2], "calls": 20, "rounds": 3}


def worker(size: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from zpx_hf.modeling_blocks import row_major_transpose

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    out = {}
    for name, k, n in SHAPES:
        weight = torch.randn(n, k, generator=generator)
        weight_t = row_major_transpose([weight])  # the row-major W^T the models keep (one weight here)
        for rows in size["rows"]:
            x = torch.randn(rows, k, generator=generator)

            def linear(x=x, weight=weight) -> None:
                for _ in range(size["calls"]):
                    F.linear(x, weight)

            def row_major(x=x, weight_t=weight_t) -> None:
                for _ in range(size["calls"]):
                    torch.mm(x, weight_t)

            times, errors = interleaved_times({"linear": linear, "row_major": row_major}, size["rounds"])
            if errors:
                raise RuntimeError(json.dumps(errors))
            seconds = medians(times)
            out[f"{name}|{rows}"] = {
                "linear_us": seconds["linear"] / size["calls"] * 1e6,
                "row_major_us": seconds["row_major"] / size["calls"] * 1e6,
                "speedup": median_ratio(times, "linear", "row_major"),
            }
    return out


def report(results: dict, size: dict, command: str) -> list[str]:
    import torch

    lines = [
        f"Decoding-step linears, float32, 1 thread, CPU ({os.cpu_count()} cores, torch {torch.__version__}; "
        f"`{command}`): median over {size['rounds']} interleaved rounds of {size['calls']} calls; "
        "speed-up = `F.linear` on the [N, K] weight / GEMM on the row-major W^T, per round.",
        "",
        "| linear | K -> N | rows | F.linear us | row-major W^T us | speed-up |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, k, n in SHAPES:
        for rows in size["rows"]:
            r = results[f"{name}|{rows}"]
            lines.append(
                f"| {name} | {k} -> {n} | {rows} | {r['linear_us']:.1f} | {r['row_major_us']:.1f} | "
                f"{r['speedup']:.2f}x |"
            )
    speedups = sorted(r["speedup"] for r in results.values())
    lines += ["", f"Range over the shapes: {speedups[0]:.2f}x to {speedups[-1]:.2f}x."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer calls and rounds, prints only")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*json.loads(args.worker))))
        return
    size = QUICK if args.quick else FULL
    results = run_worker(__file__, [size], timeout=3600)
    if "error" in results:
        raise SystemExit(f"bench_row_major: the worker failed: {results['error']}")
    lines = report(results, size, ("python benchmarks/bench_row_major.py " + " ".join(sys.argv[1:])).strip())
    print("\n".join(lines))
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "bench_row_major.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
