"""Result rows: the jsonl files every run is appended to at once, and where a row came from (commit, machine)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parents[1] / "results"
ROOT = RESULTS.parents[1]
# the baseline's calibration trials (calibrate.py), read by the report as well
CALIBRATION_TRIALS = RESULTS / "calibration_trials.jsonl"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a results jsonl; a line cut by an interruption (the last one) is ignored."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one row to a results jsonl, flushed to disk: a finished run survives an interruption."""
    with open(path, "a") as log:
        log.write(json.dumps(row) + "\n")
        log.flush()
        os.fsync(log.fileno())


def provenance(root: Path = ROOT) -> dict[str, Any]:
    """The code a row ran: `git rev-parse HEAD` and whether tracked files differ from it (results excluded,
    since the suite appends to them)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": True}
    return {"commit": commit, "dirty": bool(status.strip())}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} CPU cores, torch {torch.__version__}, Python {platform.python_version()}"
