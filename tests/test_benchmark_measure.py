"""benchmarks/measure.py, the one way every benchmark measures: interleaved rounds, per-round ratios, the CPU
peak memory of a first call in a fresh process, and worker processes whose failures come back as data."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import measure

BENCH = Path(measure.__file__).parent  # the bench scripts run from here and import `measure` by name


def test_interleaved_times_reverses_the_order_skips_warmup_and_drops_a_failing_run():
    calls = []

    def run(name):
        return lambda: calls.append(name)

    def self_timed():
        calls.append("c")
        return 0.25  # timed itself: recorded instead of the wall clock around it

    def failing():
        calls.append("f")
        raise ValueError("boom")

    runs = {"a": run("a"), "b": run("b"), "c": self_timed, "f": failing}
    times, errors = measure.interleaved_times(runs, rounds=3, warmup=1)
    # warm-up round in order, then reversed, forward, reversed; "f" is not called again after it raised
    assert calls == ["a", "b", "c", "f", "c", "b", "a", "a", "b", "c", "c", "b", "a"]
    assert errors == {"f": "ValueError: boom"}
    assert times["c"] == [0.25, 0.25, 0.25]
    assert len(times["a"]) == len(times["b"]) == 3 and all(t > 0 for t in times["a"] + times["b"])
    assert times["f"] == [] and "f" not in measure.medians(times)


def test_median_ratio_is_the_median_of_per_round_ratios_not_a_ratio_of_medians():
    times = {"model": [1.0, 10.0, 1.0], "baseline": [1.0, 10.0, 2.0]}  # per round: 1, 1, 0.5
    assert measure.median_ratio(times, "model", "baseline") == 1.0
    medians = measure.medians(times)
    assert medians["model"] / medians["baseline"] == 0.5  # what a ratio of medians would have said
    with pytest.raises(ValueError, match="is shorter than argument 1"):  # rounds of different runs never pair up
        measure.median_ratio({"model": [1.0, 2.0], "baseline": [1.0]}, "model", "baseline")


def _fresh_python(code: str) -> str:
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, cwd=BENCH
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def test_cpu_peak_memory_of_a_first_call_counts_what_it_allocates():
    mib = 2**20
    out = _fresh_python(
        f"""
        import json, measure
        size = {64 * mib}
        def allocate():
            block = b"\\x01" * size  # written, so resident
            del block
        print(json.dumps([measure.peak_memory(lambda: None), measure.peak_memory(allocate)]))
        """
    )
    nothing, allocated = json.loads(out)
    assert 0 <= nothing < 4 * mib
    assert 64 * mib * 0.95 <= allocated <= 64 * mib * 1.25


def test_run_worker_returns_the_last_stdout_line_or_the_error(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, time
            spec = json.loads(sys.argv[2])
            if spec[0] == "fail":
                raise ValueError("bad point " + str(spec[1]))
            if spec[0] == "sleep":
                time.sleep(30)
            if spec[0] == "silent":
                sys.exit(0)
            print("progress noise")
            if spec[0] == "text":
                sys.exit(0)
            print(json.dumps({"twice": 2 * spec[1]}))
            """
        )
    )
    assert measure.run_worker(str(script), ["ok", 21]) == {"twice": 42}
    assert measure.run_worker(str(script), ["fail", 7]) == {"error": "ValueError: bad point 7"}
    assert measure.run_worker(str(script), ["sleep", 0], timeout=1) == {"error": "timeout > 1s"}
    assert measure.run_worker(str(script), ["silent", 0]) == {"error": "the worker printed no result line"}
    assert measure.run_worker(str(script), ["text", 0]) == {
        "error": "the worker's last line is not JSON: progress noise"
    }
