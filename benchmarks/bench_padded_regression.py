"""Padded-path regression check: one training step (forward + backward) on the same right-padded batch, this
tree's package against another checkout's (e.g. the commit before a change), per family and Versor mixer.

Two trees cannot be imported into one process (one package name), so each tree gets one long-lived worker
process per model (`--worker`, `PYTHONPATH` = that tree) that builds the model and the batch of
`bench_packing.py` (same seed, same sizes, no packing) and times one step whenever the driver asks. The
driver asks the two workers in turn through `measure.interleaved_times` (order reversed every round), so
load from other processes hits both trees alike; the table gives each tree's median wall time and the
median of the per-round ratios measured tree / baseline, in wall time and in the worker's CPU time
(`time.process_time`: on a machine shared with other jobs it counts only the step's own work).

Usage:  git worktree add ../baseline <rev>
        python benchmarks/bench_padded_regression.py --baseline ../baseline --baseline-name <rev>
        [--tree ../other --name <rev2>]   (the tree measured: this checkout unless given)
Writes benchmarks/results/bench_padded_regression.md and .csv (`--quick`: tiny sizes, prints only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_packing import add_size_arguments, quick_sizes, setting, write_results  # benchmarks/bench_packing.py
from measure import interleaved_times, median_ratio, medians  # benchmarks/measure.py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = ["zpx", "pct", "versor-gpa", "versor-rra", "versor-hybrid", "llama"]
SIZES = ("documents", "min_length", "max_length", "hidden", "layers", "heads", "seed")


def worker(spec: dict) -> None:
    """Build the model and the padded batch, answer every line on stdin with one timed step's seconds."""
    import torch
    from bench_packing import batches, build_model, step  # benchmarks/bench_packing.py: same model and data

    import zpx_hf

    torch.set_num_threads(spec["threads"])
    args = argparse.Namespace(**{name: spec[name] for name in SIZES})
    padded, _, _ = batches(args)
    model = build_model(spec["model"], args)
    print(json.dumps({"package": str(Path(zpx_hf.__file__).resolve().parent)}), flush=True)
    from measure import clock

    for _ in sys.stdin:
        start, cpu = clock(), time.process_time()
        step(model, padded)
        print(json.dumps({"seconds": clock() - start, "cpu": time.process_time() - cpu}), flush=True)


class Worker:
    """One `--worker` process importing the package from `tree`."""

    def __init__(self, tree: Path, spec: dict) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.package = self.read()["package"]
        self.cpu: list[float] = []  # CPU seconds of every step, warm-up included
        if Path(self.package).parent != tree.resolve():
            raise RuntimeError(f"the worker for {tree} imported zpx_hf from {self.package}: check PYTHONPATH")

    def read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.process.wait()}")
        return json.loads(line)

    def step(self) -> float:
        self.process.stdin.write("step\n")
        self.process.stdin.flush()
        reply = self.read()
        self.cpu.append(float(reply["cpu"]))
        return float(reply["seconds"])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="root of the checkout to compare against")
    parser.add_argument("--baseline-name", default="baseline", help="how the table names the baseline (a commit)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="root of the checkout measured (default: this one)")
    parser.add_argument("--name", default="this tree", help="how the table names that tree (a commit)")
    parser.add_argument("--models", nargs="+", default=MODELS)
    add_size_arguments(parser, documents=8, max_length=256)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    for flag, tree in (("--baseline", args.baseline), ("--tree", args.tree)):
        if tree is None or not (tree / "zpx_hf" / "__init__.py").is_file():
            parser.error(f"{flag} must be the root of a zpx-hf checkout (git worktree add DIR REV)")
    quick_sizes(args)

    rows = []
    for model in args.models:
        spec = {"model": model, "threads": args.threads, **{name: getattr(args, name) for name in SIZES}}
        trees = {"new": Worker(args.tree, spec), "old": Worker(args.baseline, spec)}
        try:
            times, errors = interleaved_times({name: w.step for name, w in trees.items()}, rounds=args.rounds)
        finally:
            for w in trees.values():
                w.close()
        if errors:
            raise RuntimeError(f"{model}: {errors}")
        new_ms, old_ms = (medians(times)[name] * 1e3 for name in ("new", "old"))
        cpu = {name: w.cpu[1:] for name, w in trees.items()}  # the rounds after the warm-up
        rows.append(
            {
                "model": model,
                "baseline_ms": round(old_ms, 1),
                "this_ms": round(new_ms, 1),
                "this_over_baseline": round(median_ratio(times, "new", "old"), 3),
                "baseline_cpu_ms": round(statistics.median(cpu["old"]) * 1e3, 1),
                "this_cpu_ms": round(statistics.median(cpu["new"]) * 1e3, 1),
                "this_over_baseline_cpu": round(median_ratio(cpu, "new", "old"), 3),
            }
        )
        print(rows[-1], flush=True)
    if args.quick:
        return

    old, new = args.baseline_name, args.name
    lines = [
        f"Padded training step (forward + backward), no packing: {setting(args, 'bench_padded_regression.py')}"
        f"; the documents as one right-padded batch with an attention mask. {new} against {old}, one worker "
        "process per tree and model, asked in turn (order reversed every round); median of "
        f"{args.rounds} rounds after a warm-up, ratios = median of the per-round ratios, in wall time and in "
        "the step's CPU time (the machine was shared: CPU time counts only the step's own work).",
        "",
        f"| model | {old} ms | {new} ms | {new} / {old} (wall) | {old} CPU ms | {new} CPU ms | {new} / {old} (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['baseline_ms']:.1f} | {row['this_ms']:.1f} | {row['this_over_baseline']:.2f}x | "
            f"{row['baseline_cpu_ms']:.1f} | {row['this_cpu_ms']:.1f} | {row['this_over_baseline_cpu']:.2f}x |"
        )
    write_results("bench_padded_regression", rows, lines)
    for suffix in (".md", ".csv"):  # the checkouts' local paths must not reach the results
        path = HERE / "results" / f"bench_padded_regression{suffix}"
        text = path.read_text().replace(str(args.baseline), "<baseline checkout>")
        path.write_text(text.replace(str(args.tree), "<measured checkout>"))


if __name__ == "__main__":
    main()
