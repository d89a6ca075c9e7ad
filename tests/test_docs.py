"""The README and docs/ pages: a README a newcomer can read, and links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s#]+)(?:#[^)\s]*)?\)")


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; move detail into a docs/ page"
    long = [n for n, line in enumerate(lines, 1) if len(line) > 300]
    assert not long, f"README.md lines over 300 characters: {long}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    missing = [t for t in LINK.findall(text) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme and p.name != "evidence_superseded.md"]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_pre_commit_ruff_matches_the_dev_pin():
    """pre-commit and `make check` run one ruff: the hook's rev equals the dev extra's pin."""
    hook = re.search(r"ruff-pre-commit\n\s+rev: v([\d.]+)", (ROOT / ".pre-commit-config.yaml").read_text())
    pin = re.search(r'"ruff==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert hook and pin, "pin ruff in pyproject's dev extra and the pre-commit hook's rev"
    assert hook.group(1) == pin.group(1), f"pre-commit runs ruff {hook.group(1)}, the dev extra pins {pin.group(1)}"


def _recipe(makefile: str, target: str) -> list[str]:
    """The command lines of a Makefile target (tab-indented, after `target:`)."""
    lines = makefile.split(f"\n{target}:", 1)[1].splitlines()[1:]
    return [line.strip() for line in lines[: next((i for i, x in enumerate(lines) if not x.startswith("\t")), None)]]


def test_ci_and_pre_commit_type_check_with_the_pinned_mypy():
    """`.ci/run` runs `make check`, which runs mypy after ruff; the pre-commit hook runs `make typecheck`, the same
    .venv mypy that the dev extra pins exactly."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'"mypy==[\d.]+"', (ROOT / "pyproject.toml").read_text()), "pin mypy exactly in the dev extra"
    assert "make check" in (ROOT / ".ci" / "run").read_text()
    assert "$(VENV)/bin/mypy" in _recipe(makefile, "check"), "`make check` runs mypy"
    assert _recipe(makefile, "typecheck") == ["$(VENV)/bin/mypy"]
    hook = re.search(r"- id: mypy\n(?:\s+\w+: .*\n)*", (ROOT / ".pre-commit-config.yaml").read_text())
    assert hook and "entry: make typecheck" in hook.group(0) and "pass_filenames: false" in hook.group(0)
