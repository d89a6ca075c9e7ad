"""Ablation suite: attention variants on recall, geometry, text and N-body tasks at matched parameters and budget.

    python benchmarks/ablation.py --size small             # CPU smoke suite, 2 seeds
    python benchmarks/ablation.py --size medium            # calibrated CPU suite, 3 seeds; resumable
    python benchmarks/ablation.py --size medium --report   # re-render tables/plots from the saved rows only
    python benchmarks/ablation.py --size full --device cuda

Variants (`ablation_models.VARIANTS`, the package's families through the Auto classes): the baseline
(softmax + RoPE: ZPX with both lambdas 0 and rotary RoPE, Llama-style), softmax + SRPE, the ZPX kernels
(angle, sphere, centre loss, SRPE), PCT, and Versor with each mixer; `versor_<mixer>@time` is the same Versor
model trained for the baseline's median wall-clock seconds on that task instead of the step budget.

Tasks (`ablation_runs`): mqar, passkey (keyed needle among distractors, evaluated at multiples of the trained
length), selective_copy, spiral (4 classes), text (pydoc bytes, held-out perplexity), nbody (5 bodies,
G = 1, dt = 0.01, velocity Verlet, walls at +-2; rollout position MSE and energy drift).

Every finished (variant, task, seed) run is appended to results/ablation_<size>.jsonl at once; a rerun skips
the runs already there with the same task budget, so an interrupted suite resumes where it stopped. Each run
uses one thread (`--workers` runs in parallel). Tables, findings and plots (ablation_report.py) are rewritten
from the jsonl after every run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ablation_models import VARIANTS, base_variant, family_of, match_width
from ablation_nbody import NBODY_PROTOCOL
from ablation_report import TIME_SUFFIX, write_outputs
from ablation_runs import SizeSpec, TaskBudget, io_shape, nbody_reference, run_job

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = ("mqar", "passkey", "selective_copy", "spiral", "text", "nbody")


def _budgets(steps: dict[str, int], batch: int, lr: float, params: dict[str, dict[str, Any]], **extra: Any) -> dict:
    return {task: TaskBudget(steps=steps[task], batch=batch, lr=lr, params=params[task], **extra) for task in steps}


SIZES = {
    "small": SizeSpec(
        hidden=64,
        layers=2,
        heads=2,
        budgets=_budgets(
            {"mqar": 150, "passkey": 60, "selective_copy": 120, "spiral": 120, "text": 100, "nbody": 120},
            batch=8,
            lr=3e-3,
            warmup=10,
            params={
                "mqar": {"num_pairs": 4},
                "passkey": {"length": 112},
                "selective_copy": {"num_tokens": 4, "num_positions": 12},
                "spiral": {"num_points": 24},
                "text": {"length": 48, "train_blocks": 2000, "eval_blocks": 48},
                "nbody": {
                    **NBODY_PROTOCOL,
                    "train_length": 60,
                    "train_trajectories": 256,
                    "eval_trajectories": 16,
                    "val_trajectories": 16,
                    "zero_shot_trajectories": 16,
                },
            },
        ),
        eval_examples=48,
        passkey_multiples=(1, 2, 4),
        passkey_eval_examples=16,
        seeds=2,
        versor_max_hidden=64,
    ),
    # Budgets from benchmarks/results/calibration_medium.md: the baseline's answer accuracy passes 0.9 within
    # these steps (MQAR, needle, selective copying) or is well above chance (spiral); a shared 2-core CPU.
    "medium": SizeSpec(
        hidden=128,
        layers=2,
        heads=4,
        budgets={
            "mqar": TaskBudget(
                steps=300, batch=64, lr=1e-3, params={"num_pairs": 4, "num_queries": 8, "query_replacement": True}
            ),
            "passkey": TaskBudget(
                steps=1600,
                batch=32,
                lr=1e-3,
                params={"length": 80, "num_needles": 2, "num_distractors": 2, "num_digits": 2, "compact": True},
            ),
            "selective_copy": TaskBudget(steps=300, batch=64, lr=1e-3, params={"num_tokens": 4, "num_positions": 12}),
            "spiral": TaskBudget(steps=400, batch=64, lr=1e-3, params={"num_points": 24}),
            "text": TaskBudget(
                steps=200, batch=16, lr=1e-3, params={"length": 64, "train_blocks": 4000, "eval_blocks": 64}
            ),
            "nbody": TaskBudget(steps=300, batch=16, lr=1e-3, params=NBODY_PROTOCOL),
        },
        eval_examples=256,
        passkey_multiples=(1, 2, 4, 8),
        passkey_eval_examples=64,
        seeds=3,
        # Versor's per-channel rotor algebra costs several times a softmax layer per step on CPU: widths up to
        # the baseline's (fewer parameters, flagged), plus the wall-clock-matched row
        versor_max_hidden=128,
    ),
    "full": SizeSpec(
        hidden=128,
        layers=4,
        heads=2,
        budgets=_budgets(
            {"mqar": 2000, "passkey": 1500, "selective_copy": 2000, "spiral": 1500, "text": 2000, "nbody": 2000},
            batch=32,
            lr=1e-3,
            params={
                "mqar": {"num_pairs": 12, "num_queries": 24, "query_replacement": True},
                "passkey": {"length": 256, "num_needles": 4, "num_distractors": 4},
                "selective_copy": {"num_tokens": 8, "num_positions": 48},
                "spiral": {"num_points": 48},
                "text": {"length": 256, "train_blocks": 20000, "eval_blocks": 256},
                "nbody": {**NBODY_PROTOCOL, "train_trajectories": 2048, "eval_trajectories": 512},
            },
        ),
        eval_examples=256,
        passkey_multiples=(1, 2, 4, 8),
        passkey_eval_examples=128,
        seeds=3,
    ),
}
DEFAULT_VARIANTS = {
    "small": list(v for v in VARIANTS if v != "zpx_full"),
    "medium": [
        "baseline",
        "softmax_srpe",
        "zpx_full",
        "pct",
        # Versor's hybrid mixer (GPA + RRA) on every task, as parameter- and wall-clock-matched rows; GPA and RRA
        # alone ran one MQAR seed each (within noise of the hybrid) and are left out of the CPU budget
        "versor_hybrid",
        f"versor_hybrid{TIME_SUFFIX}",
    ],
    "full": list(VARIANTS),
}
ORDER = {"zpx": 0, "pct": 1, "versor": 2}  # cheap families first: PCT and Versor are the slow ones on CPU
# (variant, task) runs that, with the baseline's, decide the seed claims checked in ablation_report.claims
CLAIM_RUNS = {
    ("zpx_full", "mqar"),
    ("softmax_srpe", "mqar"),
    ("versor_hybrid", "nbody"),
    (f"versor_hybrid{TIME_SUFFIX}", "nbody"),
    ("pct", "passkey"),
    ("zpx_full", "passkey"),
    ("softmax_srpe", "passkey"),
}


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} CPU cores, torch {torch.__version__}, Python {platform.python_version()}"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The jsonl rows; a line cut by an interruption (the last one) is ignored."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def current_rows(rows: list[dict[str, Any]], spec: SizeSpec) -> list[dict[str, Any]]:
    """Rows of this spec's budgets (a changed budget reruns its task), last row per (variant, task, seed)."""
    fingerprints = {task: budget.fingerprint() for task, budget in spec.budgets.items()}
    latest = {}
    for row in rows:
        if row.get("budget") == fingerprints.get(row["task"]):
            latest[(row["variant"], row["task"], row["seed"])] = row
    return list(latest.values())


def plan(spec: SizeSpec, variants: list[str], tasks: list[str], seeds: int) -> list[tuple[str, str, int]]:
    """Job order: the baseline first (every seed: it is the calibration check), then the runs that decide a seed
    claim (CLAIM_RUNS), then the rest; within those, families by cost (ZPX family, PCT, Versor last), seed, task.
    The baseline runs before any wall-clock-matched row that needs its times."""
    keyed = []
    for variant in variants:
        for seed in range(seeds):
            for task in tasks:
                key = (
                    variant != "baseline",
                    (variant, task) not in CLAIM_RUNS,
                    ORDER[family_of(variant)],
                    seed,
                    TASKS.index(task),
                )
                keyed.append((key, (variant, task, seed)))
    return [job for _, job in sorted(keyed)]


def width_table(spec: SizeSpec, variants: list[str], tasks: list[str], tolerance: float) -> dict[str, dict[str, Any]]:
    widths = {}
    for task in tasks:
        io = io_shape(task, spec.budgets[task], spec)
        for variant in variants:
            key = f"{base_variant(variant)}/{task}"
            if key not in widths:
                widths[key] = match_width(
                    base_variant(variant), spec.hidden, spec.layers, spec.heads, io, tolerance, spec.versor_max_hidden
                )
            widths[f"{variant}/{task}"] = widths[key]
    return widths


def render(stem: Path, spec: SizeSpec, widths: dict, meta: dict, variants: list[str], tasks: list[str]) -> str:
    rows = current_rows(read_rows(stem.with_suffix(".jsonl")), spec)
    rows.sort(key=lambda r: (variants.index(r["variant"]) if r["variant"] in variants else 99, r["task"], r["seed"]))
    reference = nbody_reference(spec.budgets["nbody"].params) if "nbody" in tasks else None
    planned = {(v, t, seed) for v in variants for t in tasks for seed in range(meta["seeds"])}
    done = sum(1 for r in rows if r.get("status") == "ok" and (r["variant"], r["task"], r["seed"]) in planned)
    meta = {
        **meta,
        "wall_minutes": sum(r.get("seconds", 0.0) for r in rows) / 60,
        "size": asdict(spec),
        "progress": f"Runs completed: {done} of {len(variants) * len(tasks) * meta['seeds']} planned "
        f"({len(variants)} variants × {len(tasks)} tasks × {meta['seeds']} seeds)."
        + (
            ""
            if done >= len(variants) * len(tasks) * meta["seeds"]
            else " The suite is incomplete; rerun the command to resume."
        ),
    }
    return write_outputs(rows, widths, asdict(spec), meta, variants, tasks, reference, stem)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default: the size's)")
    choices = list(VARIANTS) + [f"{v}{TIME_SUFFIX}" for v in VARIANTS if VARIANTS[v]["family"] == "versor"]
    parser.add_argument("--variants", nargs="+", default=None, choices=choices)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--workers", type=int, default=1, help="parallel worker processes (1 thread each)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--tolerance", type=float, default=0.10, help="parameter-count match tolerance")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--tag", default=None, help="output file stem (default ablation_<size>)")
    parser.add_argument("--report", action="store_true", help="only re-render json/csv/md/png from the jsonl")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    spec = SIZES[args.size]
    seeds = args.seeds or spec.seeds
    variants = args.variants or DEFAULT_VARIANTS[args.size]
    stem = args.output / (args.tag or f"ablation_{args.size}")
    args.output.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python benchmarks/ablation.py", *(argv if argv is not None else sys.argv[1:])])
    started = time.perf_counter()
    widths = width_table(spec, variants, args.tasks, args.tolerance)
    print(f"[widths] {len(widths)} entries in {time.perf_counter() - started:.0f}s", flush=True)
    meta = {
        "command": command.replace(" --report", ""),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine() + (f", trained on {torch.cuda.get_device_name(0)}" if args.device != "cpu" else ""),
        "seeds": seeds,
    }
    if args.report:
        print(render(stem, spec, widths, meta, variants, args.tasks))
        return

    done = {(r["variant"], r["task"], r["seed"]) for r in current_rows(read_rows(stem.with_suffix(".jsonl")), spec)}
    todo = [job for job in plan(spec, variants, args.tasks, seeds) if job not in done]
    print(f"[plan] {len(done)} runs already done, {len(todo)} to run", flush=True)
    spent: dict[str, list[float]] = {}
    finished = 0

    def job_dict(variant: str, task: str, seed: int) -> dict[str, Any]:
        job = {"variant": variant, "task": task, "seed": seed, "spec": asdict(spec), "device": args.device}
        job["width"] = widths[f"{variant}/{task}"]
        if variant.endswith(TIME_SUFFIX):
            rows = current_rows(read_rows(stem.with_suffix(".jsonl")), spec)
            times = [
                r["train_seconds"]
                for r in rows
                if r["variant"] == "baseline" and r["task"] == task and "train_seconds" in r
            ]
            if not times:
                raise RuntimeError(
                    f"{variant}/{task}: the baseline's {task} runs must finish first (wall-clock budget)."
                )
            job["seconds"] = statistics.median(times)
        return job

    def record(row: dict[str, Any]) -> None:
        nonlocal finished
        with open(stem.with_suffix(".jsonl"), "a") as log:
            log.write(json.dumps(row) + "\n")
            log.flush()
            os.fsync(log.fileno())
        finished += 1
        spent.setdefault(f"{family_of(row['variant'])}/{row['task']}", []).append(row["seconds"])
        mean = statistics.mean(s for v in spent.values() for s in v)
        eta = (
            sum(statistics.mean(spent.get(f"{family_of(v)}/{t}", [mean])) for v, t, _ in todo[finished:]) / args.workers
        )
        shown = {
            k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k not in ("traceback", "budget")
        }
        print(f"[{finished}/{len(todo)}] ETA {eta / 60:.0f} min | {shown}", flush=True)
        render(stem, spec, widths, meta, variants, args.tasks)

    if args.workers == 1:
        for job in todo:
            record(run_job(job_dict(*job)))
    else:
        import multiprocessing

        context = multiprocessing.get_context("spawn" if args.device != "cpu" else None)
        with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
            futures = [pool.submit(run_job, job_dict(*job)) for job in todo if not job[0].endswith(TIME_SUFFIX)]
            for future in concurrent.futures.as_completed(futures):
                record(future.result())
        for job in (j for j in todo if j[0].endswith(TIME_SUFFIX)):
            record(run_job(job_dict(*job)))
    print(render(stem, spec, widths, meta, variants, args.tasks))


if __name__ == "__main__":
    main()
