"""benchmarks/bench_conversion.py at its tiny sizes: the three arms of a seed, the converted model equal to the Llama
at step 0, rows written as each cell finishes and skipped on a rerun, the table rendered from the rows."""

import math

import pytest

from benchmarks import bench_conversion
from benchmarks.evidence.rows import read_rows

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py


def test_tiny_run_writes_resumable_rows_and_the_table(tmp_path):
    flags = ["--tiny", "--seeds", "0", "--results", str(tmp_path), "--work", str(tmp_path / "work")]
    assert bench_conversion.main(flags) == 0
    rows = read_rows(tmp_path / "bench_conversion.jsonl")
    assert [row["arm"] for row in rows] == list(bench_conversion.ARMS)
    converted, llama, scratch = rows
    # the converted ZPX computes the Llama's function at step 0 (float32, two code paths)
    assert math.isclose(converted["step0"]["bits_per_byte"], llama["step0"]["bits_per_byte"], rel_tol=1e-6)
    assert not math.isclose(scratch["step0"]["bits_per_byte"], llama["step0"]["bits_per_byte"], rel_tol=1e-3)
    assert all(value != 0 for layer in converted["lambdas_end"]["angle"] for value in layer)
    for row in rows:  # trained: every arm's held-out loss went down
        assert row["final"]["bits_per_byte"] < row["step0"]["bits_per_byte"]
        assert set(row["final"]) >= {f"{task}_token_accuracy" for task in bench_conversion.TASKS}
    table = (tmp_path / "bench_conversion.md").read_text()
    assert "At step 0 the converted ZPX's held-out bits per byte equal the Llama's" in table
    assert "| Llama converted to ZPX, continued |" in table and "--tiny --seeds 0" in table
    # a rerun skips the finished cells (and the pretrained Llama is reused, not trained again)
    pretrained = next((tmp_path / "work").rglob("pretraining.json")).stat().st_mtime_ns
    assert bench_conversion.main(flags) == 0
    assert read_rows(tmp_path / "bench_conversion.jsonl") == rows
    assert next((tmp_path / "work").rglob("pretraining.json")).stat().st_mtime_ns == pretrained
