"""Inject generated Markdown from benchmarks/results/<name>.md into README.md and docs/*.md between markers.

    python benchmarks/update_readme.py            # rewrite README.md and every docs/*.md page in place
    python benchmarks/update_readme.py --check    # exit 1 if any section differs from its results file

A section is `<!-- BEGIN: name -->` ... `<!-- END: name -->`; its body is replaced by the content of
benchmarks/results/<name>.md when that file exists. Results files write links relative to the repository
root; in a page under docs/ they are rewritten relative to that page. Markers without a results file, and
all text outside markers, are left untouched; no marker is ever added or removed.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = re.compile(r"(<!-- BEGIN: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- END: (?P=name) -->)", re.DOTALL)
LINK = re.compile(r"(\]\()(?!https?:|#|/|mailto:)([^)\s]+)\)")


def pages(root: Path = ROOT) -> list[Path]:
    """The files that hold generated sections: the README and every page of docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def relative_links(text: str, prefix: str) -> str:
    """Markdown link targets relative to the repository root, made relative to a page `prefix` deep."""
    return LINK.sub(lambda m: f"{m.group(1)}{prefix}{m.group(2)})", text) if prefix else text


def inject(readme: str, results: Path, prefix: str = "") -> tuple[str, list[str]]:
    """Page text with every section that has a results file refreshed; also the names refreshed.
    `prefix` ("../" for a page in docs/) is put before the results' relative link targets."""
    updated: list[str] = []

    def replace(match: re.Match[str]) -> str:
        path = results / f"{match['name']}.md"
        if not path.is_file():
            return match.group(0)
        body = relative_links(path.read_text(encoding="utf-8"), prefix)
        if body and not body.endswith("\n"):
            body += "\n"
        updated.append(match["name"])
        return match.group(1) + body + match.group(4)

    return SECTION.sub(replace, readme), updated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", type=Path, help="one page to refresh (default: README.md and docs/*.md)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--check", action="store_true", help="report stale sections instead of writing")
    args = parser.parse_args(argv)

    stale = False
    for page in [args.readme] if args.readme else pages():
        prefix = "../" if page.parent.name == "docs" else ""
        original = page.read_text(encoding="utf-8")
        text, updated = inject(original, args.results, prefix)
        if args.check:
            if text != original:
                print(f"{page}: sections out of date with {args.results}; run benchmarks/update_readme.py")
                stale = True
            else:
                print(f"{page}: up to date ({', '.join(updated) or 'no generated sections'})")
            continue
        if text != original:
            page.write_text(text, encoding="utf-8")
        print(f"{page}: refreshed {', '.join(updated) or 'nothing (no markers with a results file)'}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
