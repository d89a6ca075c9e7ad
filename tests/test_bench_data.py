"""benchmarks/bench_data.py's guards: the run_clm recipe refused up front when its Arrow files would not fit the
scratch disk, and the scratch folder deleted when a measurement fails."""

import shutil
import sys
from collections import namedtuple

import pytest

from benchmarks import bench_data

Usage = namedtuple("Usage", "total used free")


def test_the_recipe_is_refused_up_front_when_the_scratch_disk_is_short(tmp_path, monkeypatch, capsys):
    free = {"bytes": 21e9}
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(0, 0, free["bytes"]))
    scratch = tmp_path / "not" / "yet"  # measured on its nearest existing parent
    message = bench_data.recipe_disk_shortfall(scratch, 1e9)  # needs 20 x 1 GB + 2 GB
    assert "needs about 22.0 GB free" in message and "21.0 GB are" in message
    free["bytes"] = 22e9
    assert bench_data.recipe_disk_shortfall(scratch, 1e9) is None
    free["bytes"] = 21e9
    monkeypatch.setattr(bench_data, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bench_data, "generate_corpus", lambda path, size: path.write_text("x") and int(size * 1e6))
    monkeypatch.setattr(bench_data, "run_child", lambda *_: pytest.fail("measured on a disk too short for run_clm"))
    monkeypatch.setattr(sys, "argv", ["bench_data.py", "--sizes-mb", "50", "1000", "--scratch", str(scratch)])
    with pytest.raises(SystemExit) as stopped:
        bench_data.main()
    assert stopped.value.code == 2 and "run_clm on a 1000 MB corpus needs" in capsys.readouterr().err
    assert not (tmp_path / "results").exists() and not scratch.exists()  # nothing measured, nothing written


def test_the_scratch_folder_is_deleted_when_a_measurement_fails(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"

    def failing(kind, corpus, cache):
        cache.mkdir(parents=True)
        (cache / "part.arrow").write_bytes(b"x")
        raise RuntimeError(f"{kind} failed")

    monkeypatch.setattr(bench_data, "run_child", failing)
    monkeypatch.setattr(bench_data, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(bench_data.signal, "signal", lambda *_: None)  # keep pytest's own SIGTERM handling
    argv = ["bench_data.py", "--sizes-mb", "0.01", "--runs", "zpx", "--scratch", str(scratch)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(RuntimeError, match="zpx failed"):
        bench_data.main()
    assert not scratch.exists()
