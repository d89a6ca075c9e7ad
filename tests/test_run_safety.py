"""Run folders under concurrent jobs, kills, partial writes and wrong inputs (issue 25): nothing lost, nothing silent.

- one lock per folder: a second job on a folder in use stops in one line (exit 2), and the lock is held for the
  whole job;
- one identity check: an explicit checkpoint of another run or family, `merged_output_dir` pointed at the base
  model or at another run, are refused naming both;
- resume takes the newest *complete* checkpoint (truncated trainer state or weights are skipped, named), refuses
  model-only checkpoints, and finishes a run killed after its last step;
- a failed overwrite gives the folder back to the run it held; reports are written atomically;
- LoRA targets that match no module are refused, not dropped.

Round three (issue 38): an overwrite deletes only a run's own folder (never a folder of other runs); nothing is
written through a symbolic link; a resumed checkpoint is verified (complete optimizer state, the sha256 of every
file recorded at save time), a bad one skipped by name or refused when named; a checkpoint of another run copied
into the folder is refused; a resume trains only the remaining steps.
"""

import json
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from helpers_training import SMALL, CountSteps, StopAt
from safetensors.torch import load_file
from transformers import TrainerCallback

from zpx_hf_train.config import ConfigError
from zpx_hf_train.finetune_lora import load_finetune_config, run_finetune
from zpx_hf_train.report import write_report
from zpx_hf_train.run_folder import (
    ASIDE,
    LOCK_FILE,
    MANIFEST,
    RUN_MARKER,
    FolderLock,
    RunFolder,
    atomic_write,
    checkpoint_problem,
    identity_of,
    read_marker,
)
from zpx_hf_train.train import load_run_config, main, run_training
from zpx_hf_train.trainer import TrainingDivergedError

ROOT = Path(__file__).resolve().parents[1]
MICRO = str(ROOT / "configs" / "test-micro.yaml")
LORA = str(ROOT / "configs" / "zpx-tiny-lora.yaml")
QUICK = ["--tasks", "mqar", "--eval_strategy", "no", "--logging_steps", "1"]

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py


def _train(output_dir, *flags, callbacks=()):
    return run_training(load_run_config(MICRO, [*QUICK, "--output_dir", str(output_dir), *flags]), callbacks=callbacks)


class KillAtTrainEnd(TrainerCallback):
    """Stands in for a kill after the last checkpoint, before the final save."""

    def on_train_end(self, args, state, control, **kwargs):
        raise KeyboardInterrupt


def _resume_last(out, capsys, max_steps):
    """`resume last` of the micro run in `out` up to `max_steps`: its result, the steps it trained, what it printed."""
    capsys.readouterr()
    steps = CountSteps()
    flags = ["--max_steps", str(max_steps), "--save_steps", "2", "--resume_from_checkpoint", "last"]
    return _train(out, *flags, callbacks=[steps]), steps.steps, capsys.readouterr()


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != LOCK_FILE}


class Poison(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs):
        with torch.no_grad():
            model.get_output_embeddings().weight[0, 0] = float("nan")


class TryLock(TrainerCallback):
    """Tries to take the output folder's lock mid-training, as a second job would."""

    def __init__(self):
        self.error = None

    def on_step_end(self, args, state, control, **kwargs):
        try:
            FolderLock(args.output_dir).acquire().release()
        except ConfigError as error:
            self.error = str(error)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished micro run: checkpoints 2 and 4, final model, marker."""
    out = tmp_path_factory.mktemp("finished") / "run"
    _train(out, "--max_steps", "4", "--save_steps", "2")
    return out


def test_second_job_on_a_folder_in_use_stops_in_one_line(tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    # another process holds the folder's lock, as a running job does (plain fcntl: no torch import to wait for)
    script = (
        "import fcntl, os, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "f.write(str(os.getpid())); f.flush(); print('locked', flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", script, str(out / LOCK_FILE)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main([MICRO, *QUICK, "--output_dir", str(out), "--max_steps", "2"]) == 2
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("zpx-train: config error")]
    assert len(lines) == 1 and f"{out} is in use by another job (pid {holder.pid})" in lines[0], err
    assert not (out / "model.safetensors").exists() and not (out / RUN_MARKER).exists()
    # the holder is gone (killed): its lock went with it, and the folder trains
    probe = TryLock()
    result = _train(out, "--max_steps", "2", "--save_strategy", "no", callbacks=[probe])
    assert result["trainer"].state.global_step == 2
    assert probe.error is not None and "is in use by another job" in probe.error  # held while training


def test_failed_overwrite_gives_the_folder_back_to_the_run_it_held(tmp_path, finished_run):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_FILE}
    with pytest.raises(TrainingDivergedError, match="the overwrite is undone: .* holds the run it held before"):
        _train(out, "--max_steps", "4", "--save_steps", "1", "--mqar_num_pairs", "3", "--overwrite_output_dir",
               "true", callbacks=[Poison()])  # fmt: skip
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_FILE}
    assert after == before  # old model, card, metrics and marker, no checkpoint of the failed run


def test_resume_skips_truncated_checkpoints_and_names_them(tmp_path, capsys):
    out = tmp_path / "run"
    _train(out, "--max_steps", "6", "--save_steps", "2", callbacks=[StopAt(4)])
    state = out / "checkpoint-4" / "trainer_state.json"
    text = state.read_text()
    state.write_text(text[: len(text) // 2])  # a kill while writing the state
    assert checkpoint_problem(out / "checkpoint-4") == "truncated trainer_state.json"
    resumed, steps, printed = _resume_last(out, capsys, max_steps=6)
    assert f"resuming from {out / 'checkpoint-2'}" in printed.out
    assert "not the newest checkpoint: skipped checkpoint-4 (truncated trainer_state.json)" in printed.err
    assert resumed["trainer"].state.global_step == 6 and steps == [3, 4, 5, 6]  # only the remaining steps

    # weights cut short under an intact state: refused when named explicitly, skipped by `resume last`
    weights = out / "checkpoint-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert checkpoint_problem(out / "checkpoint-6") == "truncated model.safetensors"
    with pytest.raises(ConfigError, match=r"checkpoint-6' is not a complete checkpoint \(truncated model.safetensors"):
        _train(out, "--max_steps", "8", "--resume_from_checkpoint", str(out / "checkpoint-6"))
    resumed, steps, printed = _resume_last(out, capsys, max_steps=8)
    assert f"resuming from {out / 'checkpoint-4'}" in printed.out  # re-saved whole by the resumed run
    assert "skipped checkpoint-6 (truncated model.safetensors)" in printed.err
    assert resumed["trainer"].state.global_step == 8 and steps == [5, 6, 7, 8]
    optimizer = out / "checkpoint-2" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])
    assert checkpoint_problem(out / "checkpoint-2") == "truncated optimizer.pt"


def test_resume_from_model_only_checkpoints_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    _train(out, "--max_steps", "6", "--save_steps", "2", "--save_only_model", "true", callbacks=[StopAt(2)])
    assert "warning: `training.save_only_model: true` saves model-only checkpoints" in capsys.readouterr().err
    assert not list((out / "checkpoint-2").glob("optimizer*"))
    with pytest.raises(ConfigError, match="checkpoint-2 is model-only .* would restart both silently"):
        _train(out, "--max_steps", "6", "--save_steps", "2", "--resume_from_checkpoint", "last")


def test_explicit_checkpoint_of_another_run_or_family_is_refused_naming_both(tmp_path, finished_run):
    other = finished_run / "checkpoint-2"
    flags = ["--max_steps", "4", "--mqar_num_pairs", "3", "--resume_from_checkpoint", str(other)]
    with pytest.raises(ConfigError, match=r"belongs to another zpx-train run \(zpx, .*\), not this zpx-train run"):
        _train(tmp_path / "fresh", *flags)  # same shapes, other data, into a fresh folder
    loose = tmp_path / "copied" / "checkpoint-2"  # copied out of its run folder: it still carries its marker
    shutil.copytree(other, loose)
    with pytest.raises(ConfigError, match="belongs to another zpx-train run"):
        _train(tmp_path / "fresh", *flags[:-1], str(loose))

    pct = tmp_path / "pct"
    pct_flags = [*QUICK, "--output_dir", str(pct), "--max_steps", "2", "--save_steps", "2", "--max_train_blocks", "8"]
    run_training(load_run_config(str(ROOT / "configs" / "pct-tiny.yaml"), pct_flags))
    with pytest.raises(
        ConfigError, match=r"another zpx-train run \(pct, config pct-tiny.yaml.*this zpx-train run \(zpx"
    ):
        _train(tmp_path / "fresh", "--max_steps", "4", "--resume_from_checkpoint", str(pct / "checkpoint-2"))
    assert not (tmp_path / "fresh" / "model.safetensors").exists()


def test_run_killed_after_its_last_step_is_finished_by_resume(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _train(out, "--max_steps", "4", "--save_steps", "2", callbacks=[KillAtTrainEnd()])
    assert not (out / "model.safetensors").exists() and not json.loads((out / RUN_MARKER).read_text())["finished"]
    steps = CountSteps()
    result = _train(out, "--max_steps", "4", "--save_steps", "2", "--resume_from_checkpoint", "last", callbacks=[steps])
    assert result["trainer"].state.global_step == 4 and steps.steps == []  # no step trained again, no extra one
    final, last = load_file(out / "model.safetensors"), load_file(out / "checkpoint-4" / "model.safetensors")
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
    assert (out / "metrics.json").exists() and json.loads((out / RUN_MARKER).read_text())["finished"]
    with pytest.raises(ConfigError, match="checkpoint-4 already reached step 4 and the run has finished"):
        _train(out, "--max_steps", "4", "--save_steps", "2", "--resume_from_checkpoint", "last")


@contextmanager
def _file_size_limit(limit):
    """Every write past `limit` bytes of a file fails part-way with EFBIG, as on a full disk."""
    import resource
    import signal

    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG as an OSError, not the signal's kill
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_reports_are_written_atomically(tmp_path):
    write_report(str(tmp_path), {"heldout": {"perplexity": 2.0, "bits_per_byte": 1.0, "tokens": 3}})
    good = {name: (tmp_path / name).read_text() for name in ("metrics.json", "report.md")}
    with pytest.raises(TypeError):
        write_report(str(tmp_path), {"heldout": {"perplexity": 2.0, "bits_per_byte": 1.0, "tokens": object()}})
    assert {name: (tmp_path / name).read_text() for name in good} == good
    with _file_size_limit(64), pytest.raises(OSError, match="File too large"):  # 64 bytes written, then it fails
        write_report(str(tmp_path), {"heldout": {"perplexity": 3.0, "bits_per_byte": 1.5, "tokens": 7}}, title="x")
    assert {name: (tmp_path / name).read_text() for name in good} == good  # the old files, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "report.md"]  # no temporary left


def _lora(tmp_path, base, merged, *flags):
    out = ["--output_dir", str(tmp_path / "adapter"), "--base_model", str(base)]
    run = load_finetune_config(LORA, [*SMALL, *out, *flags, *(["--merged_output_dir", str(merged)] if merged else [])])
    return run


def test_merged_output_dir_never_replaces_the_base_or_another_run(tmp_path, finished_run):
    untouched = {p: p.read_bytes() for p in finished_run.rglob("*") if p.is_file() and p.name != LOCK_FILE}
    with pytest.raises(ConfigError, match=r"key `merged_output_dir`: .* is the base model this job reads"):
        run_finetune(_lora(tmp_path, finished_run, finished_run))
    with pytest.raises(ConfigError, match=r"key `merged_output_dir`: .* is the base model this job reads"):
        run_finetune(_lora(tmp_path, finished_run, finished_run, "--overwrite_output_dir", "true"))
    other = tmp_path / "other-run"
    _train(other, "--max_steps", "1", "--save_strategy", "no")
    other_model = (other / "model.safetensors").read_bytes()
    with pytest.raises(ConfigError, match=r"key `merged_output_dir`: .*other-run is not empty"):
        run_finetune(_lora(tmp_path, finished_run, other))
    with pytest.raises(
        ConfigError, match=r"other-run holds another zpx-train run .* replaces only zpx-finetune-lora's"
    ):
        run_finetune(_lora(tmp_path, finished_run, other, "--overwrite_output_dir", "true"))
    assert (other / "model.safetensors").read_bytes() == other_model
    assert {p: p.read_bytes() for p in untouched} == untouched
    with pytest.raises(ConfigError, match="`lora.target_modules`: not_a_module match no module of the base model"):
        run_finetune(_lora(tmp_path, finished_run, None, "--target_modules", "q_proj", "not_a_module"))
    assert not (tmp_path / "adapter" / "adapter_config.json").exists()

    # a merged folder of its own: written, marked as this run's, and its base untouched
    result = run_finetune(_lora(tmp_path, finished_run, tmp_path / "merged", "--overwrite_output_dir", "true"))
    merged_marker = json.loads((tmp_path / "merged" / RUN_MARKER).read_text())
    assert merged_marker["job"] == "zpx-finetune-lora" and merged_marker["finished"]
    assert merged_marker["fingerprint"] == json.loads((tmp_path / "adapter" / RUN_MARKER).read_text())["fingerprint"]
    assert (tmp_path / "merged" / "model.safetensors").exists() and (tmp_path / "merged" / "README.md").exists()
    assert result["metrics"]["merge_max_abs_logit_difference_float64"] < 1e-10
    assert {p: p.read_bytes() for p in untouched} == untouched


def test_lora_run_killed_after_its_last_step_is_finished_by_resume(tmp_path, finished_run):
    flags = ["--save_strategy", "steps", "--save_steps", "2"]
    with pytest.raises(KeyboardInterrupt):
        run_finetune(_lora(tmp_path, finished_run, tmp_path / "merged", *flags), callbacks=[KillAtTrainEnd()])
    adapter = tmp_path / "adapter"
    assert not (adapter / "adapter_model.safetensors").exists() and not (tmp_path / "merged" / "config.json").exists()
    result = run_finetune(
        _lora(tmp_path, finished_run, tmp_path / "merged", *flags, "--resume_from_checkpoint", "last")
    )
    assert result["trainer"].state.global_step == 2
    final, last = (
        load_file(adapter / "adapter_model.safetensors"),
        load_file(adapter / "checkpoint-2" / "adapter_model.safetensors"),
    )
    assert final.keys() == last.keys() and all(torch.equal(final[k], last[k]) for k in final)
    assert (tmp_path / "merged" / "model.safetensors").exists()
    assert json.loads((adapter / RUN_MARKER).read_text())["finished"]
    assert json.loads((tmp_path / "merged" / RUN_MARKER).read_text())["finished"]


def test_unwritable_output_dir_and_a_refused_resume_fail_in_one_line_and_leave_nothing(tmp_path, capsys):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a folder")
    assert main([MICRO, *QUICK, "--output_dir", str(in_the_way), "--max_steps", "1"]) == 2
    fresh = tmp_path / "fresh"
    assert (
        main([MICRO, *QUICK, "--output_dir", str(fresh), "--max_steps", "1", "--resume_from_checkpoint", "last"]) == 2
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("zpx-train: config error")]
    assert len(err) == 2 and f"{in_the_way}' is a file, not a folder" in err[0], err
    assert "no complete checkpoint" in err[1], err
    assert in_the_way.read_text() == "not a folder" and not fresh.exists()  # the lock's folder went with it


def test_finishing_from_an_adapter_checkpoint_of_other_modules_stops_with_a_config_error(tmp_path, finished_run):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from zpx_hf_train.job import load_checkpoint_weights

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(finished_run), LoraConfig(target_modules=["q_proj"]))
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    save_file(
        {"base_model.model.no_such_module.lora_A.weight": torch.zeros(8, 4)}, checkpoint / "adapter_model.safetensors"
    )
    with pytest.raises(ConfigError, match="adapter weights the model does not have.*new --output_dir"):
        load_checkpoint_weights(model, str(checkpoint))


def test_overwrite_replaces_only_a_run_folder_never_a_folder_of_runs(tmp_path, finished_run, capsys):
    runs = tmp_path / "runs"  # `--output_dir runs` by mistake: no marker of its own, finished runs inside
    shutil.copytree(finished_run, runs / "a")
    shutil.copytree(finished_run, runs / "b")
    (runs / "notes.txt").write_text("mine")
    before = _files(runs)
    assert main([MICRO, *QUICK, "--output_dir", str(runs), "--max_steps", "1", "--overwrite_output_dir", "true"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("zpx-train:")]
    assert len(err) == 1 and f"{runs} has no run marker (zpx_run.json) of its own but holds a, b, notes.txt" in err[0]
    assert _files(runs) == before and not (runs / ASIDE).exists()

    # a run folder with another run inside it: replacing it would delete that run too
    outer = tmp_path / "outer"
    shutil.copytree(finished_run, outer)
    shutil.copytree(finished_run, outer / "nested" / "other")
    marker = json.loads((outer / "nested" / "other" / RUN_MARKER).read_text())
    (outer / "nested" / "other" / RUN_MARKER).write_text(json.dumps({**marker, "fingerprint": "another"}))
    before = _files(outer)
    with pytest.raises(ConfigError, match=r"holds other runs \(nested/other\); --overwrite_output_dir would delete"):
        _train(outer, "--max_steps", "1", "--overwrite_output_dir", "true")
    assert _files(outer) == before


def test_nothing_is_written_through_a_symbolic_link(tmp_path, finished_run, capsys):
    victim = tmp_path / "elsewhere.txt"  # a file outside the run folder
    victim.write_text("precious")
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(victim)  # planted, or copied with a folder
    assert main([MICRO, *QUICK, "--output_dir", str(out), "--max_steps", "1"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("zpx-train:")]
    assert len(err) == 1 and f"{out / LOCK_FILE} is a symbolic link (to {victim})" in err[0], err
    assert victim.read_text() == "precious"

    # a link among a run's files (a report, a checkpoint's file): the run is refused before it writes anything
    run = tmp_path / "linked"
    shutil.copytree(finished_run, run)
    (run / "metrics.json").unlink()
    (run / "metrics.json").symlink_to(victim)
    before = _files(run)
    for flags in (["--overwrite_output_dir", "true"], ["--max_steps", "6", "--resume_from_checkpoint", "last"]):
        with pytest.raises(ConfigError, match=r"metrics.json is a symbolic link .* remove the link"):
            _train(run, *flags)
    assert victim.read_text() == "precious" and _files(run) == before
    with pytest.raises(ConfigError, match="is a symbolic link"):  # every report, card and marker write
        atomic_write(run / "metrics.json", "{}")
    assert victim.read_text() == "precious"


def _flip_tensor_bytes(path):
    """Flip bytes inside the tensor data of a safetensors file, header and length intact."""
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 64, len(data) - 32):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_resume_verifies_complete_optimizer_state_and_checksums(tmp_path, capsys):
    out = tmp_path / "run"
    _train(out, "--max_steps", "8", "--save_steps", "2", callbacks=[StopAt(6)])
    manifest = json.loads((out / "checkpoint-6" / MANIFEST).read_text())["files"]
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", RUN_MARKER} <= set(manifest)
    (out / "checkpoint-6" / "optimizer.pt").unlink()  # the scheduler state stays
    _flip_tensor_bytes(out / "checkpoint-4" / "model.safetensors")
    assert checkpoint_problem(out / "checkpoint-6") == "no optimizer.pt (the optimizer state is incomplete)"
    assert checkpoint_problem(out / "checkpoint-4") == (
        f"model.safetensors changed since it was saved (sha256 differs from {MANIFEST})"
    )
    with pytest.raises(ConfigError, match=r"checkpoint-4' is not a complete checkpoint \(model.safetensors changed"):
        _train(out, "--max_steps", "8", "--resume_from_checkpoint", str(out / "checkpoint-4"))
    resumed, steps, printed = _resume_last(out, capsys, max_steps=8)
    assert f"resuming from {out / 'checkpoint-2'}" in printed.out
    assert (
        "warning: resuming from checkpoint-2, not the newest checkpoint: skipped checkpoint-6 (no optimizer.pt (the "
        "optimizer state is incomplete)); checkpoint-4 (model.safetensors changed since it was saved" in printed.err
    )
    assert resumed["trainer"].state.global_step == 8 and steps == [3, 4, 5, 6, 7, 8]

    # a trainer state of `{}` (and a checkpoint without its manifest) is named, not a TypeError
    (out / "checkpoint-8" / "trainer_state.json").write_text("{}")
    assert checkpoint_problem(out / "checkpoint-8") == "trainer_state.json has no global_step"
    (out / "checkpoint-6" / MANIFEST).unlink()  # re-saved whole by the resumed run, now without its manifest
    assert checkpoint_problem(out / "checkpoint-6").startswith(f"no {MANIFEST}, the checksums a save writes last")
    assert main([MICRO, *QUICK, "--output_dir", str(out), "--max_steps", "10", "--resume_from_checkpoint",
                 str(out / "checkpoint-8")]) == 2  # fmt: skip
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("zpx-train:")]
    assert len(err) == 1 and "is not a complete checkpoint (trainer_state.json has no global_step)" in err[0], err


def test_resume_last_refuses_a_checkpoint_of_another_run_copied_into_the_folder(tmp_path, finished_run, capsys):
    pct = tmp_path / "pct"
    pct_flags = [*QUICK, "--output_dir", str(pct), "--max_steps", "2", "--save_steps", "2", "--max_train_blocks", "8"]
    run_training(load_run_config(str(ROOT / "configs" / "pct-tiny.yaml"), pct_flags))
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    shutil.copytree(pct / "checkpoint-2", out / "checkpoint-32")
    flags = [MICRO, *QUICK, "--output_dir", str(out), "--max_steps", "40", "--resume_from_checkpoint", "last"]
    assert main(flags) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("zpx-train:")]
    assert len(err) == 1 and "checkpoint-32 belongs to another zpx-train run (pct, config pct-tiny.yaml" in err[0]
    assert err[0].endswith(f"move it out of {out}."), err
    assert not (out / "checkpoint-34").exists()


def test_an_overwrite_killed_midway_is_named_by_the_next_run(tmp_path, finished_run, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    old = identity_of(read_marker(out))
    config = load_run_config(MICRO, [*QUICK, "--output_dir", str(out), "--max_steps", "2", "--mqar_num_pairs", "3"])
    killed = RunFolder(out, identity_of({"fingerprint": config.fingerprint(), "config": "test-micro.yaml"}),
                       overwrite=True, resume_asked=False)  # fmt: skip
    killed.__enter__()  # the overwrite moved the old run aside and marked the folder ...
    killed.lock.release()  # ... then the process was killed: no restore, no finish
    (out / "checkpoint-1").mkdir()  # what the killed run had written
    assert (out / ASIDE / "model.safetensors").is_file() and not (out / "model.safetensors").exists()
    capsys.readouterr()
    assert main([MICRO, *QUICK, "--output_dir", str(out), "--max_steps", "2"]) == 2  # a run without flags
    err = capsys.readouterr().err
    assert f"warning: {out / ASIDE} holds the {old.describe()} that an interrupted overwrite replaced" in err
    assert f"the next run to finish in {out} deletes it. To restore it, delete every other entry of {out}" in err
