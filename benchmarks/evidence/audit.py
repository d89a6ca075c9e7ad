"""What the evidence rows say about the protocol beside the verdicts (issue 37): whether the step budget let each run
converge, body parameters beside embeddings and heads, compute per step and a compute-matched reading of the curves,
how many configurations each cell tried, and the lr range at which each variant learns.

Pure functions of the rows and the plan (no training); the report renders them (`report.write_evidence`). Parameter
and N-body FLOP counts build the models (no training step is taken).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from benchmarks.evidence import plan
from benchmarks.evidence.models import SequenceRegressor, build_model, embedding_parameters
from benchmarks.evidence.protocol import SELECT_SEED, SELECTION, SizeSpec
from benchmarks.evidence.runs import step_flops
from benchmarks.evidence.tasks import GENERATOR, io_shape
from zpx_hf_train.report import RECALL_BAR, recall_floor, recall_verdict

# a run converged when its final training loss (mean of the last 20 steps, answer tokens only) is at most
# -ln(RECALL_BAR): the answers' mean likelihood at least the bar a recall task counts as learned at
CONVERGED_LOSS = -math.log(RECALL_BAR)
TOKEN_TASKS = ("mqar", "passkey", "passkey_long", "selective_copy")


def converged(row: dict[str, Any]) -> bool:
    return row.get("final_train_loss", math.inf) <= CONVERGED_LOSS


def convergence(done: dict, cells: Sequence[plan.Cell], spec: SizeSpec) -> list[dict[str, Any]]:
    """Per token-task cell: how many reported seeds converged within the step budget, and their training losses;
    per N-body cell the losses only (`converged` None: a regression loss has no bar)."""
    out = []
    for cell in cells:
        rows = plan.reported_rows(cell, done, spec)
        losses = [r["final_train_loss"] for r in rows if "final_train_loss" in r]
        if cell.task in (*TOKEN_TASKS, "nbody") and losses:
            k = sum(converged(r) for r in rows) if cell.task in TOKEN_TASKS else None
            out.append({"cell": cell.name, "task": cell.task, "converged": k, "seeds": len(losses), "losses": losses})
    return out


def convergence_markdown(entries: Sequence[dict[str, Any]], spec: SizeSpec) -> list[str]:
    if not entries:
        return []
    body = [
        [
            f"{e['cell']} / {e['task']}",
            f"{spec.budgets[e['task']].steps:,}",
            "no bar" if e["converged"] is None else f"{e['converged']} of {e['seeds']}",
            f"{min(e['losses']):.3f} - {max(e['losses']):.3f}",
        ]
        for e in entries
    ]
    lines = [
        "### Convergence within the step budget (reported seeds)",
        "",
        f"Converged: final training loss (mean of the last 20 steps, answer tokens) ≤ −ln {RECALL_BAR} = "
        f"{CONVERGED_LOSS:.3f}, the answers' mean likelihood at the recall bar.",
        "",
        *markdown_table(["cell", "steps", "seeds converged", "final training loss"], body, "---"),
        "",
    ]
    for task in dict.fromkeys(e["task"] for e in entries):
        of_task = [e for e in entries if e["task"] == task]
        if task == "nbody":
            lines += [
                f"**nbody at {spec.budgets[task].steps:,} steps measures speed of learning**: a regression loss has "
                "no convergence bar and the rows keep no loss curve that could show a plateau (training losses "
                f"{min(min(e['losses']) for e in of_task):.3f} - {max(max(e['losses']) for e in of_task):.3f}), so "
                f"its verdicts compare models after {spec.budgets[task].steps:,} steps.",
                "",
            ]
            continue
        short = sum(e["seeds"] - e["converged"] for e in of_task)
        total = sum(e["seeds"] for e in of_task)
        complete = sum(e["converged"] == e["seeds"] for e in of_task)
        if short:
            lines += [
                f"**{task} at {spec.budgets[task].steps:,} steps measures speed of learning**: {short} of {total} "
                f"reported runs did not converge within the budget ({complete} of {len(of_task)} cells converged in "
                "every seed), so its verdicts compare how far each model got in "
                f"{spec.budgets[task].steps:,} steps, not what it can learn.",
                "",
            ]
    return lines


def parameter_split(variant: str, width: dict[str, Any], task: str, spec: SizeSpec) -> dict[str, int]:
    """(total, embedding, head, body) parameters of a variant's model on a task: token tasks count the token embedding
    and the untied LM head; N-body (a `SequenceRegressor`) counts its linear read-in and read-out in their place
    (the backbone's unused token embedding is not counted, as in the parameter match)."""
    torch.manual_seed(0)
    model = build_model(variant, width, spec.layers, spec.heads, io_shape(task, spec.budgets[task], spec))
    if isinstance(model, SequenceRegressor):
        total = model.counted_parameters()
        embedding = sum(p.numel() for p in model.read_in.parameters())
        head = sum(p.numel() for p in model.read_out.parameters())
    else:
        total = sum(p.numel() for p in model.parameters())
        embedding, head = embedding_parameters(model)
    return {"total": total, "embedding": embedding, "head": head, "body": total - embedding - head}


def nbody_step_flops(variant: str, width: dict[str, Any], spec: SizeSpec) -> int:
    """FLOPs of one N-body training step as `runs.step_flops` counts a token task's: forward + backward of one batch
    of the budget's shape (teacher-forced windows of context + rollout states, one input state fewer)."""
    budget = spec.budgets["nbody"]
    io = io_shape("nbody", budget, spec)
    torch.manual_seed(0)
    model = build_model(variant, width, spec.layers, spec.heads, io)
    states = torch.randn(budget.batch, io["max_pos"] - 1, io["features"])

    def loss_fn(step: int) -> torch.Tensor:
        prediction, _ = model(states)
        return torch.nn.functional.mse_loss(prediction, states)

    return step_flops(model, loss_fn)


def compute_table(
    done: dict, cells: Sequence[plan.Cell], spec: SizeSpec, widths: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per cell: FLOPs per training step (the rows' `flops_per_step`, else derived: N-body), its ratio to the
    baseline's on the task, steps and total training FLOPs, and the compute-matched reading of the curves."""
    flops: dict[tuple[str, str], tuple[int, bool]] = {}
    out = []
    for cell in cells:
        rows = plan.reported_rows(cell, done, spec)
        if not rows:
            continue
        variant = rows[0]["variant"]
        if "flops_per_step" in rows[0]:
            flops[(cell.name, cell.task)] = (int(rows[0]["flops_per_step"]), False)
        elif cell.task == "nbody" and f"{variant}/nbody" in widths:
            flops[(cell.name, cell.task)] = (nbody_step_flops(variant, widths[f"{variant}/nbody"], spec), True)
    for cell in cells:
        if (cell.name, cell.task) not in flops or ("baseline", cell.task) not in flops:
            continue
        per_step, derived = flops[(cell.name, cell.task)]
        ratio = per_step / flops[("baseline", cell.task)][0]
        steps = spec.budgets[cell.task].steps
        entry = {"cell": cell.name, "task": cell.task, "flops_per_step": per_step, "derived": derived}
        entry |= {"ratio": ratio, "steps": steps, "total": per_step * steps}
        if cell.name != "baseline":
            entry["matched"] = compute_matched(done, cell, spec, ratio)
        out.append(entry)
    return out


def _curve_mean(rows: Sequence[dict[str, Any]]) -> tuple[list[int], np.ndarray] | None:
    curves = [r["val_curve"] for r in rows if r.get("val_curve")]
    if not curves or len({tuple(s for s, _ in c) for c in curves}) != 1:
        return None
    return [s for s, _ in curves[0]], np.mean([[v for _, v in c] for c in curves], axis=0)


def compute_matched(done: dict, cell: plan.Cell, spec: SizeSpec, ratio: float) -> dict[str, Any] | None:
    """The variant's validation metric at the baseline's total training FLOPs (step budget / ratio, linearly
    interpolated between the variant's curve checkpoints; mean over reported seeds) beside the baseline's at the end
    of its budget. None where the rows hold no curves or that step falls outside the variant's checkpoints."""
    base = plan.Cell("baseline", cell.task, cell.seeds, cell.tier)
    mine, theirs = _curve_mean(plan.reported_rows(cell, done, spec)), _curve_mean(plan.reported_rows(base, done, spec))
    if mine is None or theirs is None or ratio == 1.0:
        return None
    step = theirs[0][-1] / ratio
    if not mine[0][0] <= step <= mine[0][-1]:
        return None
    return {
        "step": step,
        "variant": float(np.interp(step, mine[0], mine[1])),
        "baseline": float(theirs[1][-1]),
        "baseline_step": theirs[0][-1],
        "variant_end": float(mine[1][-1]),
    }


def compute_markdown(entries: Sequence[dict[str, Any]]) -> list[str]:
    if not entries:
        return []
    body = []
    for e in entries:
        m = e.get("matched")
        matched = (
            "-"
            if e["cell"] == "baseline"
            else "same FLOPs per step: step-matched is compute-matched"
            if e["ratio"] == 1.0
            else "no curve in the rows"
            if m is None
            else f"{m['variant']:.3f} at step {m['step']:.0f} vs the baseline's {m['baseline']:.3f} at "
            f"{m['baseline_step']} (step-matched: {m['variant_end']:.3f})"
        )
        body.append(
            [
                f"{e['cell']} / {e['task']}",
                f"{e['flops_per_step']:.3g}" + (" (derived)" if e["derived"] else ""),
                f"{e['ratio']:.2f}×",
                f"{e['total']:.3g}",
                matched,
            ]
        )
    return [
        "### Compute beside the step-matched results",
        "",
        "Training FLOPs per step: `torch.utils.flop_counter` on one forward + backward (matrix products and attention; "
        "elementwise ops not counted, so ZPX's kernel terms and PCT's gates are undercounted), from the rows, or "
        "derived here for N-body (the rows hold none) on one batch of the budget's shape. Every cell trains the same "
        "steps, so a variant with more FLOPs per step had more compute. Compute-matched: the variant's validation "
        "metric at the baseline's total training FLOPs (step budget ÷ ratio, linearly interpolated between its curve's "
        "checkpoints; mean over the reported seeds) beside the baseline's at the end of its budget. N-body rows hold "
        "no curves, so its cells have no compute-matched reading.",
        "",
        *markdown_table(
            ["cell", "FLOPs / step", "vs baseline", "training FLOPs", "compute-matched (validation)"], body, "---"
        ),
        "",
    ]


def parameter_markdown(
    widths: dict[str, dict[str, Any]], spec: SizeSpec, tasks: Sequence[str]
) -> tuple[list[str], dict[str, dict[str, int]]]:
    """Body parameters beside the embedding and head counts and the total the parameter match used."""
    split: dict[str, dict[str, int]] = {}
    for key, width in sorted(widths.items()):
        variant, task = key.split("/")
        if task in tasks and variant in plan.VARIANTS and key not in split:
            split[key] = parameter_split(variant, width, task, spec)
    body = []
    for key, s in split.items():
        task = key.split("/")[1]
        base = split.get(f"baseline/{task}")
        ratio = f"{s['body'] / base['body']:.2f}×" if base else "-"
        body.append([key, f"{s['total']:,}", f"{s['embedding']:,}", f"{s['head']:,}", f"{s['body']:,}", ratio])
    lines = [
        "### Parameters: body beside embeddings and head",
        "",
        "The match (±10%) is on the total. Token tasks: token embedding and untied LM head (0 when tied); N-body: the "
        "linear read-in and read-out. Body: the rest (attention, MLP, norms, the family's own parameters).",
        "",
        *markdown_table(
            ["variant / task", "total", "embedding / read-in", "head / read-out", "body", "body vs baseline"],
            body,
            "---",
        ),
        "",
    ]
    versor, base = split.get("versor_hybrid/mqar"), split.get("baseline/mqar")
    if versor and base:
        lines += [
            f"Versor on MQAR is matched on the total only: {versor['embedding'] + versor['head']:,} of its "
            f"{versor['total']:,} parameters are embedding and head (hidden {widths['versor_hybrid/mqar']['hidden']}), "
            f"leaving a body of {versor['body']:,} against the baseline's {base['body']:,} "
            f"({versor['body'] / base['body']:.2f}×).",
            "",
        ]
    return lines, split


def configurations_markdown(cells: Sequence[plan.Cell], spec: SizeSpec) -> list[str]:
    """How many configurations (member x lr of the start grid) each cell's selection tried."""
    counts = {(c.name, c.task): len(plan.members(c.name)) * len(spec.lr_grid(c.task)) for c in cells}
    body = [[f"{n} / {t}", f"{len(plan.members(n))} × {len(spec.lr_grid(t))} = {k}"] for (n, t), k in counts.items()]
    tuned = [n for n in plan.TUNED_GROUPS if any(c.name == n for c in cells)]
    return [
        "### Configurations tried per cell",
        "",
        "Members × learning rates of the start grid, all with the selection seed: "
        + "; ".join(
            f"`{n}` selects over {len(plan.members(n))} PCT variants ({', '.join(plan.members(n))}) × "
            f"{len(spec.lrs)} lrs = {len(plan.members(n)) * len(spec.lrs)} configurations"
            for n in tuned
        )
        + (f" against {len(spec.lrs)} for every other cell. " if tuned else ". ")
        + "ZPX's own knobs (lambda_angle, lambda_sphere, the phase channels, the centre-loss weight) were not tuned: "
        "every ZPX variant runs the one setting of benchmarks.evidence.models.VARIANTS, at each lr.",
        "",
        *markdown_table(["cell", "configurations"], body, "---"),
        "",
    ]


def task_floor(task: str, spec: SizeSpec) -> float:
    """The copy floor of a recall task at the size's generator parameters (`zpx_hf_train.report.recall_floor`)."""
    return recall_floor(GENERATOR.get(task, task), spec.budgets[task].params)


def learn_criterion(task: str, spec: SizeSpec, reference: dict[str, Any] | None) -> str | None:
    if task in TOKEN_TASKS:
        return (
            f"validation answer accuracy above the copy floor {task_floor(task, spec):.3f} by 3 binomial standard "
            f"errors (`zpx_hf_train.report.recall_verdict`), ✓ at the bar {RECALL_BAR}"
        )
    if task == "nbody" and reference and "val_const_velocity_position_mse" in reference:
        return (
            "validation rollout position MSE below constant-velocity extrapolation's on the same trajectories "
            f"({reference['val_const_velocity_position_mse']:.4f})"
        )
    return None


def learn_key(task: str) -> str:
    """The validation metric a learning verdict reads: the selection metric, except N-body's validation rollout MSE
    (learning is beating constant velocity's rollout, whatever the selection score weighs in)."""
    return "val_position_mse" if task == "nbody" else SELECTION[task][0]


def learns(row: dict[str, Any], spec: SizeSpec, reference: dict[str, Any] | None) -> str:
    """`learned` / `above the floor` / `at the floor` (token tasks, `recall_verdict` on the validation metric),
    `beats constant velocity` / `no better than constant velocity` (N-body), `failed` or `no floor`."""
    task = row["task"]
    key = learn_key(task)
    if row.get("status") != "ok" or key not in row:
        return "failed"
    if task in TOKEN_TASKS:
        floor = task_floor(task, spec)
        shape = row.get("shape") or row.get("passkey_shape@1x") or [1, 1]
        return recall_verdict(float(row[key]), floor, spec.val_examples * int(shape[1]))
    if task == "nbody" and reference and "val_const_velocity_position_mse" in reference:
        better = row[key] < reference["val_const_velocity_position_mse"]
        return "beats constant velocity" if better else "no better than constant velocity"
    return "no floor"


MARK = {"learned": "✓", "above the floor, below the bar": "~", "beats constant velocity": "✓"}


def lr_ranges(done: dict, spec: SizeSpec, reference: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per variant and task, every selection-seed run: its lr, validation metric and `learns` verdict; `range`: the
    lrs at which it learned (✓), `above`: those above the floor at least."""
    runs: dict[tuple[str, str], dict[float, dict[str, Any]]] = {}
    for (variant, task, seed, lr), row in done.items():
        if seed == SELECT_SEED:
            runs.setdefault((variant, task), {})[lr] = row
    out = []
    for (variant, task), by_lr in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        key = learn_key(task)
        entries = [
            {"lr": lr, "value": by_lr[lr].get(key), "verdict": learns(by_lr[lr], spec, reference)}
            for lr in sorted(by_lr)
        ]
        out.append(
            {
                "variant": variant,
                "family": by_lr[min(by_lr)].get("family"),
                "task": task,
                "runs": entries,
                "range": [e["lr"] for e in entries if MARK.get(e["verdict"]) == "✓"],
                "above": [e["lr"] for e in entries if e["verdict"] in MARK],
            }
        )
    return out


def _span(lrs: Sequence[float]) -> str:
    return "none" if not lrs else ", ".join(f"{lr:g}" for lr in lrs)


def lr_range_markdown(entries: Sequence[dict[str, Any]], spec: SizeSpec, reference: dict[str, Any] | None) -> list[str]:
    if not entries:
        return []
    lines = [
        "### lr range that learns (selection seed, every lr run)",
        "",
        "One run per lr (seed 0, the selection runs: one seed, so a range is indicative, not a tested claim). "
        "Criteria: "
        + "; ".join(
            f"{task}: {learn_criterion(task, spec, reference)}"
            for task in dict.fromkeys(e["task"] for e in entries)
            if learn_criterion(task, spec, reference)
        )
        + ". ✓ learned, ~ above the floor only, ✗ at the floor (or no better than constant velocity).",
        "",
    ]
    body = []
    for e in entries:
        cells = [
            f"{r['lr']:g}: {'-' if r['value'] is None else format(r['value'], '.4g')} "
            f"{MARK.get(r['verdict'], '✗' if r['verdict'] not in ('failed', 'no floor') else r['verdict'])}"
            for r in e["runs"]
        ]
        body.append([e["task"], e["variant"], "; ".join(cells), _span(e["range"]), _span(e["above"])])
    lines += [
        *markdown_table(["task", "variant", "lr: validation metric", "learns at", "above the floor at"], body, "---"),
        "",
    ]
    narrow = []
    for e in entries:
        base = next((b for b in entries if b["task"] == e["task"] and b["variant"] == "baseline"), None)
        if base and e["variant"] != "baseline" and not set(base["range"]) <= set(e["range"]):
            missing = sorted(set(base["range"]) - set(e["range"]))
            narrow.append(f"{e['variant']} on {e['task']} (not at {_span(missing)})")
    if narrow:
        lines += [
            "Narrower than softmax + RoPE's range (lrs at which the baseline learns and the variant does not): "
            + "; ".join(narrow)
            + ". One seed per lr: `lr_boundary.md` (`python -m benchmarks.evidence.lr_boundary`) reruns these "
            "boundaries with seeds 1-3.",
            "",
        ]
    return lines


def lr_range_summary(entries: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`variant/task` -> learns-at and above-the-floor lrs with each run's value and verdict (the citable json)."""
    return {f"{e['variant']}/{e['task']}": {k: e[k] for k in ("family", "range", "above", "runs")} for e in entries}


def markdown_table(header: list[str], rows: list[list[str]], align: str = "---:") -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|---|" + f"{align}|" * (len(header) - 1),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


__all__ = [
    "CONVERGED_LOSS",
    "compute_markdown",
    "compute_table",
    "configurations_markdown",
    "convergence",
    "convergence_markdown",
    "converged",
    "learns",
    "lr_range_markdown",
    "lr_range_summary",
    "lr_ranges",
    "markdown_table",
    "nbody_step_flops",
    "parameter_markdown",
    "parameter_split",
]
