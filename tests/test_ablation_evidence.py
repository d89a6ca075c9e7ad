"""The evidence suite's machinery: statistics against scipy / hand-computed values, the plan (lr selection on
validation, stage order, resume), per-example hits, provenance, and one tiny end-to-end run."""

import ast
import itertools
import json
import math
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.evidence import (
    audit,
    lm_study,
    lr_boundary,
    models,
    nbody,
    plan,
    protocol,
    report,
    runs,
    stats,
    suite,
    tasks,
    training,
)
from benchmarks.evidence.rows import RESULTS, append_row, provenance, read_rows
from benchmarks.evidence.sizes import SIZES

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
EVIDENCE = SIZES["evidence"]


# ---- the package -------------------------------------------------------------------------------------------

# benchmarks/evidence/ bottom up (the package docstring's order): a module imports only modules before it here
LAYERS = (
    *("protocol", "rows", "stats", "training", "nbody", "nbody_bodies", "tasks"),
    *("models", "runs", "sizes", "plan", "audit", "report", "suite"),
)
# entry points: nothing imports them
TOOLS = ("calibrate", "nbody_study", "nbody_geometry", "pct_defaults", "lm_study", "lr_boundary", "__main__")


def package_imports(path: Path) -> tuple[set[str], list[str]]:
    """(modules of benchmarks.evidence that `path` imports at its top, names of those imported inside a function)."""
    tree = ast.parse(path.read_text())
    top, nested = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchmarks.evidence"):
            names = [node.module[len("benchmarks.evidence.") :]] if node.module != "benchmarks.evidence" else []
            names += [a.name for a in node.names if node.module == "benchmarks.evidence"]
        elif isinstance(node, ast.Import):
            names = [a.name[len("benchmarks.evidence.") :] for a in node.names if a.name.startswith("benchmarks.")]
        else:
            continue
        (top.update if node in tree.body else nested.extend)(n for n in names if n)
    return top, nested


def test_the_package_imports_flow_one_way():
    folder = BENCH / "evidence"
    assert {p.stem for p in folder.glob("*.py")} == {*LAYERS, *TOOLS, "__init__"}
    for path in folder.glob("*.py"):
        top, nested = package_imports(path)
        assert not nested, f"{path.name} imports {nested} inside a function"
        if path.stem in LAYERS:
            below = set(LAYERS[: LAYERS.index(path.stem)])
            assert top <= below, f"{path.name} imports {sorted(top - below)}, not below it in {LAYERS}"
        assert not top & set(TOOLS), f"{path.name} imports a tool"


# ---- the running suite's protocol ---------------------------------------------------------------------------

# What the rows of benchmarks/results/ablation_evidence.jsonl are matched by (plan.index_rows): a change to
# a budget or the protocol id reruns its cells and drops every finished row from the tables. Change these only
# together with a new protocol id.
EVIDENCE_FINGERPRINTS = {
    "mqar": "0ec7fefa49",
    "passkey": "466236a302",
    "passkey_long": "51932b965f",
    "spiral": "1236ed346c",
    "nbody": "9dbb74cfd4",  # select_on rollout_onestep (issue 37); f3b11f5447 before
}


def test_the_evidence_protocol_budgets_and_plan_are_those_its_rows_ran():
    assert {t: b.fingerprint() for t, b in EVIDENCE.budgets.items()} == EVIDENCE_FINGERPRINTS
    assert EVIDENCE.protocol == "evidence-v1" and EVIDENCE.lrs == (3e-4, 1e-3, 3e-3)
    attention = ["baseline", "softmax_srpe", "zpx_full", "pct", "pct_tuned"]
    ladder = ["zpx_angle", "zpx_angle_sphere", "zpx_center"]
    expected = [(v, t, 5, 0) for t in ("mqar", "passkey", "nbody") for v in attention]
    expected += [("versor_hybrid", "mqar", 5, 0), ("versor_hybrid", "nbody", 5, 0), ("versor_hybrid", "passkey", 3, 1)]
    expected += [(v, t, 3, 2) for t in ("mqar", "passkey") for v in ladder]
    expected += [(v, "passkey_long", 2, 3) for v in attention if v != "softmax_srpe"]
    expected += [(v, "spiral", 2, 4) for v in (*attention, "versor_hybrid", *ladder)]
    cells = plan.evidence_cells(list(EVIDENCE.budgets))
    assert [(c.name, c.task, c.seeds, c.tier) for c in cells] == expected
    # the committed rows of this protocol are all current (none silently superseded), except the `pct` rows of
    # PCT's defaults version 2 (no variant revision), superseded by revision 3, and the N-body rows selected on
    # rollout alone (budget f3b11f5447), superseded by select_on rollout_onestep; the report lists both
    rows = read_rows(BENCH / "results" / "ablation_evidence.jsonl")
    ours = [r for r in rows if r.get("protocol") == EVIDENCE.protocol]
    superseded = [
        r for r in ours if (r["variant"] == "pct" and "variant_revision" not in r) or r["budget"] == "f3b11f5447"
    ]
    current = [r for r in ours if r not in superseded]
    assert sum(r["budget"] == EVIDENCE_FINGERPRINTS["nbody"] for r in current) == 51
    assert ours and len(_done(ours)) == len({plan.job_of(r, EVIDENCE) for r in current})


# ---- statistics ------------------------------------------------------------------------------------------


def test_welch_matches_hand_computed_values():
    # a = 1, 2, 3 (mean 2, var 1), b = 4, 6, 8 (mean 6, var 4): t = -4 / sqrt(5/3), df = (5/3)^2 / ((1/9 + 16/9) / 2)
    result = stats.welch([1.0, 2.0, 3.0], [4.0, 6.0, 8.0])
    assert result["t"] == pytest.approx(-4 / math.sqrt(5 / 3), rel=1e-12)
    assert result["df"] == pytest.approx((5 / 3) ** 2 / ((1 / 9 + 16 / 9) / 2), rel=1e-12)
    # t with 2 df: two-sided p = 1 - |t| / sqrt(2 + t^2) (closed form)
    assert stats.t_two_sided_p(1.5, 2.0) == pytest.approx(1 - 1.5 / math.sqrt(2 + 1.5**2), rel=1e-10)
    # t with 1 df is Cauchy: p = 1 - 2 atan(|t|) / pi
    assert stats.t_two_sided_p(3.0, 1.0) == pytest.approx(1 - 2 * math.atan(3.0) / math.pi, rel=1e-10)
    assert math.isnan(stats.welch([1.0], [2.0, 3.0])["p"])
    assert stats.welch([1.0, 1.0], [1.0, 1.0])["p"] == 1.0
    assert stats.welch([1.0, 1.0], [2.0, 2.0])["p"] == 0.0


def test_welch_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for na, nb, shift in [(3, 3, 0.1), (5, 5, 1.0), (5, 2, 3.0), (40, 7, 0.4)]:
        a, b = rng.normal(0, 1, na), rng.normal(shift, 2, nb)
        ours, ref = stats.welch(a, b), scipy_stats.ttest_ind(a, b, equal_var=False)
        assert ours["t"] == pytest.approx(ref.statistic, rel=1e-10)
        assert ours["p"] == pytest.approx(ref.pvalue, rel=1e-8)


def test_bonferroni_by_hand_and_the_verdict_is_the_corrected_intervals():
    # m = 3 non-nan p-values: x3, capped at 1; nan is left out of m
    assert stats.bonferroni([0.04, 0.01, math.nan, 0.5]) == pytest.approx([0.12, 0.03, math.nan, 1.0], nan_ok=True)
    assert stats.verdict_word((0.01, 0.2), True) == "better"
    assert stats.verdict_word((0.01, 0.2), False) == "worse"
    assert stats.verdict_word((-0.2, -0.01), False) == "better"
    assert stats.verdict_word((-0.01, 0.2), True) == "within noise"
    assert stats.verdict_word((math.nan, math.nan), True) == "not tested"
    # one rule: the interval at 1 - alpha / m excludes 0 exactly when the Bonferroni-corrected Welch p is below alpha
    rng = np.random.default_rng(7)
    agree = {True: 0, False: 0}
    for trial in range(400):
        na, nb, m = int(rng.integers(2, 6)), int(rng.integers(2, 6)), int(rng.integers(1, 30))
        a, b = rng.normal(0, 1, na), rng.normal(rng.choice([0.0, 1.0, 3.0]), rng.choice([0.3, 1.0, 2.0]), nb)
        lo, hi = stats.welch_interval(a, b, 1 - stats.ALPHA / m)
        corrected = stats.bonferroni([stats.welch(a, b)["p"]] * m)[0]
        excludes = not lo <= 0 <= hi
        assert excludes == (corrected < stats.ALPHA), (trial, a, b, m)
        agree[excludes] += 1
    assert min(agree.values()) > 40  # both outcomes occur, so the property was exercised both ways


def test_welch_interval_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(5)
    for na, nb, level in [(2, 4, 0.998), (4, 4, 0.99), (5, 3, 0.95), (30, 9, 0.5)]:
        a, b = rng.normal(0, 1, na), rng.normal(1, 2, nb)
        ref = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(level)
        assert stats.welch_interval(a, b, level) == pytest.approx((ref.low, ref.high), rel=1e-9)
        assert stats.t_critical(3.7, level) == pytest.approx(scipy_stats.t.ppf(0.5 + level / 2, 3.7), rel=1e-10)
    assert all(math.isnan(x) for x in stats.welch_interval([1.0, 1.0], [2.0, 2.0], 0.95))  # no variance: no interval


def _brute_force_p(a, b, statistic):
    """Two-sided p over every ordering of the pooled values (n! label assignments, each split counted equally
    often): an enumeration independent of the tests' combinations."""
    pooled, na = [*a, *b], len(a)
    observed = abs(statistic(a, b))
    extreme = [abs(statistic(p[:na], p[na:])) >= observed - 1e-12 for p in itertools.permutations(pooled)]
    return sum(extreme) / len(extreme)


def test_exact_permutation_and_mann_whitney_tests_match_brute_force_and_scipy():
    def mean_gap(x, y):
        return np.mean(x) - np.mean(y)

    def u_gap(x, y):
        ranks = stats.midranks([*x, *y])
        return ranks[: len(x)].sum() - len(x) * (len(x) + 1) / 2 - len(x) * len(y) / 2

    cases = [
        ([0.99, 1.0, 0.99, 0.997], [0.904, 0.943, 0.882, 0.29]),  # bimodal MQAR-like outcomes, ties inside a
        ([1.0, 2.0, 2.0], [2.0, 3.0, 5.0, 0.5]),  # ties across the groups
        ([0.3, 0.1], [0.2, 0.5, 0.4]),
    ]
    for a, b in cases:
        assert stats.permutation_test(a, b)["p"] == pytest.approx(_brute_force_p(a, b, mean_gap), abs=1e-12)
        assert stats.mann_whitney_exact(a, b)["p"] == pytest.approx(_brute_force_p(a, b, u_gap), abs=1e-12)
    assert stats.midranks([3.0, 1.0, 3.0, 2.0]).tolist() == [3.5, 1.0, 3.5, 2.0]
    # the smallest attainable p: two extreme splits of C(na + nb, na)
    assert stats.permutation_test([1, 2, 3, 4], [5, 6, 7, 8])["min_p"] == pytest.approx(2 / 70)
    assert stats.mann_whitney_exact([1, 2, 3, 4], [5, 6, 7, 8]) == {
        "p": 2 / 70,
        "min_p": 2 / 70,
        "splits": 70,
        "u": 0.0,
    }
    assert stats.mann_whitney_exact([1, 2], [3, 4, 5, 6])["min_p"] == pytest.approx(2 / 15)
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(11)
    for na, nb in [(4, 4), (5, 5), (2, 4), (3, 6)]:  # no ties: scipy's exact distribution is the reference
        a, b = rng.normal(0, 1, na), rng.normal(0.8, 1, nb)
        ref = scipy_stats.mannwhitneyu(a, b, method="exact")
        ours = stats.mann_whitney_exact(a, b)
        assert ours["u"] == ref.statistic and ours["p"] == pytest.approx(ref.pvalue, rel=1e-12)
        perm = scipy_stats.permutation_test(
            (a, b), lambda x, y: np.mean(x) - np.mean(y), permutation_type="independent", n_resamples=np.inf
        )
        assert stats.permutation_test(a, b)["p"] == pytest.approx(perm.pvalue, rel=1e-12)


def test_bits_round_trip_and_bootstrap_interval():
    hits = np.random.default_rng(0).random((37, 3)) > 0.4
    assert (stats.decode_bits(stats.encode_bits(hits.reshape(-1)), hits.size).reshape(37, 3) == hits).all()
    a = [np.ones((200, 2)), np.ones((200, 2))]
    b = [np.zeros((200, 2)), np.zeros((200, 2))]
    assert stats.bootstrap_diff(a, b, samples=50) == (1.0, 1.0)
    rng = np.random.default_rng(1)
    a = [rng.random((300, 1)) < 0.7 for _ in range(3)]
    b = [rng.random((300, 1)) < 0.5 for _ in range(3)]
    lo, hi = stats.bootstrap_diff(a, b, samples=400)
    assert lo < 0.2 < hi and hi - lo < 0.15  # true gap 0.2; ~900 examples per side
    with pytest.raises(ValueError, match="shapes differ"):
        stats.bootstrap_diff([np.ones((3, 1))], [np.ones((4, 1))])


# ---- the plan ---------------------------------------------------------------------------------------------


def _row(variant, task, seed, lr, value, status="ok", **extra):
    key = protocol.SELECTION[task][0]
    row = {"variant": variant, "task": task, "seed": seed, "lr": lr, "status": status, "protocol": EVIDENCE.protocol}
    row["budget"] = EVIDENCE.budgets[task].fingerprint()
    if models.variant_revision(variant) is not None:
        row["variant_revision"] = models.variant_revision(variant)
    if value is not None:
        row[key] = value
    return {**row, **extra}


def _done(rows):
    return plan.index_rows(rows, EVIDENCE)


def test_stage_one_then_selection_on_validation_then_the_other_seeds():
    cell = plan.Cell("baseline", "mqar", 5, 0)
    assert plan.cell_jobs(cell, {}, EVIDENCE) == [(1, ("baseline", "mqar", 0, lr)) for lr in EVIDENCE.lrs]
    rows = [_row("baseline", "mqar", 0, 3e-4, 0.5), _row("baseline", "mqar", 0, 1e-3, 0.9)]
    assert plan.select(cell, _done(rows), EVIDENCE) is None  # a stage-1 run is missing
    # the test accuracy of the 3e-3 run is higher, but selection reads validation only
    rows.append(_row("baseline", "mqar", 0, 3e-3, 0.8, accuracy=0.99))
    chosen = plan.select(cell, _done(rows), EVIDENCE)
    assert (chosen["variant"], chosen["lr"], chosen["source"]) == ("baseline", 1e-3, "val")
    jobs = plan.runnable([cell], _done(rows), EVIDENCE)
    assert jobs == [("baseline", "mqar", s, 1e-3) for s in range(1, 5)]
    rows += [_row("baseline", "mqar", s, 1e-3, 0.9, accuracy=0.9) for s in range(1, 5)]
    assert plan.runnable([cell], _done(rows), EVIDENCE) == []
    # the selection seed won the selection (biased upwards): never reported, whatever its value
    assert [r["seed"] for r in plan.reported_rows(cell, _done(rows), EVIDENCE)] == [1, 2, 3, 4]
    assert not plan.select(cell, _done(rows), EVIDENCE)["edge"]
    assert cell in plan.progress([cell], _done(rows), EVIDENCE)["complete"]


def test_an_edge_pick_widens_the_grid_by_the_next_half_decade_before_the_reported_seeds():
    cell = plan.Cell("baseline", "mqar", 5, 0)
    rows = [_row("baseline", "mqar", 0, lr, v) for lr, v in zip(EVIDENCE.lrs, (0.5, 0.8, 0.9))]
    chosen = plan.select(cell, _done(rows), EVIDENCE)
    assert chosen["lr"] == 3e-3 and chosen["edge"] and chosen["widen"] == [1e-2] and not chosen["final"]
    assert plan.runnable([cell], _done(rows), EVIDENCE) == [("baseline", "mqar", 0, 1e-2)]  # no stage 2 yet
    # rows that ran at the edge pick before the rule stay reported, marked by `edge`
    early = rows + [_row("baseline", "mqar", s, 3e-3, 0.9, accuracy=0.9) for s in range(1, 5)]
    assert [r["seed"] for r in plan.reported_rows(cell, _done(early), EVIDENCE)] == [1, 2, 3, 4]
    assert cell not in plan.progress([cell], _done(early), EVIDENCE)["complete"]
    # the widened lr is worse: the pick is interior and final; better: the grid widens again
    worse = rows + [_row("baseline", "mqar", 0, 1e-2, 0.3)]
    chosen = plan.select(cell, _done(worse), EVIDENCE)
    assert (chosen["lr"], chosen["edge"], chosen["final"]) == (3e-3, False, True)
    assert plan.runnable([cell], _done(worse), EVIDENCE) == [("baseline", "mqar", s, 3e-3) for s in range(1, 5)]
    better = rows + [_row("baseline", "mqar", 0, 1e-2, 0.95)]
    assert plan.select(cell, _done(better), EVIDENCE)["widen"] == [3e-2]
    best = better + [_row("baseline", "mqar", 0, 3e-2, 0.97)]  # past 3e-2 (N-body picks reached it): 1e-1 next
    assert plan.select(cell, _done(best), EVIDENCE)["widen"] == [1e-1]
    # the low edge widens downwards; the LM study selects with the same helper
    low = [_row("baseline", "mqar", 0, lr, v) for lr, v in zip(EVIDENCE.lrs, (0.9, 0.8, 0.5))]
    assert plan.select(cell, _done(low), EVIDENCE)["widen"] == [1e-4]
    assert protocol.widen_grid(lm_study.LR_START, {3e-4: 3.0, 1e-3: 2.0, 3e-3: 2.5}.get)["pick"] == 1e-3
    assert "widen_grid(" in (BENCH / "evidence" / "lm_study.py").read_text()


def test_lower_is_better_failed_runs_excluded_and_nbody_falls_back_to_test_loudly():
    cell = plan.Cell("baseline", "nbody", 5, 0)
    rows = [
        _row("baseline", "nbody", 0, 3e-4, 0.02),
        _row("baseline", "nbody", 0, 1e-3, 0.01),
        _row("baseline", "nbody", 0, 3e-3, None, status="failed: FloatingPointError: nan"),
    ]
    assert plan.select(cell, _done(rows), EVIDENCE)["lr"] == 1e-3
    # a protocol without a validation split: only the test metric
    old = [
        {**{k: v for k, v in r.items() if k != "val_select_score"}, "select_score": r["val_select_score"]}
        for r in rows[:2]
    ]
    old += rows[2:]
    chosen = plan.select(cell, _done(old), EVIDENCE)
    assert chosen["source"] == "test" and chosen["lr"] == 1e-3
    every_failed = [_row("baseline", "nbody", 0, lr, None, status="failed: x") for lr in EVIDENCE.lrs]
    assert plan.select(cell, _done(every_failed), EVIDENCE)["failed"] is True
    assert plan.runnable([cell], _done(every_failed), EVIDENCE) == []


def test_pct_tuned_selects_over_scale_options_and_shares_runs_with_pct(monkeypatch):
    assert "pct_tuned" not in {c.name for c in plan.evidence_cells(["passkey"])} or len(plan.members("pct_tuned")) > 1
    # a scale option is one VARIANTS line
    monkeypatch.setitem(models.VARIANTS, "pct_tau_learnable", {"family": "pct", "config": {"tau": "learnable"}})
    assert "pct_tuned" in {c.name for c in plan.evidence_cells(["passkey"])}
    members = plan.members("pct_tuned")
    assert members[0] == "pct" and "pct_tau_learnable" in members
    assert set(members) == {v for v, e in models.VARIANTS.items() if e["family"] == "pct"}
    cells = [plan.Cell("pct", "passkey", 5, 0), plan.Cell("pct_tuned", "passkey", 5, 0)]
    jobs = plan.runnable(cells, {}, EVIDENCE)
    assert len(jobs) == len(set(jobs)) == 3 * len(members)  # pct's runs are not duplicated
    rows = [_row(m, "passkey", 0, lr, 0.1) for m in members for lr in EVIDENCE.lrs]
    rows[-1] = _row(members[-1], "passkey", 0, EVIDENCE.lrs[-1], 0.95)
    chosen = plan.select(cells[1], _done(rows), EVIDENCE)
    assert (chosen["variant"], chosen["lr"]) == (members[-1], EVIDENCE.lrs[-1])
    assert plan.select(cells[0], _done(rows), EVIDENCE)["variant"] == "pct"


def test_every_variant_and_tuned_group_has_a_report_label():
    # the report labels every variant and tuned group a cell can hold
    assert set(models.VARIANTS) | set(plan.TUNED_GROUPS) <= set(report.EVIDENCE_LABELS)
    assert report.EVIDENCE_LABELS["pct_tau_sqrt_d"] == "PCT, fixed tau = sqrt(d)"


def test_headline_cells_run_first_and_stage_two_before_later_stage_one():
    cells = plan.evidence_cells(list(EVIDENCE.budgets))
    assert {c.task for c in cells if c.tier == 0} == set(plan.HEADLINE_TASKS)
    assert all(c.seeds == 5 for c in cells if c.tier == 0)
    assert [c.tier for c in cells] == sorted(c.tier for c in cells)
    assert {c.name for c in cells if c.task == "mqar"} >= {"zpx_angle", "zpx_angle_sphere", "zpx_center", "zpx_full"}
    first = plan.runnable(cells, {}, EVIDENCE)
    assert first[0] == ("baseline", "mqar", 0, 3e-4) and all(j[2] == 0 for j in first)
    rows = [_row("baseline", "mqar", 0, lr, v) for lr, v in zip(EVIDENCE.lrs, (0.5, 0.9, 0.8))]
    nxt = plan.runnable(cells, _done(rows), EVIDENCE)
    assert nxt[:4] == [("baseline", "mqar", s, 1e-3) for s in range(1, 5)]


def test_resume_ignores_rows_of_another_protocol_budget_or_variant_revision(tmp_path):
    rows = [
        _row("baseline", "mqar", 0, 3e-4, 0.9),
        {**_row("baseline", "mqar", 0, 1e-3, 0.9), "protocol": "evidence-v0"},
        {**_row("baseline", "mqar", 0, 3e-3, 0.9), "budget": "old"},
        {**_row("pct", "mqar", 0, 1e-3, 0.3), "variant_revision": None},  # PCT defaults version 2: none recorded
        _row("pct", "mqar", 0, 3e-4, 0.9),
        {**_row("pct_tau5", "mqar", 0, 3e-4, 0.9), "variant_revision": 3},  # a variant never revised has none
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"cut')
    assert list(_done(read_rows(path))) == [("baseline", "mqar", 0, 3e-4), ("pct", "mqar", 0, 3e-4)]
    assert models.variant_revision("pct") == 3 and models.variant_revision("baseline") is None


def test_estimate_counts_shared_runs_once_and_is_within_the_cpu_budget_for_the_headline():
    cells = plan.evidence_cells(list(EVIDENCE.budgets))
    jobs = plan.planned_jobs(cells, EVIDENCE)
    assert len(jobs) == len({(c.name, c.task, s, m, lr) for c, s, m, lr in jobs})
    # pct's stage-1 runs serve both the `pct` and the `pct_tuned` cells
    pct_stage1 = [j for j in jobs if j[0].task == "mqar" and j[2] == "pct"]
    assert len(pct_stage1) == len(EVIDENCE.lrs)
    hours = plan.estimate(cells, EVIDENCE, {}, workers=2)
    assert 0 < hours["tier 0"] < 5 and hours["total"] == pytest.approx(sum(v for k, v in hours.items() if k != "total"))


def test_the_gpu_plan_is_sized_in_runs_and_training_tokens():
    cells = [plan.Cell("baseline", "passkey_long", 2, 3), plan.Cell("pct_tuned", "passkey_long", 2, 3)]
    sized = plan.training_tokens(cells, EVIDENCE)
    # baseline: 3 lrs + seed 1; pct_tuned: 3 PCT variants x 3 lrs + seed 1 (its `pct` runs are not shared here)
    runs = 3 + 1 + len(plan.members("pct_tuned")) * 3 + 1
    budget = EVIDENCE.budgets["passkey_long"]
    assert sized == {"passkey_long": (runs, runs * budget.steps * budget.batch * budget.params["length"])}
    text = "\n".join(report.gpu_plan_markdown(EVIDENCE, cells))
    assert f"| passkey_long | {runs} | 400 × 8 × 512 |" in text and f"| all | {runs} |" in text


# ---- runs: hits, provenance ---------------------------------------------------------------------------------


def test_task_sequence_lengths_fit_generators():
    for spec in SIZES.values():
        for task in (t for t in ("mqar", "selective_copy", "spiral", "passkey", "passkey_long") if t in spec.budgets):
            params = spec.budgets[task].params
            length = tasks.task_seq_len(task, params)
            rows = tasks.lm_examples(task, 3, 0, params)
            assert all(len(r["input_ids"]) == sum(r["attention_mask"]) == length for r in rows), (task, length)
            batch = tasks.as_batch(rows)
            assert batch["input_ids"].shape == (3, length)


def test_answer_hits_agree_with_task_accuracy():
    import torch

    from zpx_hf_train.evaluation import task_accuracy

    spec = SIZES["evidence_smoke"]
    io = tasks.io_shape("mqar", spec.budgets["mqar"], spec)
    width = models.baseline_width(spec.hidden)
    torch.manual_seed(0)
    model = models.build_model("baseline", width, spec.layers, spec.heads, io)
    rows = tasks.lm_examples("mqar", 24, 5, spec.budgets["mqar"].params)
    hits = runs.answer_hits(model, rows, 7)
    reference = task_accuracy(model, tasks.Rows(rows), 7)
    assert hits.shape == (24, spec.budgets["mqar"].params["num_pairs"])
    assert hits.mean() == pytest.approx(reference["token_accuracy"], abs=1e-12)
    assert hits.all(-1).mean() == pytest.approx(reference["exact_match"], abs=1e-12)
    metrics = runs.hit_metrics(hits, "", bits=True)
    assert (stats.decode_bits(metrics["bits"], hits.size).reshape(metrics["shape"]) == hits).all()


def test_provenance_reads_the_commit(tmp_path):
    import subprocess

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout: provenance has no commit to read")
    info = provenance()
    assert info["commit"] == head.stdout.strip() and isinstance(info["dirty"], bool)
    assert provenance(tmp_path) == {"commit": "unknown", "dirty": True}  # outside a checkout: flagged


@pytest.mark.slow
def test_a_tiny_evidence_run_selects_records_provenance_and_reports(tmp_path):
    argv = ["--size", "evidence_smoke", "--tasks", "mqar", "--variants", "baseline", "--output", str(tmp_path)]
    suite.main(argv)
    rows = read_rows(tmp_path / "ablation_evidence_smoke.jsonl")
    selection, reported = [r for r in rows if r["seed"] == 0], [r for r in rows if r["seed"] != 0]
    # seed 0 at the three lrs (and the next half-decade beyond an edge pick), then seed 1 at the selected one
    assert len(reported) == 1 and set(SIZES["evidence_smoke"].lrs) <= {r["lr"] for r in selection}
    for r in rows:
        assert r["status"] == "ok", r.get("traceback")
        assert {"commit", "dirty", "config_hash", "protocol", "budget", "lr", "seed", "flops_per_step"} <= set(r)
        assert [s for s, _ in r["val_curve"]] == [4, 8, 16]
        assert r["train_flops"] == r["flops_per_step"] * 16
    best = max(selection, key=lambda r: (r["val_accuracy"], -r["lr"]))  # ties: the lower lr
    assert reported[0]["lr"] == best["lr"] and reported[0]["seed"] == 1
    assert len({r["config_hash"] for r in rows}) == 1
    text = (tmp_path / "ablation_evidence_smoke.md").read_text()
    assert f"**Progress: {len(rows)} of {len(rows)} planned runs done" in text
    assert "### Superseded protocols" in text
    suite.main(argv)  # resume: nothing left to run
    assert len(read_rows(tmp_path / "ablation_evidence_smoke.jsonl")) == len(rows)


def _mqar_rows(variant, accuracies, lr=1e-3):
    rows = []
    for seed, acc in enumerate(accuracies):
        hits = np.zeros((512, 8), bool)
        hits.reshape(-1)[: round(acc * hits.size)] = True
        row = _row(variant, "mqar", seed, lr, acc, accuracy=float(hits.mean()))
        rows.append({**row, **runs.hit_metrics(hits, "", bits=True)})
    return rows


def test_report_verdicts_are_by_claim_family_on_the_reported_seeds(tmp_path):
    cells = [plan.Cell(v, "mqar", 5, 0) for v in ("baseline", "zpx_full", "zpx_angle", "softmax_srpe")]
    rows = _mqar_rows("baseline", [0.99, 0.90, 0.91, 0.89, 0.92])  # seed 0 (the selection's winner) not reported
    rows += _mqar_rows("zpx_full", [0.5, 0.97, 0.98, 0.97, 0.99])  # far above: better
    rows += _mqar_rows("zpx_angle", [0.5, 0.93, 0.91, 0.89, 0.90])  # overlapping: within noise
    rows += _mqar_rows("softmax_srpe", [0.5, 0.88, 0.93, 0.95, 0.86])
    for v in ("baseline", "zpx_full", "zpx_angle", "softmax_srpe"):  # the other lrs of stage 1, worse on validation
        rows += [_row(v, "mqar", 0, lr, 0.1) for lr in (3e-4, 3e-3)]
    meta = {"command": "c", "date": "d", "machine": "m"}
    text = report.write_evidence(_done(rows), cells, EVIDENCE, {}, meta, [], None, tmp_path / "e", figures=False)
    assert not re.search(r"\{[a-z_]+\.[a-z_]+\}", text)  # no f-string placeholder left unformatted
    verdicts = json.loads((tmp_path / "e.json").read_text())["verdicts"]
    better, noise = verdicts["zpx_full|accuracy|mqar"], verdicts["zpx_angle|accuracy|mqar"]
    accuracy = {
        v: [r["accuracy"] for r in rows if r["variant"] == v and r["lr"] == 1e-3] for v in ("baseline", "zpx_full")
    }
    assert better["diff"] == pytest.approx(np.mean(accuracy["zpx_full"][1:]) - np.mean(accuracy["baseline"][1:]))
    assert better["n"] == [4, 4] and better["family"] == noise["family"] == "zpx_ladder" and better["m"] == 2
    # Bonferroni over the family's two tests; the verdict is the corrected interval's
    raw = stats.welch(accuracy["zpx_full"][1:], accuracy["baseline"][1:])["p"]
    assert better["p_adjusted"] == pytest.approx(min(1.0, 2 * raw)) and better["level"] == 1 - 0.05 / 2
    assert better["verdict"] == "better" and better["ci"][0] > 0
    interval = stats.welch_interval(accuracy["zpx_full"][1:], accuracy["baseline"][1:], 1 - 0.05 / 2)
    assert better["ci"] == pytest.approx(list(interval), rel=1e-12)
    assert noise["verdict"] == "within noise" and noise["ci"][0] <= 0 <= noise["ci"][1]
    for r in verdicts.values():  # one rule: never an interval excluding 0 beside "within noise"
        if r["status"] == "tested":
            assert (r["verdict"] != "within noise") == (not r["ci"][0] <= 0 <= r["ci"][1]) == (r["p_adjusted"] < 0.05)
    # SRPE is its own claim's family (m = 1), the exact tests beside Welch with their smallest p
    srpe = verdicts["softmax_srpe|accuracy|mqar"]
    assert srpe["family"] == "srpe" and srpe["m"] == 1 and srpe["min_p_perm"] == pytest.approx(2 / 70)
    assert text.index("### Comparison families") < text.index("### Headline") < text.index("### Verdicts by claim")
    assert "No exact test in this family can pass its correction" in text  # 2/70 x 2 > 0.05
    assert "**Progress: 28 of 28 planned runs done" in text  # 4 variants x (3 lrs + 4 seeds)
    assert "zpx_full @ lr 0.001" in text


def test_degenerate_and_duplicate_comparisons_are_reported_not_tested(tmp_path):
    cells = [plan.Cell(v, "nbody", 3, 0) for v in ("baseline", "pct", "pct_tuned")]
    rows = []
    for variant in ("baseline", *plan.members("pct_tuned")):
        for lr, value in zip(EVIDENCE.lrs, (0.3, 0.1, 0.2)):
            rows.append(_row(variant, "nbody", 0, lr, value if variant != "pct" else value / 2))
    for seed, (base, pct) in enumerate([(0.2, 0.1), (0.21, 0.12)], start=1):
        rows.append(_row("baseline", "nbody", seed, 1e-3, 0.1, position_mse=base, energy_drift=0.4))
        rows.append(_row("pct", "nbody", seed, 1e-3, 0.05, position_mse=pct, energy_drift=0.3))
    lines, verdicts = report.family_verdicts(_done(rows), cells, EVIDENCE)
    # pct_tuned selected pct@1e-3: the same runs, tested once (in pct's comparison)
    assert verdicts["pct|position_mse|nbody"]["status"] == "tested"
    assert verdicts["pct_tuned|position_mse|nbody"]["status"].startswith("same runs as PCT")
    # energy drift equal in every seed on both sides: degenerate, not tested; m counts the tested one only
    assert verdicts["pct|energy_drift|nbody"]["status"].startswith("degenerate: no variance")
    assert verdicts["pct|position_mse|nbody"]["m"] == 1
    assert "not run" in verdicts["pct|onestep_position_mse|nbody"]["status"]
    assert any("2 vs 2" in line and "degenerate: no variance" in line for line in lines)
    # every declared comparison is in exactly one family
    declared = [c for f in plan.comparison_families(EVIDENCE) for c in f.comparisons]
    assert len(declared) == len(set(declared)) and ("pct_tuned", "nbody", "position_mse") in declared


def test_a_cell_too_small_for_its_digits_prints_in_scientific_notation():
    rows = [{"onestep_position_mse": v} for v in (6.0e-9, 6.2e-9, 5.8e-9)]
    assert report._cell_text(rows, "onestep_position_mse", 4, 3, None) == "6.00e-09 ± 2.0e-10"
    rows = [{"position_mse": v} for v in (0.0071, 0.0075)]
    assert report._cell_text(rows, "position_mse", 4, 2, None) == "0.0073 ± 0.0003"
    # a gap below 0.01 keeps two significant digits instead of rounding to -0.001 [-0.002, -0.001]
    gap = {"diff": -0.0015, "ci": (-0.0021, -0.0009), "level": 0.99}
    assert report._delta_text(gap) == "Δ -1.5e-03 [-2.1e-03, -9.0e-04] at 99.00%"
    assert (
        report._delta_text({"diff": 0.186, "ci": (0.030, 0.450), "level": 0.995})
        == "Δ +0.186 [+0.030, +0.450] at 99.50%"
    )
    assert report._delta_text({"diff": -0.08998}) == "Δ -0.090"


# ---- LRA ListOps ------------------------------------------------------------------------------------------------


def test_a_listops_evidence_job_selects_on_validation_with_curves():
    spec = SIZES["evidence_smoke"]
    width = models.width_table(spec, ["baseline"], ["listops"], 0.1)["baseline/listops"]
    job = {"variant": "baseline", "task": "listops", "seed": 0, "lr": 3e-3, "spec": asdict(spec)}
    row = runs.run_job({**job, "width": width})
    assert row["status"] == "ok", row.get("traceback")
    assert [s for s, _ in row["val_curve"]] == [4, 8, 16] and row["val_curve"][-1][1] == row["val_accuracy"]
    assert row["shape"] == [spec.eval_examples, 1] and row["flops_per_step"] > 0
    # validation and test expressions come from their own hash buckets: disjoint from each other and training
    params = spec.budgets["listops"].params
    val = {tuple(r["input_ids"]) for r in tasks.lm_examples("listops", 40, protocol.VAL_SEED, params)}
    test = {tuple(r["input_ids"]) for r in tasks.lm_examples("listops", 40, protocol.EVAL_SEED, params)}
    train = {
        tuple(r["input_ids"])
        for s in range(20)
        for r in tasks.lm_examples("listops", 8, training.train_seed(0, s), params)
    }
    assert not val & test and not train & (val | test)


def test_full_size_plans_listops_for_the_attention_variants_and_reports_the_lra_claim(tmp_path):
    full = SIZES["full"]
    assert full.budgets["listops"].params == {"min_length": 500, "max_length": 2000, "max_depth": 10, "max_args": 10}
    assert tasks.io_shape("listops", full.budgets["listops"], full)["max_pos"] == 2002
    cells = [c for c in plan.evidence_cells(list(full.budgets), max_seeds=full.seeds) if c.task == "listops"]
    assert [(c.name, c.seeds, c.tier) for c in cells] == [(v, 5, 0) for v in plan.ATTENTION]
    assert not [c for c in plan.evidence_cells(list(EVIDENCE.budgets)) if c.task == "listops"]
    hours = plan.estimate(cells, full, {}, workers=1)
    assert 0 < hours["total"] < math.inf
    fingerprint = full.budgets["listops"].fingerprint()
    rows = []
    for variant, accuracies in (("baseline", [0.30, 0.32, 0.31, 0.33, 0.29]), ("pct", [0.60, 0.62, 0.61, 0.63, 0.64])):
        for seed, acc in enumerate(accuracies):
            hits = np.zeros((512, 1), bool)
            hits[: round(acc * 512)] = True
            row = {"variant": variant, "task": "listops", "seed": seed, "lr": 1e-3, "status": "ok"}
            row |= {"variant_revision": models.variant_revision(variant)} if variant == "pct" else {}
            row |= {"protocol": full.protocol, "budget": fingerprint, "val_accuracy": acc}
            rows.append({**row, **runs.hit_metrics(hits, "", bits=True)})
        rows += [{**rows[-1], "seed": 0, "lr": lr, "val_accuracy": 0.1} for lr in (3e-4, 3e-3)]
    cells = [c for c in cells if c.name in ("baseline", "pct")]
    meta = {"command": "c", "date": "d", "machine": "m"}
    done = plan.index_rows(rows, full)
    text = report.write_evidence(done, cells, full, {}, meta, [], None, tmp_path / "f", figures=False)
    assert "### LRA ListOps" in text and "| ListOps acc ↑ |" in text
    assert "LRA (the seed names no LRA task; here ListOps, expressions of < 2000 tokens): PCT defaults better" in text


def test_the_versor_claim_says_where_versor_is_not_parameter_matched():
    widths = {
        "baseline/nbody": {"hidden": 128, "intermediate": 336, "params": 409_982, "matched": True},
        "versor_hybrid/nbody": {"hidden": 512, "intermediate": 6144, "params": 233_646, "matched": False},
        "baseline/mqar": {"hidden": 128, "intermediate": 336, "params": 468_704, "matched": True},
        "versor_hybrid/mqar": {"hidden": 512, "intermediate": 6144, "params": 468_624, "matched": True},
    }
    line = next(x for x in report.evidence_claims({}, EVIDENCE, None, widths) if x.startswith("- Versor"))
    assert "NOT parameter-matched: Versor at its width cap (hidden 512) has 233,646 vs the baseline's 409,982" in line
    assert (
        "Recall (parameter-matched on the total, 468,624 vs the baseline's 468,704 parameters): MQAR undecided" in line
    )
    split = {"versor_hybrid/mqar": {"body": 202_384}, "baseline/mqar": {"body": 402_144}}
    line = next(x for x in report.evidence_claims({}, EVIDENCE, None, widths, split) if x.startswith("- Versor"))
    assert "468,704 parameters; bodies 202,384 vs 402,144 without embeddings and heads): MQAR" in line
    assert "parameter counts not recorded" in report.evidence_claims({}, EVIDENCE, None)[-2]


def test_nbody_references_say_when_no_model_infers_the_hidden_velocity(monkeypatch):
    reference = {
        "const_velocity_position_mse": 0.0085,
        "static_position_mse": 0.0276,
        "const_velocity_onestep_position_mse": 1.2e-8,
        "const_velocity_energy_drift": 0.143,
        "simulator_energy_drift": 1e-4,
        "mass10_const_velocity_position_mse": 0.285,
        "mass10_static_position_mse": 0.321,
        "hidden_velocity_static_position_mse": 0.0288,
        "hidden_velocity_const_velocity_position_mse": 0.0085,
    }
    cells = [plan.Cell("baseline", "nbody", 2, 0), plan.Cell("versor_hybrid", "nbody", 2, 0)]

    def seed_rows(rows_by_cell):  # the cells' seed rows as plan.reported_rows would select them
        monkeypatch.setattr(plan, "reported_rows", lambda cell, done, spec: rows_by_cell[cell.name])

    stuck = {
        "baseline": [{"hidden_velocity_position_mse": 0.0286}] * 2,
        "versor_hybrid": [{"hidden_velocity_position_mse": 0.0284}] * 2,
    }
    seed_rows(stuck)
    line = report.nbody_reference_lines({}, cells, EVIDENCE, reference)[0]
    assert "static positions 0.0276" in line and "10x mass: constant velocity 0.2850" in line
    assert "tested on 3 / 7) needs one token per body" in line and "nbody_geometry" in line  # named: where it runs
    # (0.0288 - 0.0284) / (0.0288 - 0.0085) = 2%: at the static level, said so
    assert "the variants score 0.0284-0.0286, 1%-2% of the way" in line and "none infers the momentum" in line
    learned = {**stuck, "versor_hybrid": [{"hidden_velocity_position_mse": 0.0100}] * 2}
    seed_rows(learned)
    line = report.nbody_reference_lines({}, cells, EVIDENCE, reference)[0]
    assert "none infers" not in line and "1%-93% of the way" in line


def test_the_same_length_table_gives_the_baselines_long_needle_calibration(tmp_path):
    needle = {"num_needles": 2, "num_distractors": 2, "num_digits": 2, "compact": True}

    def trial(name, length, curve, **other):
        budget = {"steps": 2400, "batch": 8, "lr": 1e-3, "params": {"length": length, **needle, **other}}
        return {"trial": name, "task": "passkey", "seed": 0, "budget": budget, "curve": curve, "steps_done": 2400}

    path = tmp_path / "trials.jsonl"
    for row in (
        trial("long", 512, [[200, 0.11, 1.0], [2400, 0.08, 9.0]]),
        trial("trained_length", 80, [[800, 0.94, 1.0]]),  # not longer than the training length: not listed
        trial("other_format", 512, [[800, 0.5, 1.0]], num_digits=3),  # another needle format: not listed
    ):
        append_row(path, row)
    lines = report.long_needle_calibration(asdict(EVIDENCE), path)
    assert "`long` (512 tokens, batch 8, lr 0.001, seed 0): best 0.110, final 0.080 after 2,400 steps." in lines[0]
    assert "trained_length" not in lines[0] and "other_format" not in lines[0]


def test_a_needle_column_no_variant_learned_is_named_and_its_claims_say_so():
    column = {"key": "passkey_digit_acc@1x", "label": "needle acc @512", "higher": True}
    guess = {0: "00a0", 1: "0a00"}  # per-example bits of one constant guess, per seed

    def rows(bits_of_seed, loss=2.33):
        return [
            {"seed": s, "passkey_bits@1x": b, "passkey_digit_acc@1x": 0.1, "final_train_loss": loss}
            for s, b in bits_of_seed.items()
        ]

    rows_of = {("baseline", "passkey_long"): rows(guess), ("pct", "passkey_long"): rows(guess, 2.35)}
    notes = report.learned_nothing_columns(rows_of, [("passkey_long", column)])
    note = notes[("passkey_long", "passkey_digit_acc@1x")]
    assert "exactly the same test examples in every seed" in note and "2.33-2.35 against ln 10 = 2.30" in note
    # one seed where the two differ: some model learned something, no note
    rows_of[("pct", "passkey_long")] = rows({0: "00a0", 1: "ffff"})
    assert report.learned_nothing_columns(rows_of, [("passkey_long", column)]) == {}
    # a column that is not a needle column is never judged this way
    other = {"key": "accuracy", "label": "MQAR acc", "higher": True}
    assert report.learned_nothing_columns({("baseline", "mqar"): rows(guess)}, [("mqar", other)]) == {}

    # such a column is degenerate: reported as such, never tested
    cells = [plan.Cell(v, "passkey_long", 3, 3) for v in ("baseline", "pct")]
    rows = [_row(v, "passkey_long", 0, lr, 0.1) for v in ("baseline", "pct") for lr in EVIDENCE.lrs]
    for v in ("baseline", "pct"):
        rows += [
            _row(v, "passkey_long", s, 3e-4, 0.1, **{"passkey_digit_acc@1x": 0.1 + s / 100, "passkey_bits@1x": b})
            for s, b in {1: "00a0", 2: "0a00"}.items()
        ]
    verdicts = report.family_verdicts(_done(rows), cells, EVIDENCE)[1]
    assert verdicts["pct|passkey_digit_acc@1x|passkey_long"]["status"].startswith("degenerate: no model learned")
    claim = report._claim(verdicts, "pct", column["key"], "passkey_long")
    assert claim.startswith("not tested (degenerate: no model learned")


# ---- what the rows say about the protocol (audit) ----------------------------------------------------------------


def test_convergence_names_a_budget_that_measures_speed_of_learning():
    cells = [plan.Cell(v, "mqar", 3, 0) for v in ("baseline", "zpx_full")]
    rows = [_row(v, "mqar", 0, lr, x) for v in ("baseline", "zpx_full") for lr, x in zip(EVIDENCE.lrs, (0.5, 0.9, 0.8))]
    rows += [_row("baseline", "mqar", s, 1e-3, 0.9, final_train_loss=x) for s, x in ((1, 0.03), (2, 0.29))]
    rows += [_row("zpx_full", "mqar", s, 1e-3, 0.9, final_train_loss=x) for s, x in ((1, 0.01), (2, 0.10))]
    entries = audit.convergence(_done(rows), cells, EVIDENCE)
    assert [(e["cell"], e["converged"], e["seeds"]) for e in entries] == [("baseline", 1, 2), ("zpx_full", 2, 2)]
    assert math.isclose(audit.CONVERGED_LOSS, -math.log(0.9))  # the answers' likelihood at the recall bar
    text = "\n".join(audit.convergence_markdown(entries, EVIDENCE))
    assert "**mqar at 300 steps measures speed of learning**: 1 of 4 reported runs did not converge" in text
    assert "1 of 2 cells converged in every seed" in text
    table = "\n".join(report.evidence_tables(_done(rows), cells, EVIDENCE))  # said under the values as well
    assert "mqar: 1 of 4 reported runs did not converge in 300 steps (final training loss > 0.105)" in table
    done = [r for r in rows if r.get("final_train_loss", 0) != 0.29]
    done.append(_row("baseline", "mqar", 2, 1e-3, 0.9, final_train_loss=0.05))
    assert "speed of learning" not in "\n".join(
        audit.convergence_markdown(audit.convergence(_done(done), cells, EVIDENCE), EVIDENCE)
    )
    # N-body: a regression loss has no bar, so its budget is named as speed of learning, with the losses
    nbody = [plan.Cell("baseline", "nbody", 3, 0)]
    runs = [_row("baseline", "nbody", 0, lr, x) for lr, x in zip(EVIDENCE.lrs, (-0.1, -0.3, -0.2))]
    runs += [_row("baseline", "nbody", s, 1e-3, -0.3, final_train_loss=x) for s, x in ((1, 0.12), (2, 0.2))]
    entries = audit.convergence(_done(runs), nbody, EVIDENCE)
    assert [(e["cell"], e["converged"], e["seeds"]) for e in entries] == [("baseline", None, 2)]
    text = "\n".join(audit.convergence_markdown(entries, EVIDENCE))
    assert "| baseline / nbody | 300 | no bar | 0.120 - 0.200 |" in text
    assert "**nbody at 300 steps measures speed of learning**" in text and "(training losses 0.120 - 0.200)" in text


def test_body_parameters_exclude_embedding_and_head_and_nbody_flops_match_its_training_step():
    spec = SIZES["evidence_smoke"]
    widths = models.width_table(spec, ["baseline", "versor_hybrid"], ["mqar", "nbody"], 0.1)
    for key in ("baseline/mqar", "versor_hybrid/mqar"):
        variant, task = key.split("/")
        split = audit.parameter_split(variant, widths[key], task, spec)
        torch.manual_seed(0)
        model = models.build_model(
            variant, widths[key], spec.layers, spec.heads, tasks.io_shape(task, spec.budgets[task], spec)
        )
        named = dict(model.named_parameters())
        vocab_sized = {n: p.numel() for n, p in named.items() if p.shape[0] == 260}  # token embedding, LM head
        assert split["total"] == sum(p.numel() for p in named.values()) == widths[key]["params"]
        assert split["embedding"] + split["head"] == sum(vocab_sized.values()) and len(vocab_sized) == 2
        assert split["body"] == split["total"] - sum(vocab_sized.values())
    regressor = audit.parameter_split("baseline", widths["baseline/nbody"], "nbody", spec)
    assert regressor["body"] == audit.parameter_split("baseline", widths["baseline/mqar"], "mqar", spec)["body"]
    # the derived N-body FLOPs are those of the suite's own training step (its data, normaliser and loss)
    budget = spec.budgets["nbody"]
    torch.manual_seed(0)
    model = models.build_model(
        "baseline", widths["baseline/nbody"], spec.layers, spec.heads, tasks.io_shape("nbody", budget, spec)
    )
    train = torch.tensor(nbody.nbody_data(budget.params, 1, budget.params["train_trajectories"])["states"])
    norm = nbody.Normaliser(train, budget.params.get("target", "delta"))
    real = runs.step_flops(model, nbody.training_loss(model, train, norm, budget, 1, "cpu"))
    assert real > 0 and audit.nbody_step_flops("baseline", widths["baseline/nbody"], spec) == real


def test_compute_matched_reads_the_variant_at_the_baselines_total_flops():
    cells = [plan.Cell(v, "mqar", 2, 0) for v in ("baseline", "pct")]
    rows = [_row(v, "mqar", 0, lr, x) for v in ("baseline", "pct") for lr, x in zip(EVIDENCE.lrs, (0.5, 0.9, 0.8))]
    rows.append(_row("baseline", "mqar", 1, 1e-3, 0.9, flops_per_step=100, val_curve=[[150, 0.2], [300, 0.6]]))
    rows.append(_row("pct", "mqar", 1, 1e-3, 0.9, flops_per_step=200, val_curve=[[75, 0.1], [150, 0.3], [300, 0.7]]))
    entries = {e["cell"]: e for e in audit.compute_table(_done(rows), cells, EVIDENCE, {})}
    pct = entries["pct"]
    assert (pct["ratio"], pct["total"], entries["baseline"]["total"]) == (2.0, 200 * 300, 100 * 300)
    # the baseline's 300 steps of FLOPs buy PCT 150 steps: its curve there, beside the baseline's end
    assert pct["matched"] == {"step": 150.0, "variant": 0.3, "baseline": 0.6, "baseline_step": 300, "variant_end": 0.7}
    rows[-1]["flops_per_step"] = 160  # 187.5 steps: interpolated between 150 and 300
    pct = {e["cell"]: e for e in audit.compute_table(_done(rows), cells, EVIDENCE, {})}["pct"]
    assert pct["matched"]["variant"] == pytest.approx(0.3 + 0.4 * 37.5 / 150)
    assert "0.400 at step 188 vs the baseline's 0.600 at 300" in "\n".join(audit.compute_markdown([pct]))


def test_lr_ranges_use_the_copy_floor_and_constant_velocity_and_are_written_to_cite(tmp_path):
    floor = audit.task_floor("mqar", EVIDENCE)
    assert floor == pytest.approx(1 / 4 + (3 / 4) / 26)  # 4 pairs: copying a context value, not 1/26
    tokens = EVIDENCE.val_examples * 8
    above = floor + 3.2 * math.sqrt(floor * (1 - floor) / tokens)  # just above the floor's 3 standard errors
    at = floor + 2.8 * math.sqrt(floor * (1 - floor) / tokens)
    rows = [_row("zpx_full", "mqar", 0, lr, x, shape=[512, 8]) for lr, x in zip(EVIDENCE.lrs, (at, above, 0.95))]
    rows += [_row("baseline", "mqar", 0, lr, x, shape=[512, 8]) for lr, x in zip(EVIDENCE.lrs, (0.95, 0.92, 0.5))]
    reference = {"val_const_velocity_position_mse": 0.008}
    # N-body learns by the rollout against constant velocity, whatever the selection score says
    nbody_runs = zip(EVIDENCE.lrs, (0.009, 0.007, 0.006), (-0.5, 0.1, 0.2))
    rows += [_row("pct", "nbody", 0, lr, score, val_position_mse=x) for lr, x, score in nbody_runs]
    entries = {(e["variant"], e["task"]): e for e in audit.lr_ranges(_done(rows), EVIDENCE, reference)}
    zpx = entries[("zpx_full", "mqar")]
    assert [r["verdict"] for r in zpx["runs"]] == ["at the floor", "above the floor, below the bar", "learned"]
    assert (zpx["range"], zpx["above"]) == ([3e-3], [1e-3, 3e-3])
    assert entries[("pct", "nbody")]["range"] == [1e-3, 3e-3]
    text = "\n".join(audit.lr_range_markdown(list(entries.values()), EVIDENCE, reference))
    assert "zpx_full on mqar (not at 0.0003, 0.001)" in text  # narrower than the baseline's, named
    cells = [plan.Cell(v, "mqar", 2, 0) for v in ("baseline", "zpx_full")]
    meta = {"command": "c", "date": "d", "machine": "m"}
    report.write_evidence(_done(rows), cells, EVIDENCE, {}, meta, [], None, tmp_path / "e", figures=False)
    cited = json.loads((tmp_path / "e_lr_ranges.json").read_text())
    assert (
        cited["zpx_full/mqar"]["range"] == [3e-3]
        and "lr range that learns" in (tmp_path / "e_lr_ranges.md").read_text()
    )
    configurations = "\n".join(audit.configurations_markdown(plan.evidence_cells(["mqar"]), EVIDENCE))
    assert "= 9 configurations against 3 for every other cell" in configurations and "were not tuned" in configurations


def test_lr_boundary_reruns_the_suite_jobs_where_the_baseline_alone_learned_and_never_seed_0(tmp_path):
    suite = plan.index_rows(read_rows(RESULTS / "ablation_evidence.jsonl"), EVIDENCE)
    for task, lr, variants in lr_boundary.BOUNDARY:
        assert variants[0] == "baseline" and audit.learns(suite[("baseline", task, 0, lr)], EVIDENCE, None) == "learned"
        for variant in variants[1:]:  # seed 0 of each other variant did not learn at that lr
            assert audit.learns(suite[(variant, task, 0, lr)], EVIDENCE, None) != "learned", (variant, task)
    assert all(seed != 0 for _, _, seed, _ in lr_boundary.jobs(lr_boundary.SEEDS))
    with pytest.raises(SystemExit):
        lr_boundary.main(["--seeds", "0", "1", "--render"])


def test_nbody_picks_that_under_fit_are_named_beside_the_references():
    cell = plan.Cell("baseline", "nbody", 5, 0)
    # validation rollout falls as the lr rises while the training loss rises: the rollout pick is the under-fit
    fits = {3e-4: (0.0080, 0.20), 1e-3: (0.0079, 0.12), 3e-3: (0.0072, 0.17), 1e-2: (0.0071, 0.36)}
    rows = [_row("baseline", "nbody", 0, lr, v, final_train_loss=loss) for lr, (v, loss) in fits.items()]
    rows.append(_row("baseline", "nbody", 0, 3e-2, 0.0075, final_train_loss=0.5))
    note = report.underfit_note(_done(rows), [cell], EVIDENCE)
    assert "baseline at lr 0.01 (training loss 0.360; 0.120 at lr 0.001)" in note
    assert note.startswith(" Selected on validation rollout and one-step error together")  # EVIDENCE's rule
    fine = [r if r["lr"] != 1e-2 else {**r, "final_train_loss": 0.2} for r in rows]  # under 2x the best: no note
    assert report.underfit_note(_done(fine), [cell], EVIDENCE) == ""
