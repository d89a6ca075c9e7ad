"""Ablation reporting: seed aggregation, verdicts against the baseline, generated findings, the seed-claim
check, Markdown tables, plots, and the calibration report. Pure functions of the result rows (no training).

`spec` is the suite size as a plain dict (`dataclasses.asdict(SizeSpec)`, also stored in the results'
`meta.size`), so saved results re-render without the training stack.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zpx_hf_train.metrics import aggregate_runs, format_mean_std

VARIANT_LABELS = {
    "baseline": "softmax + RoPE (baseline)",
    "softmax_srpe": "softmax + SRPE",
    "zpx_angle": "ZPX angle, RoPE",
    "zpx_angle_sphere": "ZPX angle+sphere, RoPE",
    "zpx_center": "ZPX angle+sphere + centre loss, RoPE",
    "zpx_srpe": "ZPX angle+sphere, SRPE",
    "zpx_full": "ZPX angle+sphere + centre loss, SRPE",
    "pct": "PCT (sigmoid, complex)",
    "pct_tau_sqrt_d": "PCT, fixed tau = sqrt(d)",
    "pct_tau5": "PCT, log-space tau from 5",
    "versor_gpa": "Versor GPA",
    "versor_rra": "Versor RRA",
    "versor_hybrid": "Versor hybrid",
}
TIME_SUFFIX = "@time"
METRICS = {
    "mqar": [("accuracy", "MQAR acc", True)],
    "selective_copy": [("accuracy", "sel. copy acc", True)],
    "spiral": [("accuracy", "spiral acc", True)],
    "text": [("perplexity", "text ppl/byte", False)],
    "nbody": [("position_mse", "N-body pos MSE", False), ("energy_drift", "N-body dE/E", False)],
    "listops": [("accuracy", "ListOps acc", True)],
}
LEARNED = 0.9  # a recall task counts as learned by the baseline at this answer accuracy
# The needle's answer accuracy (per answer digit, as MQAR's per answer token); exact match is kept in csv/json.
NEEDLE = "passkey_digit_acc"
PUBLIC_NBODY = "Versor 5.21 ± 6.39, Transformer 6.61 ± 6.41, GATr 8.32 (the Versor paper's own scale and units)"


def label(variant: str) -> str:
    if variant.endswith(TIME_SUFFIX):
        return f"{VARIANT_LABELS[variant[: -len(TIME_SUFFIX)]]}, wall-clock-matched"
    return VARIANT_LABELS[variant]


def metric_columns(spec: dict[str, Any], tasks: Sequence[str]) -> list[tuple[str, str, str, bool]]:
    """(task, metric key, column label, higher is better); passkey has one column per evaluated length."""
    columns = []
    for task in tasks:
        if task == "passkey":
            length = spec["budgets"]["passkey"]["params"]["length"]
            for multiple in spec["passkey_multiples"]:
                columns.append((task, f"{NEEDLE}@{multiple}x", f"needle acc @{multiple}x ({multiple * length})", True))
        else:
            columns += [(task, key, text, better) for key, text, better in METRICS[task]]
    return columns


def summarise(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and sample std over seeds per (variant, task) of the completed runs."""
    keys = sorted({k for r in runs for k in r if k.startswith(("passkey_em@", "passkey_digit_acc@"))})
    metric_keys = ["accuracy", "exact_match", "perplexity", "position_mse", "state_mse", "energy_drift"]
    metric_keys += keys + ["final_train_loss", "steps_done", "train_seconds", "seconds", "params"]
    return aggregate_runs([r for r in runs if r.get("status") == "ok"], ["variant", "task"], metric_keys)


def verdict(a: tuple[float, float], b: tuple[float, float], higher_better: bool) -> str:
    """`better`/`worse` than the baseline when the mean gap exceeds the sum of the two stds, else `~`."""
    (ma, sa), (mb, sb) = a, b
    if any(math.isnan(v) for v in (ma, mb)):
        return "-"
    if abs(ma - mb) <= (sa or 0) + (sb or 0):
        return "~"
    gap = ma - mb if higher_better else mb - ma
    return "better" if gap > 0 else "worse"


def _pair(row: dict[str, Any], key: str) -> tuple[float, float]:
    return row[f"{key}_mean"], row[f"{key}_std"]


def compare(row: dict[str, Any], base: dict[str, Any], key: str, higher_better: bool) -> str:
    """`verdict` of two aggregate rows; `one seed` when either has a single seed (no spread to judge noise)."""
    if min(row.get("n", 0), base.get("n", 0)) < 2:
        return "one seed"
    return verdict(_pair(row, key), _pair(base, key), higher_better)


def findings(
    by: dict[tuple[str, str], dict[str, Any]],
    columns: list[tuple[str, str, str, bool]],
    variants: Sequence[str],
    reference: dict[str, Any] | None,
) -> list[str]:
    """One generated sentence per metric: best variant, baseline, and who is better/worse beyond noise."""
    lines = ["Findings (generated from the numbers above):", ""]
    for task, key, text_label, higher in columns:
        scored = [(v, by[(v, task)]) for v in variants if f"{key}_mean" in by.get((v, task), {})]
        if not scored:
            continue
        digits = 4 if key == "position_mse" else 3
        best_value = (max if higher else min)(row[f"{key}_mean"] for _, row in scored)
        best = [v for v, row in scored if abs(row[f"{key}_mean"] - best_value) <= 1e-9]
        names = "all variants tied" if len(best) == len(scored) > 1 else ", ".join(best)
        text = f"- {text_label}: best {names} ({best_value:.{digits}f})"
        base = by.get(("baseline", task), {})
        if f"{key}_mean" in base:
            text += f"; baseline {format_mean_std(*_pair(base, key), digits)}"
            groups: dict[str, list[str]] = {"better": [], "worse": []}
            for v, row in scored:
                if v != "baseline":
                    groups.setdefault(compare(row, base, key, higher), []).append(v)
            text += f"; better than baseline beyond noise: {', '.join(groups['better']) or 'none'}"
            text += f"; worse: {', '.join(groups['worse']) or 'none'}"
            if groups.get("one seed"):
                text += f"; one seed only, not compared: {', '.join(groups['one seed'])}"
        if key == "position_mse" and reference:
            cv = reference["const_velocity_position_mse"]
            beating = [v for v, row in scored if row[f"{key}_mean"] < cv]
            text += (
                f"; constant-velocity extrapolation {cv:.4f}, beaten by: {', '.join(beating) or 'no trained variant'}"
            )
        lines.append(text + ".")
    return lines


def baseline_learned(by: dict[tuple[str, str], dict[str, Any]], task: str, key: str = "accuracy") -> bool | None:
    """Whether the baseline's mean answer accuracy reached the learnability bar (None: not run)."""
    row = by.get(("baseline", task), {})
    if f"{key}_mean" not in row:
        return None
    return row[f"{key}_mean"] >= LEARNED


def claims(
    by: dict[tuple[str, str], dict[str, Any]], spec: dict[str, Any], reference: dict[str, Any] | None
) -> list[str]:
    """The source designs' claims, each marked reproduced / not reproduced / undecided, with the numbers."""
    lines = ["Seed claims checked by this run:", ""]
    multiples = spec.get("passkey_multiples", [])
    # PCT: retrieval far beyond the trained length (1.000 vs 0.583 for softmax at long context)
    pct, base = by.get(("pct", "passkey"), {}), by.get(("baseline", "passkey"), {})
    longest = max(multiples) if multiples else None
    key = f"{NEEDLE}@{longest}x"
    text = "- PCT, needle retrieval beyond the trained length (seed: 1.000 vs 0.583 for softmax): "
    if f"{key}_mean" not in pct or f"{key}_mean" not in base:
        text += "undecided: the PCT or baseline passkey runs did not finish."
    elif not baseline_learned(by, "passkey", f"{NEEDLE}@1x"):
        text += "undecided: the baseline did not learn the needle at the trained length, so the budget cannot tell."
    else:
        mark = verdict(_pair(pct, key), _pair(base, key), True)
        numbers = (
            f"PCT {format_mean_std(*_pair(pct, key))} vs baseline {format_mean_std(*_pair(base, key))} at {longest}x"
        )
        text += {"better": "reproduced", "worse": "not reproduced (PCT worse)", "~": "not reproduced (within noise)"}[
            mark
        ] + f": {numbers}."
    lines.append(text)
    # Versor: N-body rollout MSE better than a Transformer
    versors = [
        v for (v, t), row in by.items() if v.startswith("versor_") and t == "nbody" and "position_mse_mean" in row
    ]
    base = by.get(("baseline", "nbody"), {})
    text = "- Versor, N-body rollout MSE below a Transformer's (seed: " + PUBLIC_NBODY + "): "
    if not versors or "position_mse_mean" not in base:
        text += "undecided: the Versor or baseline N-body runs did not finish."
    else:
        best = min(versors, key=lambda v: by[(v, "nbody")]["position_mse_mean"])
        row = by[(best, "nbody")]
        mark = verdict(_pair(row, "position_mse"), _pair(base, "position_mse"), False)
        cv = reference["const_velocity_position_mse"] if reference else float("nan")
        numbers = (
            f"best Versor row {label(best)} {format_mean_std(*_pair(row, 'position_mse'), 4)} vs baseline "
            f"{format_mean_std(*_pair(base, 'position_mse'), 4)} (constant velocity {cv:.4f})"
        )
        if base["position_mse_mean"] >= cv and row["position_mse_mean"] >= cv:
            text += f"undecided: neither model beats constant-velocity extrapolation at this budget; {numbers}."
        else:
            text += {
                "better": "reproduced",
                "worse": "not reproduced (Versor worse)",
                "~": "not reproduced (within noise)",
            }[mark] + f": {numbers}."
    lines.append(text)
    # ZPX: phase-coherent retrieval and the centre regulariser improve recall
    zpx = "zpx_full"
    outcomes = []
    for task, metric in (("mqar", "accuracy"), ("passkey", f"{NEEDLE}@1x")):
        a, b = by.get((zpx, task), {}), by.get(("softmax_srpe", task), {})
        if f"{metric}_mean" not in a or f"{metric}_mean" not in b:
            continue
        if baseline_learned(by, task, metric) is False:
            outcomes.append((task, "undecided", "the baseline did not learn it"))
            continue
        ceiling = min(a[f"{metric}_mean"], b[f"{metric}_mean"]) >= 0.99
        mark = verdict(_pair(a, metric), _pair(b, metric), True)
        numbers = f"{format_mean_std(*_pair(a, metric))} vs softmax + SRPE {format_mean_std(*_pair(b, metric))}"
        if mark == "~" and ceiling:
            outcomes.append((task, "undecided", f"both at the ceiling, {numbers}"))
        else:
            words = {"better": "reproduced", "worse": "not reproduced (worse)", "~": "not reproduced (within noise)"}
            outcomes.append((task, words[mark], numbers))
    text = "- ZPX, angle + sphere kernels with the centre loss improve recall over softmax with the same SRPE: "
    if not outcomes:
        text += "undecided: the ZPX or softmax + SRPE recall runs did not finish."
    else:
        text += "; ".join(f"{task} {verdict_word}: {why}" for task, verdict_word, why in outcomes) + "."
    lines.append(text)
    return lines


def _table(header: list[str], rows: list[list[str]], align: str = "---:") -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|---|" + f"{align}|" * (len(header) - 1),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def markdown(
    aggregate: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    widths: dict[str, dict[str, Any]],
    spec: dict[str, Any],
    meta: dict[str, Any],
    variants: Sequence[str],
    tasks: Sequence[str],
    reference: dict[str, Any] | None,
) -> str:
    """The results section: setup, metric table, findings, claims, verdicts, parameter counts, gaps."""
    by = {(r["variant"], r["task"]): r for r in aggregate}
    columns = metric_columns(spec, tasks)
    budgets = "; ".join(
        f"{t} {b['steps']} steps × batch {b['batch']}, lr {b['lr']}, "
        + ", ".join(f"{k} {v}" for k, v in b["params"].items())
        for t, b in spec["budgets"].items()
        if t in tasks
    )
    lines = [
        f"Command: `{meta['command']}` — {meta['date']} — {meta['machine']}. "
        f"{meta['seeds']} seeds, mean ± sample std; {meta['wall_minutes']:.1f} min of training recorded.",
        "",
        f"Budget per run (every variant): {spec['layers']} layers, baseline hidden {spec['hidden']}, "
        f"{spec['heads']} heads; AdamW, warm-up then constant lr, fresh examples every step. {budgets}. "
        f"Accuracy on {spec['eval_examples']} held-out examples ({spec['passkey_eval_examples']} per passkey length; "
        "fixed evaluation seed).",
        "",
    ]
    if meta.get("progress"):
        lines += [meta["progress"], ""]
    failures = {(r["variant"], r["task"]): r["status"] for r in runs if r.get("status", "ok") != "ok"}
    header = ["variant"] + [c[2] + (" ↑" if c[3] else " ↓") for c in columns]
    rows = []
    for variant in variants:
        cells = []
        for task, key, _, _ in columns:
            row = by.get((variant, task), {})
            if f"{key}_mean" in row:
                seeds = "" if row["n"] == meta["seeds"] else f" (n={row['n']})"
                cells.append(format_mean_std(*_pair(row, key), 4 if key == "position_mse" else 3) + seeds)
            else:
                cells.append("not run" if (variant, task) in failures else "-")
        rows.append([label(variant), *cells])
    lines += _table(header, rows)
    if reference and "nbody" in tasks:
        lines += [
            "",
            "N-body references on the same evaluation trajectories: constant-velocity extrapolation position MSE "
            f"{reference['const_velocity_position_mse']:.4f} "
            f"(energy drift {reference['const_velocity_energy_drift']:.3f}); the simulator's own relative energy "
            f"change over the rollout window {reference['simulator_energy_drift']:.4f}. "
            f"Public numbers ({PUBLIC_NBODY}) are on a different scale and are not comparable to these values.",
        ]
    lines += ["", *findings(by, columns, variants, reference), "", *claims(by, spec, reference)]
    if "baseline" in variants:
        rows = []
        for variant in variants:
            if variant == "baseline":
                continue
            cells = []
            for task, key, _, higher in columns:
                a, b = by.get((variant, task), {}), by.get(("baseline", task), {})
                ok = f"{key}_mean" in a and f"{key}_mean" in b
                cells.append(compare(a, b, key, higher) if ok else "-")
            rows.append([label(variant), *cells])
        lines += [
            "",
            "Versus the baseline (`better`/`worse`: the mean gap exceeds the sum of the two stds; `~`: within noise):",
            "",
            *_table(["variant"] + [c[2] for c in columns], rows, "---"),
        ]
    rows = []
    for variant in variants:
        cells = []
        for task in tasks:
            w = widths.get(f"{variant}/{task}")
            cells.append(
                "-"
                if w is None
                else f"{w['hidden']} / {w['intermediate']} / {w['params']:,}{'' if w['matched'] else '*'}"
            )
        rows.append([label(variant), *cells])
    lines += [
        "",
        "Parameter counts (hidden / intermediate / parameters; N-body excludes the unused token embedding; "
        "`*` = outside the ±10% match):",
        "",
        *_table(["variant", *tasks], rows),
    ]
    unmatched = sorted({k.split("/")[0] for k, w in widths.items() if not w["matched"]} & set(variants))
    if unmatched:
        lines += [
            "",
            f"Not parameter-matched: {', '.join(unmatched)}. Versor's grade-wise linear layers hold far fewer weights "
            "than dense ones; its hidden size is capped in this suite size, so these rows are smaller models than "
            "the baseline.",
        ]
    if any(v.endswith(TIME_SUFFIX) for v in variants):
        lines += [
            "",
            "Wall-clock-matched rows train the same model as their parameter-matched row for the baseline's median "
            "training seconds on that task instead of the step budget: more steps than the budget where the model "
            "is faster per step, fewer where it is slower (on a shared machine, so the step count is noisy; "
            "`steps_done` is in the csv).",
        ]
    if failures:
        lines += ["", "Runs that did not complete:", ""]
        lines += [f"- {v} / {t}: {status}" for (v, t), status in sorted(failures.items())]
    return "\n".join(lines) + "\n"


def plots(
    aggregate: list[dict[str, Any]], spec: dict[str, Any], variants: Sequence[str], tasks: Sequence[str], stem: Path
) -> list[Path]:
    """`<stem>_tasks.png` (one bar chart per metric) and `<stem>_passkey.png` (needle answer accuracy vs length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["variant"], r["task"]): r for r in aggregate}
    columns = [c for c in metric_columns(spec, tasks) if not c[1].startswith(f"{NEEDLE}@")]
    paths = []
    if columns:
        cols = min(3, len(columns))
        nrows = math.ceil(len(columns) / cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), dpi=100, squeeze=False)
        for ax, (task, key, text, higher) in zip(axes.flat, columns):
            names, means, stds = [], [], []
            for variant in variants:
                row = by.get((variant, task), {})
                if f"{key}_mean" in row:
                    names.append(variant)
                    means.append(row[f"{key}_mean"])
                    stds.append(row[f"{key}_std"])
            ax.barh(range(len(names)), means, xerr=stds, color="tab:blue", alpha=0.8)
            ax.set_yticks(range(len(names)), names, fontsize=8)
            ax.invert_yaxis()
            ax.set_title(f"{text} ({'higher' if higher else 'lower'} is better)", fontsize=9)
            if means and min(means) > 0 and max(means) / min(means) > 20:
                ax.set_xscale("log")
            ax.grid(axis="x", alpha=0.3)
        for ax in list(axes.flat)[len(columns) :]:
            ax.axis("off")
        fig.tight_layout()
        paths.append(stem.parent / f"{stem.name}_tasks.png")
        fig.savefig(paths[-1])
        plt.close(fig)
    if "passkey" in tasks:
        length = spec["budgets"]["passkey"]["params"]["length"]
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        for variant in variants:
            row = by.get((variant, "passkey"), {})
            xs = [m for m in spec["passkey_multiples"] if f"{NEEDLE}@{m}x_mean" in row]
            if xs:
                ax.errorbar(
                    [m * length for m in xs],
                    [row[f"{NEEDLE}@{m}x_mean"] for m in xs],
                    yerr=[row[f"{NEEDLE}@{m}x_std"] for m in xs],
                    marker="o",
                    capsize=3,
                    label=variant,
                )
        ax.axvline(length, color="gray", linestyle=":", label="trained length")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle answer accuracy")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(stem.parent / f"{stem.name}_passkey.png")
        fig.savefig(paths[-1])
        plt.close(fig)
    return paths


def write_outputs(
    runs: list[dict[str, Any]],
    widths: dict[str, dict[str, Any]],
    spec: dict[str, Any],
    meta: dict[str, Any],
    variants: Sequence[str],
    tasks: Sequence[str],
    reference: dict[str, Any] | None,
    stem: Path,
    figures: bool = True,
) -> str:
    """<stem>.json / .csv / .md (/ *.png) from the per-seed rows; returns the Markdown."""
    variants = [v for v in variants if any(r["variant"] == v for r in runs)]
    tasks = [t for t in tasks if any(r["task"] == t for r in runs)]
    aggregate = summarise(runs)
    payload = {"meta": meta, "widths": widths, "nbody_reference": reference, "aggregate": aggregate, "runs": runs}
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    fields = sorted({k for row in aggregate for k in row}, key=lambda k: (k not in ("variant", "task", "n"), k))
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(aggregate)
    text = markdown(aggregate, runs, widths, spec, meta, variants, tasks, reference)
    if figures:
        paths = plots(aggregate, spec, variants, tasks, stem)
        text += "\n" + "\n".join(f"![{p.stem}](benchmarks/results/{p.name})" for p in paths) + "\n"
    stem.with_suffix(".md").write_text(text)
    return text


# ---- calibration ----------------------------------------------------------------------------------


ALPHABET = {
    "mqar": "keys a-z, values A-Z",
    "passkey": "digits 0-9, capital key letters",
    "selective_copy": "letters a-z among '.'",
    "spiral": "16 x 16 grid cells, 4 class digits",
    "text": "bytes",
    "nbody": "30 real features",
}
BAR = {"mqar": ("accuracy", LEARNED), "selective_copy": ("accuracy", LEARNED), "passkey": (f"{NEEDLE}@1x", LEARNED)}


def calibration_markdown(
    trials: Sequence[dict[str, Any]],
    chosen: dict[str, str],
    baseline_rows: Sequence[dict[str, Any]],
    spec: dict[str, Any],
    lengths: dict[str, int],
    command: str,
    notes: dict[str, str] | None = None,
) -> str:
    """The committed budget per task, the baseline's result at that budget in every seed (the learnability bar),
    and every exploratory trial with its accuracy curve."""
    lines = [
        "Calibration of `--size medium` on this machine (a 2-core CPU shared with other jobs; 1 thread per run). "
        "The baseline is softmax + RoPE (ZPX with both lambdas 0 and rotary RoPE, the Llama-style model). "
        "AdamW, 50 warm-up steps then constant lr, weight decay 0.01, gradient clipping 1, fresh examples every step; "
        f"vocabulary: the 260-token byte tokenizer. Model: {spec['layers']} layers, hidden {spec['hidden']}, "
        f"{spec['heads']} heads.",
        "",
        f"Budget per task (`{command}`) and the baseline at that budget in each seed (bar: answer accuracy ≥ "
        f"{LEARNED} on MQAR, the needle at the trained length and selective copying; well above chance on spiral):",
        "",
    ]
    header = [
        "task",
        "steps × batch",
        "lr",
        "length (tokens)",
        "alphabet",
        "task parameters",
        "baseline per seed",
        "bar",
    ]
    rows = []
    for task, budget in spec["budgets"].items():
        metric, bar = BAR.get(task, ("accuracy", None))
        if task == "text":
            metric = "perplexity"
        elif task == "nbody":
            metric = "position_mse"
        values = [
            r[metric] for r in sorted(baseline_rows, key=lambda r: r["seed"]) if r["task"] == task and metric in r
        ]
        shown = ", ".join(f"{v:.3f}" if metric != "position_mse" else f"{v:.4f}" for v in values) or "not run yet"
        if task == "spiral" and values:
            verdict_text = "above chance (0.25)" if min(values) > 0.4 else "near chance"
        elif bar is None or not values:
            verdict_text = "-" if bar is None else "pending"
        else:
            verdict_text = f"met in {sum(v >= bar for v in values)}/{len(values)} seeds"
        params = ", ".join(f"{k}={v}" for k, v in budget["params"].items())
        rows.append(
            [
                task,
                f"{budget['steps']} × {budget['batch']}",
                str(budget["lr"]),
                str(lengths[task]),
                ALPHABET[task],
                params,
                f"{metric}: {shown}",
                verdict_text,
            ]
        )
    lines += _table(header, rows, "---")
    lines += [
        "",
        "Exploratory trials (baseline, seed 0 unless noted; accuracy on 256 held-out examples every 100 steps, "
        "stopped after two probes ≥ 0.95):",
        "",
    ]
    header = ["task", "setting", "seed", "model", "batch", "lr / wd", "first step ≥ 0.9", "curve (step: acc)", "s/step"]
    rows = []
    for r in sorted(trials, key=lambda r: (r["task"], r["trial"] != chosen.get(r["task"]), r["trial"], r["seed"])):
        b, m = r["budget"], r["model"]
        mark = " (chosen)" if chosen.get(r["task"]) == r["trial"] else ""
        rows.append(
            [
                r["task"],
                f"`{r['trial']}`{mark}: {r['why']}",
                str(r["seed"]),
                f"{m['layers']}L h{m['hidden']} {m['heads']}H",
                str(b["batch"]),
                f"{b['lr']} / {b['weight_decay']}",
                str(r["first_step_at_0.9"]) if r["first_step_at_0.9"] is not None else "not reached",
                ", ".join(f"{step}: {acc:.2f}" for step, acc, *_ in r["curve"]),
                f"{r['seconds_per_step']:.2f}",
            ]
        )
    lines += _table(header, rows, "---")
    if notes:
        lines += ["", "Notes:", "", *(f"- {task}: {note}" for task, note in notes.items())]
    commands = sorted({r["command"] for r in trials})
    lines += ["", "Trial commands:", "", *(f"- `{c}`" for c in commands)]
    return "\n".join(lines) + "\n"


def render_calibration(
    trials_file: Path,
    stem: Path,
    chosen: dict[str, str],
    baseline_rows: Sequence[dict[str, Any]],
    spec: dict[str, Any],
    lengths: dict[str, int],
    command: str,
    notes: dict[str, str] | None = None,
) -> str:
    """calibration_<size>.json / .md from the trial lines and the suite's baseline rows."""
    trials = [json.loads(line) for line in trials_file.read_text().splitlines() if line.strip()]
    payload = {"chosen": chosen, "budgets": spec["budgets"], "baseline_runs": list(baseline_rows), "trials": trials}
    payload["notes"] = notes or {}
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    text = calibration_markdown(trials, chosen, baseline_rows, spec, lengths, command, notes)
    stem.with_suffix(".md").write_text(text)
    return text


__all__ = [
    "claims",
    "findings",
    "markdown",
    "metric_columns",
    "plots",
    "render_calibration",
    "summarise",
    "verdict",
    "write_outputs",
]


# ---- the evidence suite (--size evidence) ------------------------------------------------------------------

# Seed claims, quoted as the seeds state them (seeds 003 and 004; no ± values there)
SEED_PCT = (
    "PCT 1.000 vs Softmax Transformer 0.583 on needle-in-a-haystack retrieval at 16K tokens (LRA: 1.000 vs 0.821)"
)
SEED_VERSOR = (
    "chaotic N-body MSE: Versor 5.21 (0.007M parameters, energy drift 133.0%), Transformer (d=128) 6.61 "
    "(1.320M, 381.1%), GATr 8.32 (~0.1M, 173.8%)"
)
EVIDENCE_LABELS = {
    **VARIANT_LABELS,
    "pct_tuned": "PCT, tuned over its scale options",
}
# (title, tasks, variants) of each evidence table; the Holm correction runs over all comparisons of one table
EVIDENCE_TABLES = [
    (
        "Headline: MQAR, the needle at its trained length and beyond (extrapolation), N-body",
        ("mqar", "passkey", "nbody"),
        ("baseline", "softmax_srpe", "zpx_full", "pct", "pct_tuned", "versor_hybrid"),
    ),
    (
        "Same-length needle: trained and tested at one long length (the PCT paper's setting)",
        ("passkey_long",),
        ("baseline", "zpx_full", "pct", "pct_tuned"),
    ),
    (
        "Seed 000's ZPX ladder (angle only, + sphere, + centre loss, + SRPE) on MQAR and the needle",
        ("mqar", "passkey"),
        ("baseline", "zpx_angle", "zpx_angle_sphere", "zpx_center", "zpx_full", "softmax_srpe"),
    ),
    (
        "LRA ListOps (Long Range Arena: the value of a nested MAX / MIN / MED / SM expression, chance 0.1)",
        ("listops",),
        ("baseline", "softmax_srpe", "zpx_full", "pct", "pct_tuned"),
    ),
    (
        "Spiral (geometry)",
        ("spiral",),
        (
            "baseline",
            "softmax_srpe",
            "zpx_angle",
            "zpx_angle_sphere",
            "zpx_center",
            "zpx_full",
            "pct",
            "pct_tuned",
            "versor_hybrid",
        ),
    ),
]
NBODY_TEST_KEYS = ("position_mse", "energy_drift")


def evidence_columns(spec: dict[str, Any], task: str, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metric columns of a task: key, label, higher-is-better, and the per-example hits (bits/shape keys)."""
    if task in ("passkey", "passkey_long"):
        length = spec["budgets"][task]["params"]["length"]
        multiples = spec["passkey_multiples"] if task == "passkey" else [1]
        return [
            {
                "key": f"{NEEDLE}@{m}x",
                "label": f"needle acc @{m}x ({m * length})" if task == "passkey" else f"needle acc @{length}",
                "higher": True,
                "bits": f"passkey_bits@{m}x",
                "shape": f"passkey_shape@{m}x",
            }
            for m in multiples
        ]
    if task == "nbody":
        present = [k for k in NBODY_TEST_KEYS if any(k in r for r in rows)] or list(NBODY_TEST_KEYS)
        extra = sorted(
            {
                k
                for r in rows
                for k, v in r.items()
                if isinstance(v, float)
                and "mse" in k
                and not k.startswith("val_")
                and k not in NBODY_TEST_KEYS
                and k != "state_mse"
            }
        )
        return [
            {"key": k, "label": f"N-body {k}", "higher": False, "bits": None, "shape": None} for k in present + extra
        ]
    (key, name, higher), *_ = METRICS[task]
    return [
        {
            "key": key,
            "label": name,
            "higher": higher,
            "bits": "bits" if task != "text" else None,
            "shape": "shape",
        }
    ]


def _hits(row: dict[str, Any], column: dict[str, Any]):
    """A row's per-example evaluation as [examples, answers] (hits or per-trajectory errors), or None."""
    import numpy as np
    from ablation_stats import decode_bits

    if column["bits"] and column["bits"] in row:
        shape = row[column["shape"]]
        return decode_bits(row[column["bits"]], shape[0] * shape[1]).reshape(shape)
    per = row.get(f"{column['key']}_per_trajectory")
    if isinstance(per, list):
        return np.asarray(per, float)[:, None]
    return None


def compare_rows(a: Sequence[dict], b: Sequence[dict], column: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Welch's test over seeds of a variant's rows vs the baseline's, and the bootstrap interval of the gap over
    seeds x evaluation examples where both sides stored per-example results."""
    from ablation_stats import bootstrap_diff, welch

    key = column["key"]
    va, vb = [r[key] for r in a if key in r], [r[key] for r in b if key in r]
    result = {**welch(va, vb), "n": (len(va), len(vb))}
    ha, hb = [_hits(r, column) for r in a if key in r], [_hits(r, column) for r in b if key in r]
    if va and vb and all(h is not None for h in ha + hb) and len({h.shape for h in ha + hb}) == 1:
        result["ci"] = bootstrap_diff(ha, hb, seed=seed)
    return result


def _cell_text(rows: Sequence[dict], key: str, digits: int, planned: int, chosen: dict | None) -> str:
    import statistics as st

    values = [r[key] for r in rows if key in r]
    if not values:
        return "-"
    mean = st.mean(values)
    std = st.stdev(values) if len(values) > 1 else float("nan")
    text = format_mean_std(mean, std, digits)
    if 0 < abs(mean) < 10**-digits:  # one-step N-body errors (~6e-9) would print as 0.0000 ± 0.0000
        text = f"{mean:.2e}" + ("" if math.isnan(std) else f" ± {std:.1e}")
    extra = [] if len(values) == planned else [f"n={len(values)}/{planned}"]
    if chosen:
        extra.append(
            f"lr {chosen['lr']:g}" + (f", {chosen['variant']}" if chosen["variant"] != rows[0]["variant"] else "")
        )
    return text + (f" ({'; '.join(extra)})" if extra else "")


CALIBRATION_TRIALS = Path(__file__).resolve().parent / "results" / "calibration_trials.jsonl"


def long_needle_calibration(spec: dict, path: Path = CALIBRATION_TRIALS) -> list[str]:
    """The baseline's calibration trials of the needle longer than the extrapolation protocol's training length
    (ablation_calibrate.py): how far its budget is from learning at long lengths, beside the same-length table."""
    from ablation_runs import read_rows

    if "passkey" not in spec["budgets"]:
        return []
    needle = dict(spec["budgets"]["passkey"]["params"])
    trained = needle.pop("length")

    def same_format(r: dict) -> bool:  # the suite's needle format at another length
        params = dict(r["budget"]["params"])
        return r["task"] == "passkey" and params.pop("length") > trained and params == needle

    trials = [r for r in read_rows(path) if same_format(r)]
    if not trials:
        return []
    parts = [
        f"`{r['trial']}` ({r['budget']['params']['length']} tokens, batch {r['budget']['batch']}, lr "
        f"{r['budget']['lr']:g}, seed {r['seed']}): best {max(a for _, a, *_ in r['curve']):.3f}, final "
        f"{r['curve'][-1][1]:.3f} after {r['steps_done']:,} steps"
        for r in trials
    ]
    return [
        "Calibration of this protocol (the baseline alone, `benchmarks/ablation_calibrate.py`, answer accuracy on "
        "held-out needles of the suite's format along training, chance 0.1): "
        + "; ".join(parts)
        + ". The baseline does not learn the long needle in these budgets, so a variant that does beats it; one "
        "at chance is not evidence against that variant."
    ]


def learned_nothing_columns(rows_of: dict, columns: Sequence[tuple[str, dict]]) -> dict[tuple[str, str], str]:
    """(task, column key) -> a note, for each needle column on which every variant is right and wrong on exactly
    the same test examples, seed by seed: different models agreeing example by example have learned nothing (the
    note gives their training loss beside a uniform guess's), so that column's verdicts compare non-learners."""
    notes = {}
    for task, column in columns:
        if not column["key"].startswith("passkey_digit_acc@"):
            continue
        bits_key = column["key"].replace("passkey_digit_acc@", "passkey_bits@")
        rows = {v: rs for (v, t), rs in rows_of.items() if t == task and rs}
        by_seed: dict[int, dict[str, str]] = {}
        for v, rs in rows.items():
            for r in rs:
                if bits_key in r:
                    by_seed.setdefault(r["seed"], {})[v] = r[bits_key]
        alike = all(len(s) == len(rows) and len(set(s.values())) == 1 for s in by_seed.values())
        if len(rows) < 2 or not by_seed or not alike:
            continue
        losses = [r["final_train_loss"] for rs in rows.values() for r in rs if "final_train_loss" in r]
        loss = f", at a final training loss of {min(losses):.2f}-{max(losses):.2f}" if losses else ""
        notes[(task, column["key"])] = (
            f"{column['label']}: every variant is right and wrong on exactly the same test examples in every seed "
            f"(identical per-example results){loss} against ln 10 = {math.log(10):.2f} for a uniform guess over the "
            "digits: no model learned the task in this budget, and the verdicts on this column compare models that "
            "learned nothing."
        )
    return notes


def _delta_text(r: dict) -> str:
    """Δ and its bootstrap interval: 3 decimals, or 2 significant digits in scientific notation where all of them
    are below 0.01 (N-body MSE gaps of ~1e-3 would print as -0.001 [-0.002, -0.001])."""
    values = [x for x in (r["diff"], *r.get("ci", ())) if not math.isnan(x)]
    scale = max((abs(x) for x in values), default=0.0)
    fmt = "+.1e" if 0 < scale < 0.01 else "+.3f"
    ci = f" [{r['ci'][0]:{fmt}}, {r['ci'][1]:{fmt}}]" if "ci" in r else ""
    return f"Δ {'n/a' if math.isnan(r['diff']) else format(r['diff'], fmt)}{ci}"  # n/a: a single seed


def _fmt_p(p: float) -> str:
    return "p n/a" if math.isnan(p) else (f"p={p:.3f}" if p >= 0.001 else "p<0.001")


def evidence_tables(done: dict, cells: Sequence[Any], spec: Any, plan: Any) -> tuple[list[str], dict[str, Any]]:
    """Markdown of every evidence table (values, then verdicts with Holm-adjusted p and bootstrap intervals) and
    the verdicts by (table, variant, column) for the claims."""
    from ablation_stats import holm, verdict_word

    spec_dict = asdict_spec(spec)
    by_cell = {(c.name, c.task): c for c in cells}
    lines: list[str] = []
    verdicts: dict[str, Any] = {}
    for title, tasks, variants in EVIDENCE_TABLES:
        present = [(v, t) for t in tasks for v in variants if (v, t) in by_cell]
        if not present:
            continue
        rows_of = {(v, t): plan.cell_seed_rows(by_cell[(v, t)], done, spec) for v, t in present}
        chosen_of = {(v, t): plan.select(by_cell[(v, t)], done, spec) for v, t in present}
        columns = []
        for t in (t for t in tasks if any((v, t) in by_cell for v in variants)):
            rows = [r for (v, tt), rs in rows_of.items() if tt == t for r in rs]
            columns += [(t, c) for c in evidence_columns(spec_dict, t, rows)]
        names = [v for v in variants if any((v, t) in by_cell for t in tasks)]
        header = ["variant"] + [c["label"] + (" ↑" if c["higher"] else " ↓") for _, c in columns]
        body = []
        for v in names:
            cellsrow = []
            for t, c in columns:
                if (v, t) not in by_cell:
                    cellsrow.append("-")
                    continue
                chosen = chosen_of[(v, t)]
                digits = 4 if "mse" in c["key"] else 3
                if chosen and chosen.get("failed"):
                    cellsrow.append("every lr failed")
                else:
                    cellsrow.append(_cell_text(rows_of[(v, t)], c["key"], digits, by_cell[(v, t)].seeds, chosen))
            body.append([EVIDENCE_LABELS.get(v, v), *cellsrow])
        lines += [f"### {title}", "", *_table(header, body)]
        untrained = learned_nothing_columns(rows_of, columns)
        notes = [*untrained.values()]
        notes += long_needle_calibration(spec_dict) if tasks == ("passkey_long",) else []
        for note in notes:
            lines += ["", note]
        # comparisons vs the baseline, Holm over the whole table
        tests = []
        for v in names:
            if v == "baseline":
                continue
            for t, c in columns:
                if (v, t) in by_cell and ("baseline", t) in by_cell:
                    a, b = rows_of[(v, t)], rows_of[("baseline", t)]
                    if a and b:
                        tests.append((v, t, c, compare_rows(a, b, c)))
        adjusted = holm([r["p"] for *_, r in tests])
        table: dict[tuple[str, str], str] = {}
        for (v, t, c, r), p_adj in zip(tests, adjusted):
            r["p_holm"] = p_adj
            r["learned_nothing"] = (t, c["key"]) in untrained
            r["verdict"] = verdict_word(r["diff"], p_adj, c["higher"]) if min(r["n"]) >= 2 else "too few seeds"
            ci = f"; {_delta_text(r)}" if "ci" in r or not math.isnan(r["diff"]) else ""
            table[(v, c["label"])] = f"{r['verdict']} (Holm {_fmt_p(p_adj)}{ci})"
            verdicts[f"{title}|{v}|{c['key']}|{t}"] = r
        if tests:
            body = [
                [EVIDENCE_LABELS.get(v, v), *(table.get((v, c["label"]), "-") for _, c in columns)]
                for v in names
                if v != "baseline"
            ]
            lines += [
                "",
                f"Versus the baseline ({len(tests)} comparisons; Welch's t-test over seeds, Holm-corrected over this "
                "table, α = 0.05; Δ = variant − baseline with its 95% bootstrap interval over seeds × evaluation "
                "examples where the rows store per-example results):",
                "",
                *_table(["variant"] + [c["label"] for _, c in columns], body, "---"),
            ]
        lines.append("")
    return lines, verdicts


def asdict_spec(spec: Any) -> dict[str, Any]:
    from dataclasses import asdict, is_dataclass

    return asdict(spec) if is_dataclass(spec) else spec


def _claim(verdicts: dict, table: str, variant: str, key: str, task: str) -> str:
    r = verdicts.get(f"{table}|{variant}|{key}|{task}")
    if r is None:
        return "undecided (not run yet)"
    text = f"{r['verdict']} (Holm {_fmt_p(r['p_holm'])}, {_delta_text(r)}, n = {r['n'][0]} vs {r['n'][1]})"
    return text + (" — but no variant learned this task, the baseline included" if r.get("learned_nothing") else "")


def _versor_match(widths: dict, task: str) -> str:
    """How Versor's size compares with the baseline's on `task`: matched (±10%) or not, with both counts."""
    versor, base = widths.get(f"versor_hybrid/{task}"), widths.get(f"baseline/{task}")
    if not versor or not base:
        return "parameter counts not recorded"
    counts = f"{versor['params']:,} vs the baseline's {base['params']:,} parameters"
    if versor["matched"]:
        return f"parameter-matched, {counts}"
    return f"NOT parameter-matched: Versor at its width cap (hidden {versor['hidden']}) has {counts}"


def evidence_claims(
    verdicts: dict, spec: Any, reference: dict[str, Any] | None, widths: dict | None = None
) -> list[str]:
    """Each seed's claim as the seed states it, and what the corrected tests of this suite say about it."""
    head, same = EVIDENCE_TABLES[0][0], EVIDENCE_TABLES[1][0]
    lra = next(title for title, tasks, _ in EVIDENCE_TABLES if tasks == ("listops",))
    longest = max(spec.passkey_multiples)
    nbody_key = next(
        (k.split("|")[2] for k in verdicts if k.startswith(f"{head}|versor_hybrid|") and k.endswith("|nbody")),
        "position_mse",
    )
    cv = f"{reference['const_velocity_position_mse']:.4f}" if reference else "n/a"
    widths = widths or {}
    import ablation_plan

    options = len(ablation_plan.members("pct_tuned")) > 1  # a PCT scale option in ablation_models.VARIANTS

    def tuned(table: str, key: str, task: str) -> str:
        return (
            f"; PCT tuned over its scale options {_claim(verdicts, table, 'pct_tuned', key, task)}" if options else ""
        )

    return [
        "Seed claims, as the seeds state them, and this suite's corrected verdicts (variant vs the baseline):",
        "",
        f'- PCT (seed 003): "{SEED_PCT}". Not testable on CPU at 16K tokens (`--size full`). Here: trained at '
        f"{spec.budgets['passkey'].params['length'] if 'passkey' in spec.budgets else 'n/a'} tokens, tested at "
        f"{longest}x — PCT with package defaults {_claim(verdicts, head, 'pct', f'{NEEDLE}@{longest}x', 'passkey')}"
        f"{tuned(head, f'{NEEDLE}@{longest}x', 'passkey')}. At the trained length: PCT defaults "
        f"{_claim(verdicts, head, 'pct', f'{NEEDLE}@1x', 'passkey')}{tuned(head, f'{NEEDLE}@1x', 'passkey')}. "
        f"Trained and tested at "
        f"{spec.budgets['passkey_long'].params['length'] if 'passkey_long' in spec.budgets else 'n/a'} tokens: PCT "
        f"defaults {_claim(verdicts, same, 'pct', f'{NEEDLE}@1x', 'passkey_long')}"
        f"{tuned(same, f'{NEEDLE}@1x', 'passkey_long')}."
        + ("" if options else " (No PCT scale option is listed in ablation_models.VARIANTS, so no `pct_tuned` cell.)")
        + (
            f" LRA (the seed names no LRA task; here ListOps, expressions of < "
            f"{spec.budgets['listops'].params['max_length']} tokens): PCT defaults "
            f"{_claim(verdicts, lra, 'pct', 'accuracy', 'listops')}{tuned(lra, 'accuracy', 'listops')}."
            if "listops" in spec.budgets
            else ""
        ),
        f'- Versor (seed 004): "{SEED_VERSOR}" (the paper\'s own scale; no ± given). Here (Versor hidden '
        f"searched up to {spec.versor_max_hidden}; {_versor_match(widths, 'nbody')}): N-body {nbody_key} "
        f"{_claim(verdicts, head, 'versor_hybrid', nbody_key, 'nbody')} "
        f"(constant-velocity extrapolation: {cv}). Recall ({_versor_match(widths, 'mqar')}): MQAR "
        f"{_claim(verdicts, head, 'versor_hybrid', 'accuracy', 'mqar')}; the needle at the trained length "
        f"{_claim(verdicts, head, 'versor_hybrid', f'{NEEDLE}@1x', 'passkey')}.",
        "- ZPX (seed 000): the seed makes no performance claim; it prescribes a stepwise ablation (baseline, angle "
        "only, + sphere, + centre loss) on geometry, physics and spiral tasks. That ladder is the table above; no "
        "claim is checked.",
    ]


def nbody_reference_lines(done: dict, cells: Sequence[Any], spec: Any, plan: Any, reference: dict) -> list[str]:
    """The trivial predictors beside each N-body column, and where every variant sits between them: a zero-shot
    test on which all models score like the static-positions predictor measures no inference."""
    r = reference
    text = (
        "N-body references on the test trajectories (trivial predictors, no training): rollout position MSE "
        f"constant velocity {r['const_velocity_position_mse']:.4f}, static positions {r['static_position_mse']:.4f}; "
        f"one-step constant velocity {r['const_velocity_onestep_position_mse']:.2e}; energy drift constant velocity "
        f"{r['const_velocity_energy_drift']:.3f}, the simulator itself {r['simulator_energy_drift']:.4f}."
    )
    if "mass10_const_velocity_position_mse" in r:
        text += (
            f" 10x mass: constant velocity {r['mass10_const_velocity_position_mse']:.4f}, static "
            f"{r['mass10_static_position_mse']:.4f}. Hidden velocity: static positions "
            f"{r['hidden_velocity_static_position_mse']:.4f}, constant velocity from the last two positions "
            f"{r['hidden_velocity_const_velocity_position_mse']:.4f}. The paper's third zero-shot test (trained on 5 "
            "bodies, tested on 3 / 7) is not run: a token here is one time step of all bodies, a fixed input size "
            "for every model, Versor's included, and the test needs one token per body."
        )
    means = {}
    for cell in cells:
        rows = plan.cell_seed_rows(cell, done, spec) if cell.task == "nbody" else []
        values = [x["hidden_velocity_position_mse"] for x in rows if "hidden_velocity_position_mse" in x]
        if values:
            means[cell.name] = sum(values) / len(values)
    if means and "hidden_velocity_static_position_mse" in r:
        static, cv = r["hidden_velocity_static_position_mse"], r["hidden_velocity_const_velocity_position_mse"]
        lo, hi = min(means.values()), max(means.values())
        share = [(static - m) / (static - cv) for m in means.values()]  # 0: static, 1: finite-difference velocity
        text += (
            f" On the hidden-velocity test the variants score {lo:.4f}-{hi:.4f}, "
            f"{min(share):.0%}-{max(share):.0%} of the way from static positions to the finite-difference "
            "predictor"
            + (
                ": none infers the momentum from the position history; its verdicts compare rollouts that all stay "
                "at the static predictor's level."
                if max(share) < 0.1
                else "."
            )
        )
    return [text, ""]


def curve_plot(done: dict, cells: Sequence[Any], spec: Any, plan: Any, stem: Path) -> Path | None:
    """Validation metric against training steps and against training FLOPs (mean over the selected setting's seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = [t for t in ("mqar", "passkey", "passkey_long", "spiral", "listops") if any(c.task == t for c in cells)]
    data = {}
    for cell in cells:
        if cell.task not in tasks:
            continue
        rows = [r for r in plan.cell_seed_rows(cell, done, spec) if r.get("val_curve")]
        if rows:
            steps = [s for s, _ in rows[0]["val_curve"]]
            values = np.mean(
                [[v for _, v in r["val_curve"]] for r in rows if len(r["val_curve"]) == len(steps)], axis=0
            )
            flops = np.asarray(steps) * rows[0].get("flops_per_step", float("nan"))
            data[(cell.name, cell.task)] = (steps, flops, values)
    if not data:
        return None
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.4 * len(tasks)), dpi=100, squeeze=False)
    for i, task in enumerate(tasks):
        for (name, t), (steps, flops, values) in data.items():
            if t == task:
                axes[i, 0].plot(steps, values, marker="o", label=name)
                axes[i, 1].plot(flops, values, marker="o", label=name)
        axes[i, 0].set_xlabel("training steps")
        axes[i, 1].set_xlabel("training FLOPs (flop_counter, one step x steps)")
        axes[i, 1].set_xscale("log")
        for ax in axes[i]:
            ax.set_ylabel(f"{task} validation acc")
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
        axes[i, 0].legend(fontsize=7)
    fig.tight_layout()
    path = stem.parent / f"{stem.name}_curves.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def superseded_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every row of an earlier protocol with its results: grouped by (source, protocol, budget, variant, task)."""
    import statistics as st

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (
            r.get("source", "this file"),
            r.get("protocol", "") or "-",
            r["task"],
            r.get("budget", "-"),
            r["variant"] + (f" (revision {r['variant_revision']})" if "variant_revision" in r else ""),
        )
        groups.setdefault(key, []).append(r)
    if not groups:
        return []
    body = []
    for (source, protocol, task, budget, variant), rs in sorted(groups.items()):
        ok = [r for r in rs if r.get("status") == "ok"]
        metrics = []
        for key in ("accuracy", f"{NEEDLE}@1x", f"{NEEDLE}@8x", "position_mse", "perplexity"):
            values = [r[key] for r in ok if key in r]
            if values:
                metrics.append(
                    f"{key} {st.mean(values):.4g}" + (f" ± {st.stdev(values):.2g}" if len(values) > 1 else "")
                )
        lrs = sorted({r.get("lr", "budget") for r in rs}, key=str)
        body.append(
            [
                source,
                protocol,
                task,
                budget,
                variant,
                f"{len(ok)}/{len(rs)}",
                ", ".join(map(str, lrs)),
                "; ".join(metrics) or "-",
            ]
        )
    return [
        "### Superseded protocols (kept with their results)",
        "",
        "Rows of earlier protocols: the medium suite (lr 1e-3 for every variant, 3 seeds, 64 needles per length, "
        "no validation split; its needle format changed twice, each budget fingerprint is one format) and rows of "
        "this file under another budget, protocol or variant revision (`pct` rows without a revision ran PCT's "
        "defaults version 2, tau learned in log space from 20). Not used for any verdict above.",
        "",
        *_table(
            ["source", "protocol", "task", "budget", "variant", "ok/rows", "lr", "mean (± std over seeds)"], body, "---"
        ),
        "",
    ]


def gpu_plan_markdown(spec: Any, cells: Sequence[Any]) -> list[str]:
    """The size of a plan not yet run: runs, budget and training tokens per task (`ablation_plan.training_tokens`)."""
    import ablation_plan as plan
    from ablation_runs import task_seq_len

    sized = plan.training_tokens(cells, spec)
    body = []
    for task, (runs, tokens) in sized.items():
        budget = spec.budgets[task]
        shape = f"{budget.steps:,} × {budget.batch} × {task_seq_len(task, budget.params):,}"
        body.append([task, f"{runs}", shape, f"{tokens:.2e}"])
    runs, tokens = sum(r for r, _ in sized.values()), sum(t for _, t in sized.values())
    body.append(["all", f"{runs}", "", f"{tokens:.2e}"])
    return [
        f"Its size ({spec.layers} layers, baseline hidden {spec.hidden}; tiers 0-{max(c.tier for c in cells)}, the "
        "command's default; training tokens = steps × batch × padded example length, summed over the planned runs):",
        "",
        *_table(["task", "runs", "steps × batch × tokens", "training tokens"], body, "---"),
        "",
    ]


def write_evidence(
    done: dict,
    cells: Sequence[Any],
    spec: Any,
    widths: dict,
    meta: dict,
    superseded: Sequence[dict],
    reference: dict[str, Any] | None,
    stem: Path,
    figures: bool = True,
    gpu_plan: tuple[Any, Sequence[Any]] | None = None,
) -> str:
    """<stem>.md / .json (/ _curves.png) of the evidence suite from its rows; returns the Markdown. `gpu_plan`:
    the `--size full` spec and cells, sized in the "Still needs a GPU" section."""
    import ablation_plan as plan
    from ablation_runs import EVAL_SEED, VAL_SEED

    state = plan.progress(cells, done, spec)
    tiers = sorted({c.tier for c in cells})
    complete = {t: sum(1 for c in state["complete"] if c.tier == t) for t in tiers}
    total = {t: sum(1 for c in cells if c.tier == t) for t in tiers}
    commits = sorted({(r.get("commit", "unknown")[:10], bool(r.get("dirty"))) for r in done.values()})
    lines = [
        f"Command: `{meta['command']}` — report rendered {meta['date']} — {meta['machine']}. "
        f"Protocol `{spec.protocol}`; "
        "commits of the rows: " + (", ".join(f"{c}{' (dirty)' if d else ''}" for c, d in commits) or "none yet") + ".",
        "",
        f"**Progress: {state['done']} of {state['planned']} planned runs done; cells complete: "
        + ", ".join(f"tier {t} {complete[t]}/{total[t]}" for t in tiers)
        + ("." if state["done"] >= state["planned"] else ". The suite is incomplete; rerun the command to resume.")
        + f"** Plan {meta.get('estimate', '')}.",
        "",
        f"Protocol: every variant and task at lr ∈ {{{', '.join(f'{lr:g}' for lr in spec.lrs)}}} with seed 0 "
        "(`pct_tuned`, planned when PCT scale options are listed in ablation_models.VARIANTS: every PCT variant at "
        "every lr); the setting with the best "
        f"validation metric ({spec.val_examples} examples at the trained length, data seed {VAL_SEED}) is selected "
        f"and trained with seeds 1 .. n-1; test numbers are at the selected setting on {spec.eval_examples} held-out "
        f"examples ({spec.passkey_eval_examples} per needle length; data seed {EVAL_SEED}; training batches come "
        "from seeds ≥ 1,000,003, so the three never meet). Seeds: 5 for the headline cells (tier 0), 3 for Versor "
        "on the needle and the ZPX ladder, 2 for the same-length needle and spiral. Validation accuracy is "
        f"recorded at {', '.join(f'{f:g}' for f in spec.checkpoints)} of the step budget (curves). Training FLOPs: "
        "torch.utils.flop_counter on one training step (forward + backward; matrix products and attention, "
        "elementwise ops not counted) times the steps. N-body: selection on the row's `val_*` metric when the "
        "N-body protocol provides one (else on the test metric, flagged in the selection table). Model: "
        f"{spec.layers} layers, baseline hidden {spec.hidden}, {spec.heads} heads, parameter-matched ±10% (Versor "
        f"hidden searched up to {spec.versor_max_hidden}).",
        "",
    ]
    table_lines, verdicts = evidence_tables(done, cells, spec, plan)
    lines += table_lines
    lines += evidence_claims(verdicts, spec, reference, widths) + [""]
    if reference:
        lines += nbody_reference_lines(done, cells, spec, plan, reference)
    body = []
    for cell in cells:
        chosen = plan.select(cell, done, spec)
        grid = (
            "-"
            if not chosen
            else ", ".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in chosen["grid"].items())
        )
        picked = (
            "pending"
            if not chosen
            else "every run failed"
            if chosen["failed"]
            else f"{chosen['variant']} @ lr {chosen['lr']:g}"
            + (" (on TEST: no val key)" if chosen["source"] != "val" else "")
        )
        body.append([f"{cell.name} / {cell.task}", str(cell.tier), grid, picked])
    lines += [
        "### lr selection (validation metric of seed 0 per setting)",
        "",
        *_table(["cell", "tier", "grid", "selected"], body, "---"),
        "",
    ]
    body = [
        [
            EVIDENCE_LABELS.get(k.split("/")[0], k.split("/")[0]),
            k.split("/")[1],
            f"{w['hidden']} / {w['intermediate']} / {w['params']:,}{'' if w['matched'] else '*'}",
        ]
        for k, w in sorted(widths.items())
    ]
    lines += [
        "Parameter counts (hidden / intermediate / parameters; `*` outside ±10%):",
        "",
        *_table(["variant", "task", "widths"], body, "---"),
        "",
    ]
    failed = [r for r in done.values() if r.get("status") != "ok"]
    if failed:
        lines += ["Runs that failed (not candidates for selection):", ""]
        lines += [f"- {r['variant']} / {r['task']} seed {r['seed']} lr {r.get('lr')}: {r['status']}" for r in failed]
        lines.append("")
    lines += [
        "### Still needs a GPU",
        "",
        "The seeds' own settings do not fit a 2-core CPU: the 16K-token needle (seed 003), LRA (seed 003; here "
        "ListOps), and the full model size. `--size full` is this protocol at that scale: 4 layers, "
        "the lr grid, 5 headline seeds, the needle trained at 2,048 tokens and tested at 1-8x (to 16,384) and "
        "trained and tested at 16,384 tokens, MQAR with 12 pairs, N-body on 2,048 training trajectories, and LRA "
        "ListOps generated as LRA generates it (500 < tokens < 2,000, depth 10, up to 10 arguments; 5,000 steps × "
        "batch 32) for the attention variants. Run it with `python benchmarks/ablation.py --size full --device "
        "cuda --workers 1` (`--tasks listops` for ListOps alone); it has not been run (no GPU here), so its wall "
        "time is not measured.",
        "",
    ]
    if gpu_plan is not None:
        lines += gpu_plan_markdown(*gpu_plan)
    lines += superseded_markdown(superseded)
    text = "\n".join(lines) + "\n"
    if figures:
        path = curve_plot(done, cells, spec, plan, stem)
        if path:
            text += f"\n![{path.stem}](benchmarks/results/{path.name})\n"
    payload = {
        "meta": meta,
        "size": asdict_spec(spec),
        "selection": {f"{c.name}/{c.task}": plan.select(c, done, spec) for c in cells},
        "verdicts": {k: {kk: vv for kk, vv in v.items()} for k, v in verdicts.items()},
        "nbody_reference": reference,
        "runs": list(done.values()),
    }
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    stem.with_suffix(".md").write_text(text)
    return text
