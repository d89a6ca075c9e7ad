"""Reporting code of the benchmark suite: README injection and ablation aggregation / verdicts."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


update_readme = _load("update_readme")
ablation = _load("ablation")


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
    """Every generated README section equals its benchmarks/results/<name>.md (no hand-typed numbers)."""
    readme = BENCH.parent / "README.md"
    text = readme.read_text(encoding="utf-8")
    refreshed, updated = update_readme.inject(text, BENCH / "results")
    assert {"zpx_memory_cpu", "main_job", "ablation_small", "bench_attention"} <= set(updated)
    assert refreshed == text, "README is stale: run `python benchmarks/update_readme.py`"


def test_verdict_uses_sum_of_stds():
    assert ablation.verdict((0.9, 0.01), (0.8, 0.02), higher_better=True) == "better"
    assert ablation.verdict((0.9, 0.05), (0.8, 0.06), higher_better=True) == "~"
    assert ablation.verdict((2.0, 0.1), (1.5, 0.1), higher_better=False) == "worse"
    assert ablation.verdict((float("nan"), 0.0), (1.0, 0.0), higher_better=False) == "-"


def test_summarise_skips_failed_runs_and_aggregates_seeds():
    spec = ablation.SIZES["small"]
    runs = [
        {"variant": "baseline", "task": "mqar", "seed": 0, "accuracy": 0.5, "params": 10, "status": "ok"},
        {"variant": "baseline", "task": "mqar", "seed": 1, "accuracy": 0.7, "params": 10, "status": "ok"},
        {"variant": "pct", "task": "mqar", "seed": 0, "status": "failed: RuntimeError: x"},
    ]
    rows = ablation.summarise(runs, spec, ["mqar"])
    assert len(rows) == 1
    assert rows[0]["accuracy_mean"] == pytest.approx(0.6)
    assert rows[0]["accuracy_std"] == pytest.approx(math.sqrt(0.02))
    meta = {"command": "c", "date": "d", "machine": "m", "seeds": 2, "wall_minutes": 1.0}
    widths = {"baseline/mqar": {"hidden": 64, "intermediate": 168, "params": 10, "matched": True}}
    text = ablation.markdown(rows, runs, widths, spec, meta, ["baseline", "pct"], ["mqar"], None)
    assert "| softmax + RoPE (baseline) | 0.600 ± 0.141 |" in text
    assert "| PCT (sigmoid, complex) | not run |" in text
    assert "pct / mqar: failed: RuntimeError: x" in text


def test_task_sequence_lengths_fit_generators():
    for spec in ablation.SIZES.values():
        for task in ("mqar", "selective_copy", "spiral", "passkey"):
            rows = ablation.lm_examples(task, 3, 0, spec)
            length = ablation.task_seq_len(task, spec)
            assert all(len(r["input_ids"]) == length for r in rows)
            if task != "selective_copy":  # the others fill their length exactly (no padding)
                assert all(sum(r["attention_mask"]) == length for r in rows)
