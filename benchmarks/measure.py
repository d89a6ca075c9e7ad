"""Measurement helpers shared by the benchmark scripts (each point runs in a fresh worker process)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Any


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_growth(base: int) -> int:
    """Growth of this process's peak RSS over `base` bytes (the CPU peak-memory measure)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base


def run_worker(script: str, spec: list[Any], timeout: float = 1800, env: dict[str, str] | None = None) -> dict:
    """Run `script --worker <spec as JSON>` in a fresh Python; its last stdout line is the JSON result.
    Failures come back as {"error": "..."} so one bad point does not end a benchmark."""
    try:
        completed = subprocess.run(
            [sys.executable, script, "--worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout > {timeout:.0f}s"}
    if completed.returncode != 0:
        lines = (completed.stderr or "").strip().splitlines()
        return {"error": lines[-1][:160] if lines else f"exit {completed.returncode}"}
    return json.loads(completed.stdout.strip().splitlines()[-1])
