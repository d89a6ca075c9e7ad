"""The evidence suite's plan: cells (variant x task x seeds), lr selection on validation, job order, estimates.

A cell is one table entry: a variant (or a tuned group such as `pct_tuned`, whose members are every PCT variant,
so a PCT scale option is one line in `models.VARIANTS`) on one task with a number of seeds. Its jobs
are (variant, task, seed, lr):

1. stage 1: seed 0 (`protocol.SELECT_SEED`) of every member at every lr of the grid;
2. selection: the (member, lr) with the best validation metric (`protocol.SELECTION`) among the stage-1 runs; a pick
   on the grid's edge widens the grid by the next half-decade lr (`protocol.widen_grid`, the LM study's rule) and
   stage 1 runs there, until the pick is interior;
3. stage 2: seeds 1 .. n-1 at the selected (member, lr). Only these are reported and tested: the selection seed's
   run won the selection, so its number is biased upwards (the winner's curse), and it is never reported.

Jobs run in tier order (headline cells first), stage 2 before a later cell's stage 1, so an interrupted suite has
complete cells rather than many partial ones. Pure functions of the rows: a rerun recomputes the same plan.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.evidence.models import VARIANTS, base_variant, family_of, variant_revision
from benchmarks.evidence.protocol import SELECT_SEED, SELECTION, SizeSpec, widen_grid
from benchmarks.evidence.tasks import task_seq_len

Job = tuple[str, str, int, float]  # (variant, task, seed, lr)


@dataclass(frozen=True)
class Cell:
    name: str  # a variant of models.VARIANTS or a key of TUNED_GROUPS
    task: str
    seeds: int
    tier: int  # 0 first (headline)


def pct_members() -> tuple[str, ...]:
    """`pct` (package defaults) first, then every other PCT variant: the scale options."""
    return ("pct", *(v for v in VARIANTS if VARIANTS[v]["family"] == "pct" and v != "pct"))


TUNED_GROUPS = {"pct_tuned": pct_members}  # a cell selected over several variants as well as the lr


def members(name: str) -> tuple[str, ...]:
    return TUNED_GROUPS[name]() if name in TUNED_GROUPS else (name,)


HEADLINE_TASKS = ("mqar", "passkey", "nbody")
ATTENTION = ("baseline", "softmax_srpe", "zpx_full", "pct", "pct_tuned")
CORE = (*ATTENTION, "versor_hybrid")
LADDER = ("zpx_angle", "zpx_angle_sphere", "zpx_center")  # seed 000's steps; zpx_full is the last one (+ SRPE)
HEADLINE_SEEDS, OTHER_SEEDS, EXTRA_SEEDS = 5, 3, 2


def evidence_cells(
    tasks: Sequence[str], variants: Sequence[str] | None = None, max_seeds: int | None = None
) -> list[Cell]:
    """The evidence plan, in priority order (restricted to `tasks` / `variants` when given).

    tier 0 (headline, 5 seeds): MQAR, the needle trained at 80 and N-body for the attention variants; Versor
    (parameter-matched) on MQAR and N-body; LRA ListOps for the attention variants (only sizes with a `listops`
    budget: `--size full`, a GPU; seed 003's "LRA" claim);
    tier 1: Versor on the needle, 3 seeds (a matched Versor step costs ~4x the baseline's on CPU);
    tier 2: seed 000's ZPX ladder on MQAR and the needle, 3 seeds;
    tier 3: the same-length needle (512 tokens) for the baseline, ZPX and PCT, 2 seeds;
    tier 4: spiral (geometry) for the core variants and the ladder, 2 seeds (beyond the 5-hour CPU budget: run
    with `--max-tier 4`; the medium suite had every variant at 0.99-1.00 there).
    Selective copying and text are not in the evidence plan (their medium rows stay, untuned). `max_seeds` caps
    every cell's seeds (a smoke-test size)."""
    plan = [Cell(v, t, HEADLINE_SEEDS, 0) for t in HEADLINE_TASKS for v in ATTENTION]
    plan += [Cell("versor_hybrid", t, HEADLINE_SEEDS, 0) for t in ("mqar", "nbody")]
    plan += [Cell(v, "listops", HEADLINE_SEEDS, 0) for v in ATTENTION]
    plan += [Cell("versor_hybrid", "passkey", OTHER_SEEDS, 1)]
    plan += [Cell(v, t, OTHER_SEEDS, 2) for t in ("mqar", "passkey") for v in LADDER]
    plan += [Cell(v, "passkey_long", EXTRA_SEEDS, 3) for v in ATTENTION if v != "softmax_srpe"]
    plan += [Cell(v, "spiral", EXTRA_SEEDS, 4) for v in (*CORE, *LADDER)]
    plan = [c for c in plan if c.name not in TUNED_GROUPS or len(members(c.name)) > 1]  # no options: no group
    if max_seeds is not None:
        plan = [replace(c, seeds=min(c.seeds, max_seeds)) for c in plan]
    return [c for c in plan if c.task in tasks and (variants is None or c.name in variants)]


@dataclass(frozen=True)
class Family:
    """One claim's comparison family, declared here before the runs: each comparison is (variant, task, metric key)
    against the baseline on the same task, and is in exactly one family. The family-wise error rate ALPHA holds per
    family (Bonferroni over the comparisons it tests), so a test's p never depends on which table shows it."""

    name: str
    claim: str
    comparisons: tuple[tuple[str, str, str], ...]


NBODY_METRICS = ("position_mse", "energy_drift", "onestep_position_mse", "hidden_velocity_position_mse")
NBODY_METRICS += ("mass10_position_mse",)


def claim_metrics(task: str, spec: SizeSpec) -> tuple[str, ...]:
    """The metric keys a task's comparisons test (its other row keys are reported, never tested)."""
    if task == "passkey":
        return tuple(f"passkey_digit_acc@{m}x" for m in spec.multiples(task))
    if task == "passkey_long":
        return ("passkey_digit_acc@1x",)
    return NBODY_METRICS if task == "nbody" else ("accuracy",)


def comparison_families(spec: SizeSpec) -> list[Family]:
    """The claim families of the evidence plan (the report renders them before the results). A comparison whose cell
    a size does not plan is left out of that size's family; a pair of comparisons that test the same runs (a tuned
    group that selected its default member) is tested once."""

    def over(variants: Sequence[str], tasks: Sequence[str]) -> tuple[tuple[str, str, str], ...]:
        return tuple((v, t, k) for v in variants for t in tasks for k in claim_metrics(t, spec))

    pct, ladder = ("pct", "pct_tuned"), (*LADDER, "zpx_full")
    return [
        Family(
            "pct_needle",
            "PCT retrieves the needle and extrapolates beyond its trained length; LRA (seed 003)",
            over(pct, ("passkey", "passkey_long", "listops")),
        ),
        Family(
            "pct_other",
            "PCT on recall, physics and geometry beyond its seed's claim",
            over(pct, ("mqar", "nbody", "spiral")),
        ),
        Family(
            "versor_physics",
            "Versor models N-body dynamics and geometry better (seed 004)",
            over(("versor_hybrid",), ("nbody", "spiral")),
        ),
        Family("versor_recall", "Versor on recall (MQAR, the needle)", over(("versor_hybrid",), ("mqar", "passkey"))),
        Family(
            "zpx_ladder",
            "Seed 000's ZPX ladder (angle, + sphere, + centre loss, + SRPE) against softmax attention",
            over(ladder, ("mqar", "passkey", "spiral")) + over(("zpx_full",), ("nbody", "passkey_long", "listops")),
        ),
        Family(
            "srpe",
            "SRPE alone: softmax attention with SRPE instead of RoPE",
            over(("softmax_srpe",), ("mqar", "passkey", "nbody", "spiral", "listops")),
        ),
    ]


def row_lr(row: dict[str, Any], spec: SizeSpec) -> float:
    return float(row.get("lr", spec.budgets[row["task"]].lr))


def job_of(row: dict[str, Any], spec: SizeSpec) -> Job:
    return (row["variant"], row["task"], int(row["seed"]), row_lr(row, spec))


def index_rows(rows: Sequence[dict[str, Any]], spec: SizeSpec) -> dict[Job, dict[str, Any]]:
    """Rows of this spec's protocol, budgets and variant revisions, last row per job (a changed budget, protocol
    or variant revision reruns it; the report lists the other rows as superseded)."""
    fingerprints = {task: budget.fingerprint() for task, budget in spec.budgets.items()}
    latest = {}
    for row in rows:
        if (
            row.get("protocol", "") == spec.protocol
            and row.get("budget") == fingerprints.get(row["task"])
            and base_variant(row["variant"]) in VARIANTS
            and row.get("variant_revision") == variant_revision(row["variant"])
        ):
            latest[job_of(row, spec)] = row
    return latest


def selection_value(row: dict[str, Any]) -> tuple[float, str]:
    """(validation metric, where it came from). Rows without the validation key (an N-body protocol without a
    validation split) fall back to the test key, flagged `test`: the report says so beside the cell."""
    key, _ = SELECTION[row["task"]]
    if key in row:
        return float(row[key]), "val"
    test_key = key[len("val_") :]
    if test_key in row:
        return float(row[test_key]), "test"
    return math.nan, "missing"


def _selection(cell: Cell, done: dict[Job, dict[str, Any]], spec: SizeSpec) -> dict[str, Any]:
    """`protocol.widen_grid` over the cell's lr grid, each lr scored by its best member's selection-seed run."""
    _, higher = SELECTION[cell.task]

    def value(lr: float) -> float | None:
        jobs = [(m, cell.task, SELECT_SEED, lr) for m in members(cell.name)]
        if any(job not in done for job in jobs):
            return None
        values = [selection_value(done[j])[0] if done[j].get("status") == "ok" else math.nan for j in jobs]
        finite = [v for v in values if math.isfinite(v)]
        return (-max(finite) if higher else min(finite)) if finite else math.nan

    return widen_grid(spec.lr_grid(cell.task), value)


def select(cell: Cell, done: dict[Job, dict[str, Any]], spec: SizeSpec) -> dict[str, Any] | None:
    """The selected setting of a cell once its stage-1 runs of the start grid have finished (None before).

    Failed or non-finite runs are not candidates; when every candidate failed the cell has no selection and
    `failed` is set. Ties go to the lower lr, then the earlier member. `edge`: the pick sits on the grid's edge
    (the optimum may lie outside); `widen`: the lrs the widened grid still needs (the pick is provisional until they
    have run: `final` false)."""
    chosen = _selection(cell, done, spec)
    stage1 = [(m, cell.task, SELECT_SEED, lr) for m in members(cell.name) for lr in chosen["grid"]]
    table = {
        f"{j[0]}@{j[3]:g}": selection_value(done[j])[0] if done[j].get("status") == "ok" else done[j].get("status")
        for j in stage1
        if j in done
    }
    if chosen.get("failed"):
        return {"failed": True, "grid": table}
    lr = chosen["pick"] if chosen["pick"] is not None else chosen["provisional"]
    if lr is None:
        return None
    _, higher = SELECTION[cell.task]
    candidates = []
    for order, m in enumerate(members(cell.name)):
        row = done[(m, cell.task, SELECT_SEED, lr)]
        value, source = selection_value(row) if row.get("status") == "ok" else (math.nan, "failed")
        if math.isfinite(value):
            candidates.append(((-value if higher else value), order, m, value, source))
    _, _, member, value, source = min(candidates)
    return {
        "variant": member,
        "lr": lr,
        "value": value,
        "source": source,
        "grid": table,
        "failed": False,
        "edge": chosen["edge"],
        "widen": chosen["missing"],
        "final": chosen["pick"] is not None,
        "lrs": chosen["grid"],
    }


def cell_jobs(cell: Cell, done: dict[Job, dict[str, Any]], spec: SizeSpec) -> list[tuple[int, Job]]:
    """(stage, job) of a cell that can run now: stage 1 (the grid as widened so far) always, stage 2 once the
    selection is final."""
    grid = spec.lr_grid(cell.task)
    if len(grid) == 1 and len(members(cell.name)) == 1:  # nothing to select: every seed is stage 1
        return [(1, (cell.name, cell.task, s, grid[0])) for s in range(cell.seeds)]
    jobs = [
        (1, (m, cell.task, SELECT_SEED, lr)) for m in members(cell.name) for lr in _selection(cell, done, spec)["grid"]
    ]
    chosen = select(cell, done, spec)
    if chosen and not chosen["failed"] and chosen["final"]:
        jobs += [(2, (chosen["variant"], cell.task, s, chosen["lr"])) for s in reported_seeds(cell)]
    return jobs


def reported_seeds(cell: Cell) -> range:
    """The seeds a cell reports and tests: 1 .. n-1 (the selection seed never)."""
    return range(SELECT_SEED + 1, cell.seeds)


def runnable(cells: Sequence[Cell], done: dict[Job, dict[str, Any]], spec: SizeSpec) -> list[Job]:
    """Jobs not yet done that can start now, best first: tier, then stage 2 before stage 1 (complete cells
    first), then plan order, seed, lr."""
    keyed = {}
    for index, cell in enumerate(cells):
        for stage, job in cell_jobs(cell, done, spec):
            if job not in done:
                key = (cell.tier, -stage, index, job[2], job[3])
                keyed[job] = min(key, keyed.get(job, key))
    return sorted(keyed, key=keyed.__getitem__)


def planned_jobs(cells: Sequence[Cell], spec: SizeSpec) -> list[tuple[Cell, int, str, float | None]]:
    """(cell, seed, member or 'selected', lr or None) of the whole plan, for counting and estimates (stage-1 runs
    shared between cells, e.g. `pct`'s in `pct` and `pct_tuned`, are counted once)."""
    seen, out = set(), []
    for cell in cells:
        for m in members(cell.name):
            for lr in spec.lr_grid(cell.task):
                if (m, cell.task, lr) not in seen:
                    seen.add((m, cell.task, lr))
                    out.append((cell, 0, m, lr))
        if len(spec.lr_grid(cell.task)) > 1 or len(members(cell.name)) > 1:
            out += [(cell, s, "selected", None) for s in range(1, cell.seeds)]
    return out


def reported_rows(cell: Cell, done: dict[Job, dict[str, Any]], spec: SizeSpec) -> list[dict[str, Any]]:
    """The finished rows a cell reports: seeds 1 .. n-1 at its selected setting (provisional while a widening run is
    missing: `select`'s `final`). A size without a selection (one lr, one member) reports every seed."""
    chosen = select(cell, done, spec)
    grid = spec.lr_grid(cell.task)
    seeds: range = reported_seeds(cell)
    if len(grid) == 1 and len(members(cell.name)) == 1:
        chosen, seeds = {"variant": cell.name, "lr": grid[0], "failed": False}, range(cell.seeds)
    if not chosen or chosen["failed"]:
        return []
    jobs = [(chosen["variant"], cell.task, s, chosen["lr"]) for s in seeds]
    return [done[j] for j in jobs if j in done and done[j].get("status") == "ok"]


# seconds per training step of the medium suite's rows on this machine (2-core CPU shared with other jobs,
# evaluation included), by task; a family's ratio to the baseline from the same rows. Versor at matched
# parameters (hidden 512) measured 4.2x the baseline's step on MQAR here (5 steps each, same load).
VERSOR_MATCHED_COST = 4.2
STEP_SECONDS = {"mqar": 0.55, "passkey": 0.35, "selective_copy": 0.5, "spiral": 0.55, "text": 0.35, "nbody": 0.3}


def step_seconds(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """Median seconds per step by (family, task) of finished rows (e.g. the medium jsonl)."""
    spent: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("steps_done") and "@" not in r["variant"]:
            spent.setdefault((r.get("family", family_of(r["variant"])), r["task"]), []).append(
                r["seconds"] / r["steps_done"]
            )
    return {key: statistics.median(v) for key, v in spent.items()}


def estimate_seconds(variant: str, task: str, spec: SizeSpec, measured: dict[tuple[str, str], float]) -> float:
    """One run's estimated wall seconds: steps x seconds per step of the family on the task (the medium rows;
    the needle at 512 tokens and ListOps: the 80-token needle's step x tokens per step; Versor at 512: x
    VERSOR_MATCHED_COST over the baseline), plus the evaluations (the needle at every length; ListOps)."""
    family = family_of(variant)
    base_task = "passkey" if task in ("passkey_long", "listops") else task
    budget = spec.budgets[task]
    per_step = measured.get(("zpx", base_task), STEP_SECONDS[base_task])
    if family == "versor" and (spec.versor_max_hidden or 0) > spec.hidden:
        per_step *= VERSOR_MATCHED_COST
    elif family != "zpx":
        per_step = measured.get((family, base_task), per_step)
    if base_task != task:  # scaled from the 80-token needle by tokens per step
        reference, reference_task = (
            (spec.budgets["passkey"], "passkey") if "passkey" in spec.budgets else (budget, task)
        )
        tokens = budget.batch * task_seq_len(task, budget.params)
        per_step *= tokens / (reference.batch * task_seq_len(reference_task, reference.params))
    seconds = per_step * budget.steps
    if task in ("passkey", "passkey_long"):  # forward only, ~1/3 of a training step per token
        lengths = spec.passkey_lengths(task)
        eval_tokens = spec.passkey_eval_examples * sum(lengths)
        seconds += per_step * eval_tokens / (3 * budget.batch * budget.params["length"])
    if task == "listops":  # test, and validation at every checkpoint and the end, at the padded length
        examples = spec.eval_examples + spec.val_examples * (len(spec.checkpoints) + 1)
        seconds += per_step * examples / (3 * budget.batch)
    return seconds


def training_tokens(cells: Sequence[Cell], spec: SizeSpec) -> dict[str, tuple[int, int]]:
    """(runs, training tokens) of the plan by task: steps x batch x the padded example length of every planned run
    (shared stage-1 runs once). A cost measure that needs no machine: the size of a suite not yet run."""
    out: dict[str, tuple[int, int]] = {}
    for cell, _, _, _ in planned_jobs(cells, spec):
        budget = spec.budgets[cell.task]
        runs, tokens = out.get(cell.task, (0, 0))
        out[cell.task] = (runs + 1, tokens + budget.steps * budget.batch * task_seq_len(cell.task, budget.params))
    return out


def estimate(cells: Sequence[Cell], spec: SizeSpec, measured: dict, workers: int) -> dict[str, float]:
    """Estimated wall hours of the plan by tier and in all, with `workers` runs in parallel."""
    hours: dict[str, float] = {}
    for cell, _, member, _ in planned_jobs(cells, spec):
        variant = members(cell.name)[0] if member == "selected" else member
        key = f"tier {cell.tier}"
        hours[key] = hours.get(key, 0.0) + estimate_seconds(variant, cell.task, spec, measured) / 3600 / workers
    hours["total"] = sum(hours.values())
    return hours


__all__ = [
    "ATTENTION",
    "CORE",
    "Cell",
    "Family",
    "HEADLINE_TASKS",
    "LADDER",
    "TUNED_GROUPS",
    "cell_jobs",
    "claim_metrics",
    "comparison_families",
    "reported_rows",
    "reported_seeds",
    "estimate",
    "estimate_seconds",
    "evidence_cells",
    "index_rows",
    "members",
    "planned_jobs",
    "progress",
    "runnable",
    "select",
    "step_seconds",
    "training_tokens",
]


def progress(cells: Sequence[Cell], done: dict[Job, dict[str, Any]], spec: SizeSpec) -> dict[str, Any]:
    """Planned and finished runs (shared stage-1 runs once; the grids as widened so far) and the cells complete at
    their final selected setting."""
    planned_keys: set[tuple] = set()
    finished: set[tuple] = set()
    complete = []
    for cell in cells:
        for m in members(cell.name):
            for lr in _selection(cell, done, spec)["grid"]:
                planned_keys.add((m, cell.task, SELECT_SEED, lr))
                if (m, cell.task, SELECT_SEED, lr) in done:
                    finished.add((m, cell.task, SELECT_SEED, lr))
        rows = reported_rows(cell, done, spec)
        for s in reported_seeds(cell):
            planned_keys.add((cell.name, cell.task, s))
        finished.update((cell.name, cell.task, r["seed"]) for r in rows if r["seed"] != SELECT_SEED)
        chosen = select(cell, done, spec)
        if chosen and not chosen["failed"] and chosen["final"] and len(rows) == len(reported_seeds(cell)):
            complete.append(cell)
    return {"planned": len(planned_keys), "done": len(finished), "complete": complete}
