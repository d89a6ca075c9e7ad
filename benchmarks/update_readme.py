"""Inject generated Markdown from benchmarks/results/<name>.md into README.md between existing markers.

    python benchmarks/update_readme.py            # rewrite README.md in place
    python benchmarks/update_readme.py --check    # exit 1 if any section differs from its results file

A section is `<!-- BEGIN: name -->` ... `<!-- END: name -->`; its body is replaced by the content of
benchmarks/results/<name>.md when that file exists. Markers without a results file, and all text outside
markers, are left untouched; no marker is ever added or removed.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = re.compile(r"(<!-- BEGIN: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- END: (?P=name) -->)", re.DOTALL)


def inject(readme: str, results: Path) -> tuple[str, list[str]]:
    """README text with every section that has a results file refreshed; also the names refreshed."""
    updated: list[str] = []

    def replace(match: re.Match[str]) -> str:
        path = results / f"{match['name']}.md"
        if not path.is_file():
            return match.group(0)
        body = path.read_text(encoding="utf-8")
        if body and not body.endswith("\n"):
            body += "\n"
        updated.append(match["name"])
        return match.group(1) + body + match.group(4)

    return SECTION.sub(replace, readme), updated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--check", action="store_true", help="report stale sections instead of writing")
    args = parser.parse_args(argv)

    original = args.readme.read_text(encoding="utf-8")
    text, updated = inject(original, args.results)
    if args.check:
        if text != original:
            print(f"{args.readme}: sections out of date with {args.results}; run benchmarks/update_readme.py")
            return 1
        print(f"{args.readme}: up to date ({', '.join(updated) or 'no generated sections'})")
        return 0
    if text != original:
        args.readme.write_text(text, encoding="utf-8")
    print(f"{args.readme}: refreshed {', '.join(updated) or 'nothing (no markers with a results file)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
