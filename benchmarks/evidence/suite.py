"""The suite's command line, `python -m benchmarks.evidence` (the package docstring lists the commands): the plan
of `plan` for `--size evidence` / `evidence_smoke` / `full`, run job by job, and its report (`report`); `--report`
re-renders from the saved rows only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import multiprocessing
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import benchmarks.evidence
from benchmarks.evidence import plan
from benchmarks.evidence.models import VARIANTS, width_table
from benchmarks.evidence.nbody import nbody_reference
from benchmarks.evidence.protocol import SizeSpec
from benchmarks.evidence.report import write_evidence
from benchmarks.evidence.rows import RESULTS, append_row, machine, provenance, read_rows
from benchmarks.evidence.runs import run_job
from benchmarks.evidence.sizes import MAX_TIER, SIZES, TASKS

COMMAND = "python -m benchmarks.evidence"


def evidence_widths(spec: SizeSpec, cells: list[plan.Cell], tolerance: float) -> dict[str, dict[str, Any]]:
    widths: dict[str, dict[str, Any]] = {}
    for task in sorted({c.task for c in cells}):
        names = sorted({m for c in cells if c.task == task for m in plan.members(c.name)})
        widths.update(width_table(spec, ["baseline", *names], [task], tolerance))
    return widths


def render_evidence(stem: Path, spec: SizeSpec, cells: list, widths: dict, meta: dict) -> str:
    rows = read_rows(stem.with_suffix(".jsonl"))
    done = plan.index_rows(rows, spec)
    current = {id(r) for r in done.values()}
    superseded = [r for r in rows if id(r) not in current]
    for path in sorted(RESULTS.glob("ablation_medium.jsonl")):  # the medium protocol(s): superseded, kept listed
        superseded += [{**r, "source": path.name} for r in read_rows(path)]
    reference = nbody_reference(spec.budgets["nbody"].params) if any(c.task == "nbody" for c in cells) else None
    full = SIZES["full"]
    gpu_cells = [c for c in plan.evidence_cells(list(full.budgets), None, full.seeds) if c.tier <= MAX_TIER]
    return write_evidence(done, cells, spec, widths, meta, superseded, reference, stem, gpu_plan=(full, gpu_cells))


def run_evidence(args: argparse.Namespace, spec: SizeSpec, stem: Path, meta: dict[str, Any]) -> None:
    """Run the plan of `plan` job by job: up to `--workers` at once, the next runnable job (selection
    done on the finished rows) started as soon as one finishes; every row appended to the jsonl at once."""
    tasks = args.tasks or list(spec.budgets)
    cells = plan.evidence_cells(tasks, args.variants, spec.seeds)
    cells = [c for c in cells if c.tier <= args.max_tier]
    if not cells:
        print(f"{COMMAND}: error: no evidence cells for these --tasks / --variants / --max-tier", file=sys.stderr)
        raise SystemExit(2)
    widths = evidence_widths(spec, cells, args.tolerance)
    path = stem.with_suffix(".jsonl")
    measured = plan.step_seconds(read_rows(RESULTS / "ablation_medium.jsonl"))
    hours = plan.estimate(cells, spec, measured, args.workers)
    cumulative, line = 0.0, []
    for tier, h in hours.items():
        if tier != "total":
            cumulative += h
            line.append(f"{tier} {h:.1f} h (cumulative {cumulative:.1f} h)")
    meta["estimate"] = f"estimated {hours['total']:.1f} h with {args.workers} workers: " + "; ".join(line)
    meta["cells"] = len(cells)
    print(f"[plan] {len(cells)} cells, {len(plan.planned_jobs(cells, spec))} runs; {meta['estimate']}")
    if args.report:
        print(render_evidence(stem, spec, cells, widths, meta))
        return
    commit = provenance()
    if commit["dirty"]:
        print(f"[warning] the working tree differs from commit {commit['commit'][:10]}: rows are flagged dirty=true")

    def job_dict(job: plan.Job) -> dict[str, Any]:
        variant, task, seed, lr = job
        return {
            "variant": variant,
            "task": task,
            "seed": seed,
            "lr": lr,
            "spec": asdict(spec),
            "device": args.device,
            "width": widths[f"{variant}/{task}"],
            "commit": commit,
        }

    def record(row: dict[str, Any]) -> None:
        append_row(path, row)
        status = progress_line(read_rows(path))
        shown = {k: row.get(k) for k in ("variant", "task", "seed", "lr", "status") if k in row}
        shown |= {k: round(v, 4) for k, v in row.items() if isinstance(v, float) and not k.startswith("val_")}
        print(f"[{status}] {shown}", flush=True)
        if row.get("status") != "ok":
            print(f"[warning] {row['variant']}/{row['task']} seed {row['seed']} lr {row['lr']}: {row['status']}")
        try:  # the row is safe in the jsonl; a report error must not stop a five-hour suite
            render_evidence(stem, spec, cells, widths, meta)
        except Exception as error:
            print(
                f"[warning] the report was not rendered ({type(error).__name__}: {error}); the suite continues, "
                "rerun with --report once fixed"
            )

    def progress_line(rows: list[dict[str, Any]]) -> str:
        state = plan.progress(cells, plan.index_rows(rows, spec), spec)
        return f"{state['done']}/{state['planned']} runs, {len(state['complete'])}/{len(cells)} cells complete"

    print(f"[plan] {progress_line(read_rows(path))} already", flush=True)
    if args.workers == 1:
        while todo := plan.runnable(cells, plan.index_rows(read_rows(path), spec), spec):
            record(run_job(job_dict(todo[0])))
    else:
        context = multiprocessing.get_context("spawn" if args.device != "cpu" else None)
        with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
            in_flight: dict[concurrent.futures.Future, plan.Job] = {}
            while True:
                done = plan.index_rows(read_rows(path), spec)
                for job in plan.runnable(cells, done, spec):
                    if len(in_flight) >= args.workers:
                        break
                    if job not in in_flight.values():
                        in_flight[pool.submit(run_job, job_dict(job))] = job
                if not in_flight:
                    break
                finished, _ = concurrent.futures.wait(in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in finished:
                    in_flight.pop(future)
                    record(future.result())
    print(render_evidence(stem, spec, cells, widths, meta))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description=benchmarks.evidence.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), required=True)
    parser.add_argument("--variants", nargs="+", default=None, choices=[*VARIANTS, *plan.TUNED_GROUPS])
    parser.add_argument("--tasks", nargs="+", default=None, choices=list(TASKS), help="default: the size's tasks")
    parser.add_argument("--max-tier", type=int, default=MAX_TIER, help="cells of tiers up to this one (4: also spiral)")
    parser.add_argument("--workers", type=int, default=1, help="parallel worker processes (1 thread each)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--tolerance", type=float, default=0.10, help="parameter-count match tolerance")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--tag", default=None, help="output file stem (default ablation_<size>)")
    parser.add_argument("--report", action="store_true", help="only re-render json/md/png from the jsonl")
    args = parser.parse_args(argv)

    spec = SIZES[args.size]
    missing = [t for t in args.tasks or [] if t not in spec.budgets]
    if missing:
        parser.error(f"--tasks {' '.join(missing)}: not in --size {args.size} (its tasks: {', '.join(spec.budgets)})")

    torch.set_num_threads(1)
    stem = args.output / (args.tag or f"ablation_{args.size}")
    args.output.mkdir(parents=True, exist_ok=True)
    command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])]).replace(" --report", "")
    meta = {
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
    }
    run_evidence(args, spec, stem, meta)


if __name__ == "__main__":
    main()
