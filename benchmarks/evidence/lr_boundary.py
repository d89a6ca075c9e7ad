"""lr boundaries with more seeds (issue 37, item 5): is a family's narrower working lr range a property of the family
or of seed 0?

    python -m benchmarks.evidence.lr_boundary             # the runs below (resumable), then results/lr_boundary.md
    python -m benchmarks.evidence.lr_boundary --render    # the md from the rows only

The suite's lr ranges (results/ablation_evidence_lr_ranges.md) come from the selection runs: one seed per lr, and
recall outcomes are bimodal. Where the softmax baseline learned and a family did not, `BOUNDARY` trains both again
at that lr with seeds 1, 2, 3, through the suite's own job (`runs.run_job`: the same budget, data, width and
validation split as `--size evidence`), and counts per seed what `audit.learns` says of the validation metric: at
the bar (learned), above the copy floor only, or at the floor. Seed 0's verdict is read from the suite's rows.
Rows go to results/lr_boundary.jsonl (commit, dirty flag, config hash, protocol); a (variant, task, seed, lr)
already there with the suite's protocol and budget is not run again.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
from dataclasses import asdict
from typing import Any

import torch

from benchmarks.evidence import audit, plan
from benchmarks.evidence.models import width_table
from benchmarks.evidence.protocol import SELECT_SEED, SELECTION
from benchmarks.evidence.rows import RESULTS, append_row, provenance, read_rows
from benchmarks.evidence.runs import run_job
from benchmarks.evidence.sizes import SIZES

SIZE = "evidence"
ROWS = RESULTS / "lr_boundary.jsonl"
SEEDS = (1, 2, 3)
# (task, lr, variants): the lrs at which seed 0 of the softmax baseline learned the task and these variants did not
# (ablation_evidence_lr_ranges.md). MQAR at 3e-3: every ZPX variant and softmax + SRPE stayed at the floor;
# the needle at 1e-3: ZPX full and PCT fell below the bar.
BOUNDARY = (
    ("mqar", 3e-3, ("baseline", "softmax_srpe", "zpx_angle", "zpx_full")),
    ("passkey", 1e-3, ("baseline", "zpx_full", "pct")),
)


def jobs(seeds: tuple[int, ...]) -> list[tuple[str, str, int, float]]:
    return [(variant, task, seed, lr) for task, lr, variants in BOUNDARY for variant in variants for seed in seeds]


def done_rows(path: Any = ROWS) -> dict[tuple[str, str, int, float], dict[str, Any]]:
    return plan.index_rows(read_rows(path), SIZES[SIZE])


def study(seeds: tuple[int, ...], workers: int, command: str) -> None:
    spec = SIZES[SIZE]
    commit = provenance()
    if commit["dirty"]:
        print("warning: the worktree differs from its commit; rows are marked dirty", file=sys.stderr)
    widths = width_table(spec, sorted({v for _, _, vs in BOUNDARY for v in vs}), [t for t, _, _ in BOUNDARY], 0.10)
    todo = [job for job in jobs(seeds) if job not in done_rows()]
    print(f"[lr_boundary] {len(todo)} runs to do", flush=True)
    payloads = [
        {
            "variant": variant,
            "task": task,
            "seed": seed,
            "lr": lr,
            "spec": asdict(spec),
            "device": "cpu",
            "width": widths[f"{variant}/{task}"],
            "commit": commit,
        }
        for variant, task, seed, lr in todo
    ]
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:  # each row saved as its run ends
        for future in concurrent.futures.as_completed([pool.submit(run_job, p) for p in payloads]):
            row = future.result()
            append_row(ROWS, {**row, "command": command})
            key, _ = SELECTION[row["task"]]
            verdict = audit.learns(row, spec, None)
            print(f"[{row['variant']} {row['task']} seed {row['seed']} lr {row['lr']:g}] {key} "
                  f"{row.get(key, float('nan')):.4f}: {verdict}", flush=True)  # fmt: skip


def cell(row: dict[str, Any] | None, spec: Any) -> str:
    """A run's validation metric and mark (✓ learned, ~ above the floor only, ✗ at the floor)."""
    if row is None:
        return "-"
    key, _ = SELECTION[row["task"]]
    return f"{row.get(key, float('nan')):.3f} {audit.MARK.get(audit.learns(row, spec, None), '✗')}"


def render() -> str:
    spec = SIZES[SIZE]
    rows = done_rows()
    suite = plan.index_rows(read_rows(RESULTS / f"ablation_{SIZE}.jsonl"), spec)
    commands = sorted({r["command"] for r in rows.values() if "command" in r})
    lines = [
        "# lr boundaries with more seeds: narrower ranges than softmax's, seed by seed",
        "",
        f"Commands: {'; '.join(f'`{c}`' for c in commands) or 'none yet'}, under `nice -n 19 env OMP_NUM_THREADS=1` "
        "(rows: `lr_boundary.jsonl`; code: `benchmarks/evidence/lr_boundary.py`). The suite's `--size evidence` "
        f"jobs (protocol `{spec.protocol}`) at the lr where seed 0 of the softmax baseline learned the task and "
        "these variants did not; seed 0 is the suite's selection run. Verdict per seed on the validation metric: "
        + "; ".join(f"{task}: {audit.learn_criterion(task, spec, None)}" for task, _, _ in BOUNDARY)
        + ". ✓ learned, ~ above the floor only, ✗ at the floor.",
        "",
        "| task | lr | variant | seed 0 (selection) | more seeds | learned | above the floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, lr, variants in BOUNDARY:
        for variant in variants:
            runs = [row for (v, t, seed, x), row in sorted(rows.items()) if (v, t, x) == (variant, task, lr)]
            verdicts = [audit.learns(r, spec, None) for r in runs]
            seeds = "; ".join(f"{r['seed']}: {cell(r, spec)}" for r in runs) or "not run"
            lines.append(
                f"| {task} | {lr:g} | {variant} | {cell(suite.get((variant, task, SELECT_SEED, lr)), spec)} "
                f"| {seeds} | {sum(v == 'learned' for v in verdicts)} / {len(runs)} "
                f"| {sum(v in audit.MARK for v in verdicts)} / {len(runs)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.evidence.lr_boundary",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), help="seeds to run (never 0)")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes, 1 thread each")
    parser.add_argument("--render", action="store_true", help="only write results/lr_boundary.md from the rows")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if SELECT_SEED in args.seeds:
        parser.error(f"--seeds: seed {SELECT_SEED} is the suite's selection run, read from its rows; use seeds >= 1.")
    torch.set_num_threads(1)
    if not args.render:
        study(tuple(args.seeds), args.workers, " ".join(["python -m benchmarks.evidence.lr_boundary", *(argv or [])]))
    text = render()
    (RESULTS / "lr_boundary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
