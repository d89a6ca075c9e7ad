"""How every benchmark measures: one clock per kind of figure, medians over interleaved rounds, peak memory of
a first call, and a fresh worker process per point.

* Speed: wall-clock seconds (`time.perf_counter`, CUDA synchronised before and after the timed call). Every
  speed figure in the results is a median over rounds after `warmup` untimed rounds; the runs compared take
  turns inside one process, the order reversed every round, so load from other processes and cache effects
  hit them alike, and a ratio to a baseline comes from the same rounds (`median_ratio`: the median of the
  per-round ratios). Run benchmarks on an otherwise idle machine: wall time counts everything.
* Peak memory: bytes a call adds at its peak over what existed before it (`peak_memory`). On the CPU it is the
  growth of the process's peak RSS over the RSS just before the *first* call, in a fresh worker process: a
  warm-up call would leave the allocator holding the op's buffers, so the measured call would reuse them and
  the op's peak would disappear from the RSS. The peak is the process's own high-water mark (VmHWM, reset to
  the current RSS just before the call), not getrusage's ru_maxrss: Linux carries the parent's peak into a
  child across fork + exec, so a fresh worker's ru_maxrss starts at its driver's peak and would hide any op
  that peaks below it. On CUDA it is `torch.cuda.max_memory_allocated` above the
  memory allocated before the call, after one warm-up call: the CUDA allocator's statistics count live
  tensors, not cached blocks, so a warm-up hides nothing there and keeps Triton's compilation and autotuning
  buffers out of the figure.
* `run_worker`: each point in its own Python process, so one point's allocations, compiled kernels or crash do
  not reach the next.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

clock = time.perf_counter  # the one speed clock: wall-clock seconds


def synchronize(device: str) -> None:
    """Wait for queued CUDA work (no-op on the CPU), so a clock reading covers the work itself."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def interleaved_times(
    runs: dict[str, Callable[[], Any]], rounds: int, warmup: int = 1, device: str = "cpu"
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """({name: [seconds per timed round]}, {name: error}): every run once per round, order reversed every round.

    `warmup` first rounds are not recorded. A run that returns a float has timed itself (the part after its own
    untimed set-up, read with `clock`): that number is recorded instead. A run that raises is dropped from later
    rounds and its error kept, so one failing variant does not end a benchmark."""
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    errors: dict[str, str] = {}
    for index in range(warmup + rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            if name in errors:
                continue
            synchronize(device)
            start = clock()
            try:
                inside = runs[name]()
            except Exception as error:  # any error: recorded, the other runs go on
                errors[name] = f"{type(error).__name__}: {error}"[:200]
                continue
            synchronize(device)
            seconds = clock() - start
            if index >= warmup:
                times[name].append(inside if isinstance(inside, float) else seconds)
    return times, errors


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Median seconds of each run's timed rounds."""
    return {name: statistics.median(values) for name, values in times.items() if values}


def median_ratio(times: dict[str, list[float]], name: str, baseline: str) -> float:
    """Median over rounds of `name`'s time / `baseline`'s time in the same round."""
    return statistics.median(t / b for t, b in zip(times[name], times[baseline], strict=True))


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's own peak resident set size since the last `reset_peak_rss` (VmHWM; module docstring)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line: CPU peak memory needs Linux")


def reset_peak_rss() -> None:
    """Lower this process's peak RSS to its current RSS (Linux >= 4.0, `/proc/self/clear_refs` value 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_memory(call: Callable[[], Any], device: str = "cpu") -> int:
    """Peak bytes `call` adds over what exists before it (see the module docstring for why the CPU measures the
    first call and CUDA the call after one warm-up). Call it once per fresh worker process on the CPU."""
    if not str(device).startswith("cuda"):
        reset_peak_rss()
        base = rss_bytes()
        call()
        return max(peak_rss_bytes() - base, 0)
    import torch

    call()  # compilation, autotuning
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return max(torch.cuda.max_memory_allocated() - base, 0)


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
    lines = completed.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else {"error": "the worker printed no result line"}
    except json.JSONDecodeError:
        return {"error": f"the worker's last line is not JSON: {lines[-1][:120]}"}
