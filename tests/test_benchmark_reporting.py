"""Reporting code of the benchmark suite: README injection, ablation aggregation, verdicts, findings and the
seed-claim check on a small fixed results file; resumable-suite bookkeeping; task lengths of every size."""

import csv
import json
import math
import time
from pathlib import Path

import pytest
from helpers_benchmarks import load_benchmark

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


measure = load_benchmark("measure")  # imported by ablation_runs
stats = load_benchmark("ablation_stats")  # imported by ablation_runs
update_readme = load_benchmark("update_readme")
models = load_benchmark("ablation_models")
report = load_benchmark("ablation_report")
load_benchmark("ablation_nbody")  # imported by ablation_runs and ablation
runs_module = load_benchmark("ablation_runs")
plan_module = load_benchmark("ablation_plan")  # imported by ablation
ablation = load_benchmark("ablation")


def test_inject_replaces_only_existing_markers_with_results(tmp_path):
    (tmp_path / "ablation_small.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |")
    readme = (
        "intro\n<!-- BEGIN: ablation_small -->\nold table\n<!-- END: ablation_small -->\n"
        "<!-- BEGIN: other -->\nkeep me\n<!-- END: other -->\ntail\n"
    )
    text, updated = update_readme.inject(readme, tmp_path)
    assert updated == ["ablation_small"]
    assert text == (
        "intro\n<!-- BEGIN: ablation_small -->\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- END: ablation_small -->\n"
        "<!-- BEGIN: other -->\nkeep me\n<!-- END: other -->\ntail\n"
    )
    assert update_readme.inject(text, tmp_path)[0] == text  # idempotent


def test_update_readme_check_mode(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "x.md").write_text("new\n")
    readme = tmp_path / "README.md"
    readme.write_text("<!-- BEGIN: x -->\nold\n<!-- END: x -->\n")
    assert update_readme.main(["--readme", str(readme), "--results", str(results), "--check"]) == 1
    assert update_readme.main(["--readme", str(readme), "--results", str(results)]) == 0
    assert readme.read_text() == "<!-- BEGIN: x -->\nnew\n<!-- END: x -->\n"
    assert update_readme.main(["--readme", str(readme), "--results", str(results), "--check"]) == 0


def test_readme_tables_match_the_committed_results():
    """Every generated section of the README and docs/ equals its benchmarks/results/<name>.md (no hand-typed
    numbers)."""
    seen: set[str] = set()
    for page in update_readme.pages(BENCH.parent):
        text = page.read_text(encoding="utf-8")
        prefix = "../" if page.parent.name == "docs" else ""
        refreshed, updated = update_readme.inject(text, BENCH / "results", prefix)
        seen |= set(updated)
        assert refreshed == text, f"{page.name} is stale: run `python benchmarks/update_readme.py`"
    assert {"zpx_memory_cpu", "main_job", "ablation_small", "bench_attention", "ablation_evidence"} <= seen


def test_generated_links_are_relative_to_their_page():
    """A results file's link to benchmarks/results/x.png reads ../benchmarks/results/x.png inside docs/."""
    text = "<!-- BEGIN: x -->\n<!-- END: x -->\n"
    results = BENCH / "results"
    name = "bench_attention"
    text = text.replace("x", name)
    in_docs, _ = update_readme.inject(text, results, "../")
    at_root, _ = update_readme.inject(text, results)
    assert "](../benchmarks/results/bench_attention.png)" in in_docs
    assert "](benchmarks/results/bench_attention.png)" in at_root


def test_verdict_uses_sum_of_stds():
    assert report.verdict((0.9, 0.01), (0.8, 0.02), higher_better=True) == "better"
    assert report.verdict((0.9, 0.05), (0.8, 0.06), higher_better=True) == "~"
    assert report.verdict((2.0, 0.1), (1.5, 0.1), higher_better=False) == "worse"
    assert report.verdict((float("nan"), 0.0), (1.0, 0.0), higher_better=False) == "-"


SPEC = {
    "hidden": 128,
    "layers": 2,
    "heads": 4,
    "budgets": {
        "mqar": {
            "steps": 400,
            "batch": 64,
            "lr": 0.001,
            "params": {"num_pairs": 4},
            "weight_decay": 0.01,
            "warmup": 50,
        },
        "passkey": {
            "steps": 600,
            "batch": 32,
            "lr": 0.001,
            "params": {"length": 96},
            "weight_decay": 0.01,
            "warmup": 50,
        },
    },
    "eval_examples": 256,
    "passkey_multiples": [1, 8],
    "passkey_eval_examples": 64,
    "seeds": 3,
    "versor_max_hidden": None,
}


def _fixed_runs():
    """Three seeds each; chosen so every verdict and claim outcome below follows by hand."""
    rows = []
    table = {
        # variant: (mqar accuracy per seed, needle answer accuracy @1x per seed, the same @8x per seed)
        "baseline": ([0.95, 0.97, 0.99], [1.0, 0.96, 0.98], [0.10, 0.20, 0.30]),
        "softmax_srpe": ([0.90, 0.92, 0.94], [0.98, 0.98, 0.98], [0.05, 0.05, 0.05]),
        "zpx_full": ([0.99, 0.99, 0.99], [0.97, 0.99, 0.98], [0.15, 0.25, 0.35]),
        "pct": ([0.50, 0.52, 0.54], [0.90, 0.92, 0.94], [0.80, 0.82, 0.84]),
    }
    for variant, (mqar, em1, em8) in table.items():
        for seed in range(3):
            rows.append({"variant": variant, "task": "mqar", "seed": seed, "accuracy": mqar[seed], "status": "ok"})
            rows.append(
                {
                    "variant": variant,
                    "task": "passkey",
                    "seed": seed,
                    "passkey_digit_acc@1x": em1[seed],
                    "passkey_digit_acc@8x": em8[seed],
                    "status": "ok",
                }
            )
    rows.append({"variant": "versor_hybrid", "task": "mqar", "seed": 0, "status": "failed: RuntimeError: x"})
    return rows


def test_report_turns_a_fixed_results_file_into_the_expected_table_findings_and_claims(tmp_path):
    runs = _fixed_runs()
    (tmp_path / "fixed.jsonl").write_text("\n".join(json.dumps(r) for r in runs) + "\n")
    runs = ablation.read_rows(tmp_path / "fixed.jsonl")
    widths = {
        f"{v}/{t}": {"hidden": 128, "intermediate": 336, "params": 1000, "matched": True}
        for v in report.VARIANT_LABELS
        for t in ("mqar", "passkey")
    }
    meta = {
        "command": "python benchmarks/ablation.py --size medium",
        "date": "d",
        "machine": "m",
        "seeds": 3,
        "wall_minutes": 1.0,
    }
    variants = ["baseline", "softmax_srpe", "zpx_full", "pct", "versor_hybrid"]
    text = report.write_outputs(
        runs, widths, SPEC, meta, variants, ["mqar", "passkey"], None, tmp_path / "fixed", figures=False
    )
    assert text == (tmp_path / "fixed.md").read_text()
    lines = text.splitlines()
    assert "| variant | MQAR acc ↑ | needle acc @1x (96) ↑ | needle acc @8x (768) ↑ |" in lines
    assert "| softmax + RoPE (baseline) | 0.970 ± 0.020 | 0.980 ± 0.020 | 0.200 ± 0.100 |" in lines
    assert "| PCT (sigmoid, complex) | 0.520 ± 0.020 | 0.920 ± 0.020 | 0.820 ± 0.020 |" in lines
    assert "| Versor hybrid | not run | - | - |" in lines
    assert "- versor_hybrid / mqar: failed: RuntimeError: x" in lines
    assert (
        "- MQAR acc: best zpx_full (0.990); baseline 0.970 ± 0.020; better than baseline beyond noise: none; "
        "worse: softmax_srpe, pct." in lines
    )
    assert (
        "- needle acc @8x (768): best pct (0.820); baseline 0.200 ± 0.100; better than baseline beyond noise: pct; "
        "worse: softmax_srpe." in lines
    )
    assert "| PCT (sigmoid, complex) | worse | worse | better |" in lines
    claims = [
        line
        for line in lines
        if line.startswith("- PCT, ") or line.startswith("- Versor, ") or line.startswith("- ZPX, ")
    ]
    assert claims[0].endswith("reproduced: PCT 0.820 ± 0.020 vs baseline 0.200 ± 0.100 at 8x.")
    assert "undecided: the Versor or baseline N-body runs did not finish." in claims[1]
    assert claims[2].endswith(
        "mqar reproduced: 0.990 ± 0.000 vs softmax + SRPE 0.920 ± 0.020; "
        "passkey not reproduced (within noise): 0.980 ± 0.010 vs softmax + SRPE 0.980 ± 0.000."
    )
    saved = json.loads((tmp_path / "fixed.json").read_text())
    assert {(r["variant"], r["task"]) for r in saved["aggregate"]} == {
        (v, t) for v in variants[:4] for t in ("mqar", "passkey")
    }
    with open(tmp_path / "fixed.csv") as f:
        rows = list(csv.DictReader(f))
    assert next(r for r in rows if r["variant"] == "pct" and r["task"] == "mqar")["n"] == "3"


def test_a_single_seed_is_not_compared_with_the_baseline():
    runs = [r for r in _fixed_runs() if r.get("status") == "ok" and r["task"] == "mqar"]
    runs = [r for r in runs if r["variant"] != "pct" or r["seed"] == 0]
    by = {(r["variant"], r["task"]): r for r in report.summarise(runs)}
    columns = report.metric_columns(SPEC, ["mqar"])
    line = report.findings(by, columns, ["baseline", "softmax_srpe", "pct"], None)[2]
    assert line.endswith("worse: softmax_srpe; one seed only, not compared: pct.")


def test_pct_claim_is_undecided_when_the_baseline_does_not_learn_the_needle():
    runs = [r for r in _fixed_runs() if r.get("status") == "ok"]
    for r in runs:
        if r["variant"] == "baseline" and r["task"] == "passkey":
            r["passkey_digit_acc@1x"] = 0.3
    by = {(r["variant"], r["task"]): r for r in report.summarise(runs)}
    line = report.claims(by, SPEC, None)[2]
    assert line.startswith("- PCT, ") and "undecided: the baseline did not learn the needle" in line


def test_summarise_skips_failed_runs_and_aggregates_seeds():
    runs = [
        {"variant": "baseline", "task": "mqar", "seed": 0, "accuracy": 0.5, "params": 10, "status": "ok"},
        {"variant": "baseline", "task": "mqar", "seed": 1, "accuracy": 0.7, "params": 10, "status": "ok"},
        {"variant": "pct", "task": "mqar", "seed": 0, "status": "failed: RuntimeError: x"},
    ]
    rows = report.summarise(runs)
    assert len(rows) == 1
    assert rows[0]["accuracy_mean"] == pytest.approx(0.6)
    assert rows[0]["accuracy_std"] == pytest.approx(math.sqrt(0.02))


def test_resume_keeps_rows_of_the_current_budget_and_skips_them(tmp_path):
    spec = ablation.SIZES["medium"]
    mqar = spec.budgets["mqar"].fingerprint()
    path = tmp_path / "runs.jsonl"
    rows = [
        {"variant": "baseline", "task": "mqar", "seed": 0, "budget": mqar, "status": "ok", "accuracy": 0.9},
        {"variant": "baseline", "task": "mqar", "seed": 1, "budget": "old-budget", "status": "ok", "accuracy": 0.1},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"variant": "baseline", "task"')  # cut last line
    kept = ablation.current_rows(ablation.read_rows(path), spec)
    assert [(r["seed"], r["accuracy"]) for r in kept] == [(0, 0.9)]
    jobs = ablation.plan(spec, ["versor_hybrid@time", "pct", "baseline"], ["mqar", "nbody"], 2)
    assert jobs[:4] == [
        ("baseline", "mqar", 0),
        ("baseline", "nbody", 0),
        ("baseline", "mqar", 1),
        ("baseline", "nbody", 1),
    ]
    assert jobs[4:6] == [("versor_hybrid@time", "nbody", 0), ("versor_hybrid@time", "nbody", 1)]  # claim runs
    assert [j[0] for j in jobs[6:]] == ["pct"] * 4 + ["versor_hybrid@time"] * 2
    # runs that decide a seed claim (here PCT's needle, Versor's N-body) come right after the baseline
    jobs = ablation.plan(spec, ["pct", "versor_hybrid", "baseline"], ["passkey", "mqar", "nbody"], 1)
    assert jobs == [
        ("baseline", "mqar", 0),
        ("baseline", "passkey", 0),
        ("baseline", "nbody", 0),
        ("pct", "passkey", 0),
        ("versor_hybrid", "nbody", 0),
        ("pct", "mqar", 0),
        ("pct", "nbody", 0),
        ("versor_hybrid", "mqar", 0),
        ("versor_hybrid", "passkey", 0),
    ]


def test_wall_clock_matched_training_runs_for_the_seconds_not_the_step_budget():
    import torch

    budget = runs_module.TaskBudget(steps=3, batch=1, lr=1e-3, warmup=1)
    weight = torch.nn.Linear(2, 1)

    def loss_fn(step):
        time.sleep(0.01)
        return weight(torch.ones(1, 2)).pow(2).sum()

    assert runs_module.train_loop(weight, loss_fn, budget)["steps_done"] == 3
    # a model faster per step than the baseline keeps training until the baseline's seconds are spent
    matched = runs_module.train_loop(weight, loss_fn, budget, seconds=0.2)
    assert 3 < matched["steps_done"] <= 3 * runs_module.WALL_CLOCK_STEP_CAP
    assert matched["train_seconds"] >= 0.2 or matched["steps_done"] == 3 * runs_module.WALL_CLOCK_STEP_CAP


def test_task_sequence_lengths_fit_generators():
    for spec in ablation.SIZES.values():
        for task in (t for t in ("mqar", "selective_copy", "spiral", "passkey", "passkey_long") if t in spec.budgets):
            params = spec.budgets[task].params
            length = runs_module.task_seq_len(task, params)
            rows = runs_module.lm_examples(task, 3, 0, params)
            assert all(len(r["input_ids"]) == sum(r["attention_mask"]) == length for r in rows), (task, length)
            batch = runs_module.as_batch(rows)
            assert batch["input_ids"].shape == (3, length)


def test_versor_claim_uses_the_best_versor_row_and_the_constant_velocity_reference():
    runs = []
    for seed, (base, versor) in enumerate([(0.010, 0.004), (0.012, 0.005), (0.011, 0.006)]):
        runs.append({"variant": "baseline", "task": "nbody", "seed": seed, "position_mse": base, "status": "ok"})
        runs.append(
            {"variant": "versor_hybrid@time", "task": "nbody", "seed": seed, "position_mse": versor, "status": "ok"}
        )
        runs.append({"variant": "versor_gpa", "task": "nbody", "seed": seed, "position_mse": 0.02, "status": "ok"})
    by = {(r["variant"], r["task"]): r for r in report.summarise(runs)}
    line = report.claims(by, SPEC, {"const_velocity_position_mse": 0.05})[3]
    assert line.endswith(
        "reproduced: best Versor row Versor hybrid, wall-clock-matched 0.0050 ± 0.0010 vs baseline "
        "0.0110 ± 0.0010 (constant velocity 0.0500)."
    )
    line = report.claims(by, SPEC, {"const_velocity_position_mse": 0.001})[3]
    assert "undecided: neither model beats constant-velocity extrapolation" in line
