"""benchmarks/update_readme.py: generated sections of the README and docs/ pages injected from
benchmarks/results, their check mode, and links made relative to each page."""

from pathlib import Path

from benchmarks import update_readme

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


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
