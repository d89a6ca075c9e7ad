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
}
CHANCE = {"mqar": 1 / 26, "selective_copy": 1 / 26, "spiral": 0.25}
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
