"""The evidence suite's report: the claim families declared in the plan, per-cell tables over the reported seeds,
verdicts by family (Welch with its family-corrected interval, exact tests beside it), the seed claims, the N-body
references, the protocol audit (`audit`), lr selection, parameter counts, curves, and superseded rows listed.

Pure functions of the result rows (no training): `python -m benchmarks.evidence --size evidence --report`
re-renders results/ablation_evidence.{md,json} and the curve plot from the committed jsonl. The superseded
protocols' reports (ablation_small, ablation_medium, calibration_medium) are frozen files, not rendered here
(docs/evidence_superseded.md); their rows are listed in this report's last table.
"""

from __future__ import annotations

import json
import math
import statistics as st
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.evidence import audit, plan
from benchmarks.evidence.audit import markdown_table
from benchmarks.evidence.nbody import SELECT_ON, select_rule
from benchmarks.evidence.protocol import EVAL_SEED, SELECT_SEED, VAL_SEED
from benchmarks.evidence.rows import CALIBRATION_TRIALS, read_rows
from benchmarks.evidence.stats import (
    ALPHA,
    mann_whitney_exact,
    permutation_test,
    verdict_word,
    welch,
    welch_interval,
)
from benchmarks.evidence.tasks import task_seq_len
from zpx_hf_train.metrics import format_mean_std

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


METRICS = {
    "mqar": [("accuracy", "MQAR acc", True)],
    "selective_copy": [("accuracy", "sel. copy acc", True)],
    "spiral": [("accuracy", "spiral acc", True)],
    "text": [("perplexity", "text ppl/byte", False)],
    "nbody": [("position_mse", "N-body pos MSE", False), ("energy_drift", "N-body dE/E", False)],
    "listops": [("accuracy", "ListOps acc", True)],
}


# The needle's answer accuracy (per answer digit, as MQAR's per answer token); exact match is kept in csv/json.
NEEDLE = "passkey_digit_acc"


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


# (title, tasks, variants) of each evidence table of values; verdicts are by claim family (plan.comparison_families)
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


def _cell_text(rows: Sequence[dict], key: str, digits: int, planned: int, chosen: dict | None) -> str:
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


def long_needle_calibration(spec: dict, path: Path = CALIBRATION_TRIALS) -> list[str]:
    """The baseline's calibration trials of the needle longer than the extrapolation protocol's training length
    (calibrate.py): how far its budget is from learning at long lengths, beside the same-length table."""
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
        "Calibration of this protocol (the baseline alone, `benchmarks/evidence/calibrate.py`, answer accuracy on "
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


def _num(x: float, scale: float) -> str:
    """3 decimals, or 2 significant digits in scientific notation where the scale is below 0.01 (N-body MSE gaps of
    ~1e-3 would print as -0.001 [-0.002, -0.001])."""
    return "n/a" if math.isnan(x) else format(x, "+.1e" if 0 < scale < 0.01 else "+.3f")


def _delta_text(r: dict) -> str:
    """Δ and its family-corrected Welch interval (the verdict's interval) at its level."""
    values = [x for x in (r["diff"], *r.get("ci", ())) if not math.isnan(x)]
    scale = max((abs(x) for x in values), default=0.0)
    ci = f" [{_num(r['ci'][0], scale)}, {_num(r['ci'][1], scale)}] at {r['level']:.2%}" if "ci" in r else ""
    return f"Δ {_num(r['diff'], scale)}{ci}"


def _fmt_p(p: float) -> str:
    return "p n/a" if math.isnan(p) else (f"p={p:.3f}" if p >= 0.001 else "p<0.001")


def _edge_mark(chosen: dict | None) -> str:
    return "†" if chosen and not chosen.get("failed") and chosen.get("edge") else ""


EDGE_NOTE = (
    "† edge pick: the selected lr is on the edge of the grid, so the optimum may lie outside it; the plan's rule "
    "(`protocol.widen_grid`) adds the next half-decade lr beyond that edge ({}) before the reported seeds run, and "
    "these widening runs have not run for the rows shown (their seeds ran at the edge pick)."
)


def evidence_tables(done: dict, cells: Sequence[Any], spec: Any) -> list[str]:
    """Markdown of every evidence table's values: mean ± std over the reported seeds (1 .. n-1, never the selection
    seed), the selected lr, edge picks marked. Verdicts are by claim family (`family_verdicts`), not by table."""
    spec_dict = asdict_spec(spec)
    by_cell = {(c.name, c.task): c for c in cells}
    lines: list[str] = []
    for title, tasks, variants in EVIDENCE_TABLES:
        present = [(v, t) for t in tasks for v in variants if (v, t) in by_cell]
        if not present:
            continue
        rows_of = {(v, t): plan.reported_rows(by_cell[(v, t)], done, spec) for v, t in present}
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
                    planned = len(plan.reported_seeds(by_cell[(v, t)]))
                    text = _cell_text(rows_of[(v, t)], c["key"], digits, planned, chosen)
                    cellsrow.append(text.replace(")", f"{_edge_mark(chosen)})", 1) if _edge_mark(chosen) else text)
            body.append([EVIDENCE_LABELS.get(v, v), *cellsrow])
        seeds = sorted({len(plan.reported_seeds(by_cell[k])) for k in present})
        lines += [
            f"### {title}",
            "",
            f"Mean ± std over the reported seeds (seeds 1 .. n-1 at the selected setting, n = "
            f"{' / '.join(map(str, seeds))} per cell; seed 0 selected the lr and is not reported):",
            "",
            *markdown_table(header, body),
        ]
        widen = sorted({lr for k in present if _edge_mark(chosen_of[k]) for lr in chosen_of[k]["widen"]})
        notes = [EDGE_NOTE.format(", ".join(f"lr {lr:g}" for lr in widen) or "none: the ladder's end")] if widen else []
        notes += [*learned_nothing_columns(rows_of, columns).values()]
        for t in dict.fromkeys(t for _, t in present):
            reported = [r for (_, tt), rs in rows_of.items() if tt == t for r in rs if "final_train_loss" in r]
            short = sum(not audit.converged(r) for r in reported)
            if t in audit.TOKEN_TASKS and short:
                notes.append(
                    f"{t}: {short} of {len(reported)} reported runs did not converge in "
                    f"{spec_dict['budgets'][t]['steps']:,} steps (final training loss > {audit.CONVERGED_LOSS:.3f}): "
                    "these columns measure speed of learning (see the convergence table)."
                )
        notes += long_needle_calibration(spec_dict) if tasks == ("passkey_long",) else []
        for note in notes:
            lines += ["", note]
        lines.append("")
    return lines


def _test(a: Sequence[dict], b: Sequence[dict], key: str) -> dict[str, Any]:
    """Welch, the exact permutation test on means and the exact Mann-Whitney test of a key's seed values."""
    va, vb = [r[key] for r in a if key in r], [r[key] for r in b if key in r]
    perm, rank = permutation_test(va, vb), mann_whitney_exact(va, vb)
    return {
        **welch(va, vb),
        "n": (len(va), len(vb)),
        "values": (va, vb),
        "p_perm": perm["p"],
        "min_p_perm": perm["min_p"],
        "p_mw": rank["p"],
        "min_p_mw": rank["min_p"],
    }


def _identity(rows: Sequence[dict]) -> tuple:
    return tuple(sorted((r["variant"], r["task"], r["seed"], r.get("lr")) for r in rows))


def families_markdown(spec: Any, cells: Sequence[Any]) -> list[str]:
    """The claim families as declared in the plan (before any result): per family its claim and comparisons."""
    planned = {(c.name, c.task) for c in cells}
    lines = [
        "### Comparison families (declared in `benchmarks/evidence/plan.py` before the runs)",
        "",
        "Each claim is one family; each comparison (variant − baseline on one metric, on the reported seeds) is in "
        "exactly one family and tested once. The verdicts follow the results, family by family.",
        "",
    ]
    for family in plan.comparison_families(spec):
        by_variant: dict[str, list[str]] = {}
        for v, t, k in family.comparisons:
            if (v, t) in planned and ("baseline", t) in planned:
                by_variant.setdefault(v, []).append(f"{t} {k}")
        if by_variant:
            count = sum(map(len, by_variant.values()))
            parts = "; ".join(f"{EVIDENCE_LABELS.get(v, v)}: {', '.join(ks)}" for v, ks in by_variant.items())
            lines.append(f"- `{family.name}` — {family.claim} ({count} comparisons): {parts}.")
    return [*lines, ""]


def family_verdicts(done: dict, cells: Sequence[Any], spec: Any) -> tuple[list[str], dict[str, Any]]:
    """Each claim family's comparisons (declared in `plan.comparison_families`), tested once each on the reported
    seeds: Welch's test with its interval at the family-corrected level 1 - ALPHA / m (Bonferroni over the m tested
    comparisons; the verdict is better / worse exactly when that interval excludes 0), the exact permutation and
    Mann-Whitney tests beside it with the smallest p each can give. Not tested (and not counted in m): a comparison
    with fewer than 2 seeds a side, a degenerate one (no variance on either side, or a needle column no model
    learned), and one whose runs another comparison of the family already tests. Returns (markdown, verdicts by
    `variant|key|task`)."""
    spec_dict = asdict_spec(spec)
    by_cell = {(c.name, c.task): c for c in cells}
    rows_of = {k: plan.reported_rows(c, done, spec) for k, c in by_cell.items()}
    columns: dict[tuple[str, str], dict] = {}
    for task in {t for _, t in by_cell}:
        task_rows = [r for (_, t), rs in rows_of.items() if t == task for r in rs]
        columns |= {(task, c["key"]): c for c in evidence_columns(spec_dict, task, task_rows)}
    untrained = learned_nothing_columns(rows_of, [(t, c) for (t, _), c in columns.items()])
    lines = [
        "### Verdicts by claim family",
        "",
        "Declared in `benchmarks/evidence/plan.py` (`comparison_families`) before the runs: one family per claim, each "
        "comparison (variant − baseline on one metric) in exactly one family, tested once on the reported seeds "
        f"(never the selection seed). α = {ALPHA} per family. The verdict is Welch's: better / worse exactly when "
        "Welch's interval at the family-corrected level 1 − α/m excludes 0 (m = the comparisons the family tests; "
        "the same rule as Bonferroni-corrected p < α, so verdict and interval never disagree). Beside it, the exact "
        "two-sided permutation test on means and the exact Mann-Whitney test, each with the smallest p its sample "
        "sizes can give (min p), corrected the same way (× m). Not tested and not counted in m: fewer than 2 seeds a "
        "side, degenerate columns (no variance on either side; a needle column no model learned) and a comparison "
        "whose runs another comparison already tests (counted once).",
        "",
    ]
    verdicts: dict[str, Any] = {}
    for family in plan.comparison_families(spec):
        planned = [(v, t, k) for v, t, k in family.comparisons if (v, t) in by_cell and ("baseline", t) in by_cell]
        if not planned:
            continue
        results: list[tuple[tuple[str, str, str], dict[str, Any]]] = []
        seen: dict[tuple, str] = {}
        for v, t, k in planned:
            a, b = rows_of[(v, t)], rows_of[("baseline", t)]
            column = columns.get((t, k))
            if column is None or not any(k in r for r in a) or not any(k in r for r in b):
                results.append(((v, t, k), {"status": "not run", "verdict": "not run"}))
                continue
            r = {**_test(a, b, k), "higher": column["higher"], "label": column["label"]}
            identity = (_identity(a), _identity(b), k)
            va, vb = r["values"]
            if min(r["n"]) < 2:
                r["status"] = f"too few seeds (n = {r['n'][0]} vs {r['n'][1]})"
            elif (t, k) in untrained:
                r["status"] = "degenerate: no model learned this column (identical per-example results)"
            elif len(set(va)) == 1 and len(set(vb)) == 1:
                r["status"] = f"degenerate: no variance ({va[0]:.4g} in every seed vs {vb[0]:.4g})"
            elif identity in seen:
                r["status"] = f"same runs as {EVIDENCE_LABELS.get(seen[identity], seen[identity])}: tested once there"
            else:
                r["status"] = "tested"
                seen[identity] = v
            r["verdict"] = "tested" if r["status"] == "tested" else "not tested"
            results.append(((v, t, k), r))
        tested = [r for _, r in results if r["status"] == "tested"]
        m = len(tested)
        level = 1.0 - ALPHA / max(m, 1)
        for r in tested:
            va, vb = r.pop("values")
            r["ci"], r["level"], r["m"] = welch_interval(va, vb, level), level, m
            r["p_adjusted"], r["p_perm_adjusted"], r["p_mw_adjusted"] = (
                min(1.0, m * r[p]) for p in ("p", "p_perm", "p_mw")
            )
            r["verdict"] = verdict_word(r["ci"], r["higher"])
            r["exact_agrees"] = min(r["p_perm_adjusted"], r["p_mw_adjusted"]) < ALPHA
        body = []
        for (v, t, k), r in results:
            r.pop("values", None)
            r["family"] = family.name
            verdicts[f"{v}|{k}|{t}"] = r
            label = f"{EVIDENCE_LABELS.get(v, v)}: {r.get('label', k)}"
            if r["status"] != "tested":
                body.append(
                    [label, "-" if "n" not in r else f"{r['n'][0]} vs {r['n'][1]}", r["status"], "", "", "", ""]
                )
                continue
            welch_only = r["verdict"] in ("better", "worse") and not r["exact_agrees"]
            body.append(
                [
                    label,
                    f"{r['n'][0]} vs {r['n'][1]}",
                    _delta_text(r),
                    f"{_fmt_p(r['p'])} → {_fmt_p(r['p_adjusted'])}",
                    f"{_fmt_p(r['p_perm'])} (min {r['min_p_perm']:.3g}) → {_fmt_p(r['p_perm_adjusted'])}",
                    f"{_fmt_p(r['p_mw'])} (min {r['min_p_mw']:.3g}) → {_fmt_p(r['p_mw_adjusted'])}",
                    r["verdict"] + (" (Welch only)" if welch_only else ""),
                ]
            )
        lines += [
            f"#### `{family.name}`: {family.claim}",
            "",
            f"{len(planned)} comparisons declared for this size, {m} tested (family-corrected level "
            f"{level:.2%}, α/m = {ALPHA / max(m, 1):.4f}).",
            "",
            *markdown_table(
                [
                    "comparison",
                    "n",
                    "Δ [interval]",
                    "Welch p → ×m",
                    "permutation p → ×m",
                    "Mann-Whitney p → ×m",
                    "verdict",
                ],
                body,
                "---",
            ),
            "",
        ]
        if tested and all(min(r["min_p_perm"], r["min_p_mw"]) * m >= ALPHA for r in tested):
            smallest = min(min(r["min_p_perm"], r["min_p_mw"]) for r in tested)
            lines += [
                f"No exact test in this family can pass its correction at these seed counts: the smallest attainable "
                f"p is {smallest:.3g} (e.g. 2 / C(8, 4) = 0.029 with 4 vs 4 seeds), and × {m} it is "
                f"{smallest * m:.3g} ≥ α. Welch's verdicts here rest on its normality assumption (marked \"Welch "
                'only" where it decides).',
                "",
            ]
    return lines, verdicts


def asdict_spec(spec: Any) -> dict[str, Any]:
    return asdict(spec) if is_dataclass(spec) else spec


def _claim(verdicts: dict, variant: str, key: str, task: str) -> str:
    r = verdicts.get(f"{variant}|{key}|{task}")
    if r is None or r["status"] == "not run":
        return "undecided (not run yet)"
    if r["status"] != "tested":
        return f"not tested ({r['status']})"
    text = (
        f"{r['verdict']} (`{r['family']}`, {_delta_text(r)}, Welch {_fmt_p(r['p'])} × {r['m']}; exact permutation "
        f"{_fmt_p(r['p_perm'])}, min {r['min_p_perm']:.3g}; n = {r['n'][0]} vs {r['n'][1]})"
    )
    return text + (
        " — Welch only: no exact test reaches it" if r["verdict"] != "within noise" and not r["exact_agrees"] else ""
    )


def _versor_match(widths: dict, task: str, split: dict | None = None) -> str:
    """How Versor's size compares with the baseline's on `task`: matched (±10%) or not, with both counts, and the
    bodies' counts where `split` (`audit.parameter_split` by `variant/task`) has them."""
    versor, base = widths.get(f"versor_hybrid/{task}"), widths.get(f"baseline/{task}")
    if not versor or not base:
        return "parameter counts not recorded"
    counts = f"{versor['params']:,} vs the baseline's {base['params']:,} parameters"
    bodies = [(split or {}).get(f"{v}/{task}") for v in ("versor_hybrid", "baseline")]
    if all(bodies):
        counts += f"; bodies {bodies[0]['body']:,} vs {bodies[1]['body']:,} without embeddings and heads"
    if versor["matched"]:
        return f"parameter-matched on the total, {counts}"
    return f"NOT parameter-matched: Versor at its width cap (hidden {versor['hidden']}) has {counts}"


def evidence_claims(
    verdicts: dict,
    spec: Any,
    reference: dict[str, Any] | None,
    widths: dict | None = None,
    split: dict | None = None,
) -> list[str]:
    """Each seed's claim as the seed states it, and what the corrected tests of this suite say about it."""
    longest = max(spec.passkey_multiples)
    nbody_key = next(
        (k.split("|")[1] for k in verdicts if k.startswith("versor_hybrid|") and k.endswith("|nbody")),
        "position_mse",
    )
    cv = f"{reference['const_velocity_position_mse']:.4f}" if reference else "n/a"
    widths = widths or {}
    options = len(plan.members("pct_tuned")) > 1  # a PCT scale option in models.VARIANTS

    def tuned(key: str, task: str) -> str:
        return f"; PCT tuned over its scale options {_claim(verdicts, 'pct_tuned', key, task)}" if options else ""

    return [
        "Seed claims, as the seeds state them, and this suite's corrected verdicts (variant vs the baseline):",
        "",
        f'- PCT (seed 003): "{SEED_PCT}". Not testable on CPU at 16K tokens (`--size full`). Here: trained at '
        f"{spec.budgets['passkey'].params['length'] if 'passkey' in spec.budgets else 'n/a'} tokens, tested at "
        f"{longest}x — PCT with package defaults {_claim(verdicts, 'pct', f'{NEEDLE}@{longest}x', 'passkey')}"
        f"{tuned(f'{NEEDLE}@{longest}x', 'passkey')}. At the trained length: PCT defaults "
        f"{_claim(verdicts, 'pct', f'{NEEDLE}@1x', 'passkey')}{tuned(f'{NEEDLE}@1x', 'passkey')}. "
        f"Trained and tested at "
        f"{spec.budgets['passkey_long'].params['length'] if 'passkey_long' in spec.budgets else 'n/a'} tokens: PCT "
        f"defaults {_claim(verdicts, 'pct', f'{NEEDLE}@1x', 'passkey_long')}"
        f"{tuned(f'{NEEDLE}@1x', 'passkey_long')}."
        + (
            ""
            if options
            else " (No PCT scale option is listed in benchmarks.evidence.models.VARIANTS, so no `pct_tuned` cell.)"
        )
        + (
            f" LRA (the seed names no LRA task; here ListOps, expressions of < "
            f"{spec.budgets['listops'].params['max_length']} tokens): PCT defaults "
            f"{_claim(verdicts, 'pct', 'accuracy', 'listops')}{tuned('accuracy', 'listops')}."
            if "listops" in spec.budgets
            else ""
        ),
        f'- Versor (seed 004): "{SEED_VERSOR}" (the paper\'s own scale; no ± given). Here (Versor hidden '
        f"searched up to {spec.versor_max_hidden}; {_versor_match(widths, 'nbody', split)}): N-body {nbody_key} "
        f"{_claim(verdicts, 'versor_hybrid', nbody_key, 'nbody')} "
        f"(constant-velocity extrapolation: {cv}). Recall ({_versor_match(widths, 'mqar', split)}): MQAR "
        f"{_claim(verdicts, 'versor_hybrid', 'accuracy', 'mqar')}; the needle at the trained length "
        f"{_claim(verdicts, 'versor_hybrid', f'{NEEDLE}@1x', 'passkey')}.",
        "- ZPX (seed 000): the seed makes no performance claim; it prescribes a stepwise ablation (baseline, angle "
        "only, + sphere, + centre loss) on geometry, physics and spiral tasks. That ladder is the table above; no "
        "claim is checked.",
    ]


UNDERFIT_RATIO = 2.0  # a pick's training loss over its cell's lowest (seed 0) above which the note names it


def nbody_reference_lines(done: dict, cells: Sequence[Any], spec: Any, reference: dict) -> list[str]:
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
            "bodies, tested on 3 / 7) needs one token per body, where a token here is one time step of all bodies: "
            "it runs in `python -m benchmarks.evidence.nbody_geometry` ([results](benchmarks/results/nbody_geometry.md)"
            "), with the equivariance errors of every model."
        )
    means = {}
    for cell in cells:
        rows = plan.reported_rows(cell, done, spec) if cell.task == "nbody" else []
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
    return [text + underfit_note(done, cells, spec), ""]


def underfit_note(done: dict, cells: Sequence[Any], spec: Any) -> str:
    """Where an N-body pick trained to a much higher loss than its cell's best-fitting lr: selection on validation
    rollout alone rewards a smooth under-fit (issue 37, item 3), and the verdicts inherit it."""
    flagged = []
    for cell in cells:
        chosen = plan.select(cell, done, spec) if cell.task == "nbody" else None
        if not chosen or chosen.get("failed"):
            continue
        losses = {
            lr: done[(chosen["variant"], cell.task, SELECT_SEED, lr)].get("final_train_loss", math.nan)
            for lr in chosen["lrs"]
            if (chosen["variant"], cell.task, SELECT_SEED, lr) in done
        }
        best = min((lr for lr in losses if math.isfinite(losses[lr])), key=losses.get, default=None)
        if best is not None and losses.get(chosen["lr"], math.nan) > UNDERFIT_RATIO * losses[best]:
            flagged.append(
                f"{cell.name} at lr {chosen['lr']:g} (training loss {losses[chosen['lr']]:.3f}; "
                f"{losses[best]:.3f} at lr {best:g})"
            )
    if not flagged:
        return ""
    if select_rule(spec.budgets["nbody"].params) == "rollout":
        lead, tail = (
            "Selection on validation rollout MSE rewards a smooth under-fit: these",
            ("; `nbody_geometry` selects on rollout and one-step error together."),
        )
    else:
        lead, tail = "Selected on validation rollout and one-step error together, these", "."
    return (
        f" {lead} picks trained to more than {UNDERFIT_RATIO:g}x the loss of their best-fitting lr (seed 0): "
        + "; ".join(flagged)
        + ". Their N-body verdicts compare under-fitted models"
        + tail
    )


def curve_plot(done: dict, cells: Sequence[Any], spec: Any, stem: Path) -> Path | None:
    """Validation metric against training steps and against training FLOPs (mean over the selected setting's seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in ("mqar", "passkey", "passkey_long", "spiral", "listops") if any(c.task == t for c in cells)]
    data = {}
    for cell in cells:
        if cell.task not in tasks:
            continue
        rows = [r for r in plan.reported_rows(cell, done, spec) if r.get("val_curve")]
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
        *markdown_table(
            ["source", "protocol", "task", "budget", "variant", "ok/rows", "lr", "mean (± std over seeds)"], body, "---"
        ),
        "",
    ]


def gpu_plan_markdown(spec: Any, cells: Sequence[Any]) -> list[str]:
    """The size of a plan not yet run: runs, budget and training tokens per task (`plan.training_tokens`)."""
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
        *markdown_table(["task", "runs", "steps × batch × tokens", "training tokens"], body, "---"),
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
        "(`pct_tuned`, planned when PCT scale options are listed in benchmarks.evidence.models.VARIANTS: every PCT "
        "variant at every lr); the setting with the best "
        f"validation metric ({spec.val_examples} examples at the trained length, data seed {VAL_SEED}) is selected "
        f"and trained with seeds 1 .. n-1 (a pick on the grid's edge first widens the grid by the next half-decade lr, "
        "`protocol.widen_grid`; the rows here ran before that rule, so edge picks are marked †); seed 0 only selects: "
        "every reported mean, test and interval uses seeds 1 .. n-1 (n - 1 = 4 for the headline cells); test numbers "
        f"are at the selected setting on {spec.eval_examples} held-out "
        f"examples ({spec.passkey_eval_examples} per needle length; data seed {EVAL_SEED}; training batches come "
        "from seeds ≥ 1,000,003, so the three never meet). Seeds: 5 for the headline cells (tier 0), 3 for Versor "
        "on the needle and the ZPX ladder, 2 for the same-length needle and spiral. Validation accuracy is "
        f"recorded at {', '.join(f'{f:g}' for f in spec.checkpoints)} of the step budget (curves). Training FLOPs: "
        "torch.utils.flop_counter on one training step (forward + backward; matrix products and attention, "
        "elementwise ops not counted) times the steps. N-body: selection on "
        + SELECT_ON[select_rule(spec.budgets["nbody"].params) if "nbody" in spec.budgets else "rollout"]
        + " on the validation trajectories (CV: constant velocity; the test trajectories' when a protocol has no "
        "validation split, flagged in the selection table); learning (the lr-range table) is a validation rollout "
        "below constant velocity's. Model: "
        f"{spec.layers} layers, baseline hidden {spec.hidden}, {spec.heads} heads, parameter-matched ±10% (Versor "
        f"hidden searched up to {spec.versor_max_hidden}).",
        "",
    ]
    lines += families_markdown(spec, cells)
    lines += evidence_tables(done, cells, spec)
    family_lines, verdicts = family_verdicts(done, cells, spec)
    lines += family_lines
    parameter_lines, split = audit.parameter_markdown(widths, spec, sorted({c.task for c in cells}))
    lines += evidence_claims(verdicts, spec, reference, widths, split) + [""]
    lines += audit.convergence_markdown(audit.convergence(done, cells, spec), spec)
    compute = audit.compute_table(done, cells, spec, widths)
    lines += parameter_lines + audit.compute_markdown(compute) + audit.configurations_markdown(cells, spec)
    ranges = audit.lr_ranges(done, spec, reference)
    range_lines = audit.lr_range_markdown(ranges, spec, reference)
    lines += range_lines
    if reference:
        lines += nbody_reference_lines(done, cells, spec, reference)
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
            + (
                f" † edge pick (widening: lr {', '.join(f'{x:g}' for x in chosen['widen'])} not run)"
                if chosen["widen"]
                else ""
            )
            + (" † at the ladder's end" if chosen["edge"] and not chosen["widen"] else "")
        )
        body.append([f"{cell.name} / {cell.task}", str(cell.tier), grid, picked])
    lines += [
        "### lr selection (validation metric of seed 0 per setting)",
        "",
        *markdown_table(["cell", "tier", "grid", "selected"], body, "---"),
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
        *markdown_table(["variant", "task", "widths"], body, "---"),
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
        "batch 32) for the attention variants. Run it with `python -m benchmarks.evidence --size full --device "
        "cuda --workers 1` (`--tasks listops` for ListOps alone); it has not been run (no GPU here), so its wall "
        "time is not measured.",
        "",
    ]
    if gpu_plan is not None:
        lines += gpu_plan_markdown(*gpu_plan)
    lines += superseded_markdown(superseded)
    text = "\n".join(lines) + "\n"
    if figures:
        path = curve_plot(done, cells, spec, stem)
        if path:
            text += f"\n![{path.stem}](benchmarks/results/{path.name})\n"
    payload = {
        "meta": meta,
        "size": asdict_spec(spec),
        "selection": {f"{c.name}/{c.task}": plan.select(c, done, spec) for c in cells},
        "verdicts": {k: {kk: vv for kk, vv in v.items()} for k, v in verdicts.items()},
        "families": [asdict(f) for f in plan.comparison_families(spec)],
        "convergence": audit.convergence(done, cells, spec),
        "parameters": split,
        "compute": compute,
        "lr_ranges": audit.lr_range_summary(ranges),
        "nbody_reference": reference,
        "runs": list(done.values()),
    }
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    stem.with_suffix(".md").write_text(text)
    if range_lines:  # the lr ranges alone, for citing (README, model cards)
        ranges_stem = stem.parent / f"{stem.name}_lr_ranges"
        ranges_stem.with_suffix(".md").write_text(
            f"From `{meta['command']} --report` ({meta['date']}), the rows of {stem.name}.jsonl.\n\n"
            + "\n".join(range_lines)
        )
        ranges_stem.with_suffix(".json").write_text(json.dumps(audit.lr_range_summary(ranges), indent=1) + "\n")
    return text
