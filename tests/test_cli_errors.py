"""The CLI error boundary (`zpx_hf_train.cli.guarded`): an error the user can fix is one line on stderr and exit 2
(interrupted: 130), never a traceback; `--help` is short and exits 0; the YAML loader is bounded."""

import errno
import json
import os
import re
import signal
import stat
from pathlib import Path

import pytest
import torch
import yaml
from transformers import TrainerCallback, TrainingArguments

from zpx_hf_train.cli import guarded
from zpx_hf_train.config import ConfigError, read_yaml
from zpx_hf_train.finetune_lora import main as finetune_main
from zpx_hf_train.main_job import main as zpx_main
from zpx_hf_train.train import load_run_config, run_training
from zpx_hf_train.train import main as train_main

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "configs" / "test-micro.yaml"
QUICK = ["--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no", "--tasks", "mqar"]


PROGRESS_BAR = re.compile(r"\d+/\d+ \[")  # transformers' tqdm bars (loading, writing shards) share stderr


def _one_line(capsys, *expected):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS_BAR.search(line)]
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], err
    return lines[0]


def _has_dev_full():
    return os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)


needs_dev_full = pytest.mark.skipif(not _has_dev_full(), reason="no /dev/full (the Linux device that is always full)")


def _micro_text(**replace):
    """test-micro.yaml as text, with `key: old` lines replaced (so YAML-only spellings such as `.nan` survive)."""
    text = MICRO.read_text()
    for key, value in replace.items():
        lines = [line for line in text.splitlines() if line.strip().startswith(f"{key}:")]
        assert len(lines) == 1, key
        indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
        text = text.replace(lines[0], f"{indent}{key}: {value}")
    return text


def _write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ----------------------------------------------------------------------------------------------------
# Bounded YAML
# ----------------------------------------------------------------------------------------------------

BOMB = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]" for p, k in zip("abcdefgh", "bcdefghi")]
)  # 9^9 = 387 million strings once expanded, from 600 bytes


def test_alias_bomb_is_refused_before_anything_expands_it(tmp_path):
    path = _write(tmp_path, MICRO.read_text().replace("model:\n", f"{BOMB}\nmodel:\n"))
    with pytest.raises(ConfigError, match=r"line \d+: alias \*a is not allowed"):
        read_yaml(path)
    with pytest.raises(ConfigError, match="alias"):
        load_run_config(path)


def test_aliases_anywhere_are_refused(tmp_path):
    text = _micro_text(seq_len="&n 128", max_position_embeddings="*n")
    with pytest.raises(ConfigError, match=r"alias \*n is not allowed; write the value out"):
        read_yaml(_write(tmp_path, text))


def test_duplicate_keys_are_refused_with_the_line(tmp_path):
    text = MICRO.read_text().replace("  seq_len: 128\n", "  seq_len: 128\n  seq_len: 64\n")
    line = text.splitlines().index("  seq_len: 64") + 1
    with pytest.raises(ConfigError, match=rf"line {line}: duplicate key 'seq_len'; keep one"):
        load_run_config(_write(tmp_path, text))
    top = MICRO.read_text() + "model_type: pct\n"
    with pytest.raises(ConfigError, match="duplicate key 'model_type'"):
        read_yaml(_write(tmp_path, top))


def test_oversized_and_non_regular_config_files_are_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * 200_000)  # 2 MB of comments
    with pytest.raises(ConfigError, match="over the 1048576-byte limit"):
        read_yaml(str(big))
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    signal.signal(signal.SIGALRM, _hung)
    signal.alarm(30)  # today's reader blocks on a FIFO forever: fail instead of hanging the suite
    try:
        with pytest.raises(ConfigError, match="not a regular file"):
            read_yaml(str(fifo))
    finally:
        signal.alarm(0)


def _hung(signum, frame):
    raise TimeoutError("blocked reading a FIFO")


# ----------------------------------------------------------------------------------------------------
# One line, exit code 2, before training
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replace", "expected"),
    [
        ({"learning_rate": ".nan"}, "key `training.learning_rate` is NaN"),
        ({"learning_rate": ".inf"}, "key `training.learning_rate` is infinite"),
        ({"max_eval_blocks": "16\n  heldout_fraction: .nan"}, "key `data.heldout_fraction` is NaN"),
        ({"model_type": "zpx\nattn_implementation: flash_attention_2"}, "`attn_implementation` = 'flash_attention_2'"),
        ({"model_type": "zpx\nattn_implementation: bogus"}, "`attn_implementation` = 'bogus'"),
        ({"mqar_num_pairs": "30"}, "key `data.mqar_num_pairs`: mqar num_pairs=30 must be in [1, 26]"),
        ({"max_train_blocks": "0"}, "key `data.max_train_blocks` = 0 must be >= 1"),
        ({"model_type": "zpx\n1: x"}, "line 3: key 1 is a number, not a name; config keys are names such as `seed`"),
        ({"hidden_size": "32\n  32: x"}, "key 32 is a number, not a name"),
        ({"model_type": "zpx\n? [a, b]\n: 1"}, "line 3: key ['a', 'b'] is a list, not a name"),
        ({"seed": "4294967296"}, "key `training.seed` = 4294967296 must be in [0, 4294967295]"),
        ({"seed": "-1"}, "key `training.seed` = -1 must be in [0, 4294967295]"),
        ({"dataloader_num_workers": "-1"}, "key `training.dataloader_num_workers` = -1 must be >= 0"),
    ],
)
def test_bad_config_values_are_one_line(tmp_path, capsys, replace, expected):
    out = tmp_path / "out"
    assert train_main([_write(tmp_path, _micro_text(**replace)), "--output_dir", str(out)]) == 2
    _one_line(capsys, "zpx-train: config error:", expected)
    assert not out.exists()


def test_non_utf8_yaml_is_one_line(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(MICRO.read_bytes() + "# caf\xe9\n".encode("latin-1"))
    assert train_main([str(path)]) == 2
    _one_line(capsys, "not UTF-8 (byte 0xe9 at offset")


def test_output_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("not a folder")
    assert train_main([str(MICRO), "--output_dir", str(target)]) == 2
    _one_line(capsys, "key `training.output_dir`", "is a file, not a folder")
    assert train_main([str(MICRO), "--output_dir", str(target / "sub")]) == 2
    _one_line(capsys, "is a file, not a folder")


def test_read_only_output_folder_is_one_line(tmp_path, capsys, monkeypatch):
    # the suite may run as root, where no permission bit refuses a write: the OS answer is stood in for
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    assert train_main([str(MICRO), "--output_dir", str(locked / "run")]) == 2
    _one_line(capsys, "key `training.output_dir`", "is not writable")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--max_steps"], "--max_steps/--max-steps: expected one argument"),
        (["--max_steps", "abc"], "invalid int value: 'abc'"),
        (["--learning_rate", "nan"], "key `training.learning_rate` is NaN"),
    ],
)
def test_bad_flags_are_one_line_without_the_usage_of_every_field(tmp_path, capsys, flags, expected):
    assert train_main([str(MICRO), "--output_dir", str(tmp_path / "out"), *flags]) == 2
    _one_line(capsys, expected)


def test_zpx_main_own_flags(capsys):
    assert zpx_main(["--threads", "abc"]) == 2
    _one_line(capsys, "zpx-main: config error: --threads 'abc' must be a whole number >= 1")
    assert zpx_main(["--threads"]) == 2
    _one_line(capsys, "--threads needs a value")


@pytest.mark.parametrize(
    ("main", "argv", "first"),
    [
        (train_main, ["--help"], "Train, evaluate and save"),
        (train_main, [str(MICRO), "--help"], "Train, evaluate and save"),
        (train_main, [str(MICRO), "--max_steps", "3", "-h"], "Train, evaluate and save"),
        (finetune_main, ["--help"], "LoRA fine-tuning"),
        (zpx_main, ["--help"], "The README's main job"),
    ],
)
def test_help_is_short_and_exits_0(capsys, main, argv, first):
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(first) and captured.out.count("\n") < 40 and not captured.err


# ----------------------------------------------------------------------------------------------------
# Errors during the run: files, a full disk, LoRA bases, Ctrl-C
# ----------------------------------------------------------------------------------------------------


@needs_dev_full
def test_the_boundary_turns_real_os_errors_into_one_line_and_lets_bugs_through(tmp_path, capsys):
    def full_disk():
        with open("/dev/full", "w") as f:
            f.write("x")  # ENOSPC at flush, as on a full disk

    assert guarded(full_disk, "zpx-train") == (2, None)
    _one_line(capsys, "zpx-train: file error: No space left on device", "free space on that disk")
    (tmp_path / "a_file").write_text("")
    assert guarded(lambda: (tmp_path / "a_file" / "x").write_text(""), "zpx-train") == (2, None)
    _one_line(capsys, "file error: Not a directory", str(tmp_path / "a_file" / "x"))

    def bug():
        raise KeyError("a bug keeps its traceback")

    with pytest.raises(KeyError):
        guarded(bug, "zpx-train")
    with pytest.raises(ValueError, match="a bug"):
        guarded(lambda: int("a bug"), "zpx-train")  # a ValueError outside the config checks is a bug too
    assert guarded(lambda: int("x"), "zpx-train", reading_config=True)[0] == 2
    _one_line(capsys, "config error: invalid literal")


@needs_dev_full
def test_disk_full_during_a_checkpoint_save_is_one_line(tmp_path, capsys, monkeypatch):
    real_save = torch.save

    def save_to_a_full_disk(obj, f, *args, **kwargs):
        return real_save(obj, "/dev/full", *args, **kwargs)  # torch's own error: "unexpected pos ..."

    monkeypatch.setattr(torch, "save", save_to_a_full_disk)
    flags = ["--output_dir", str(tmp_path / "out"), *QUICK, "--save_strategy", "steps", "--save_steps", "1"]
    assert train_main([str(MICRO), *flags]) == 2
    _one_line(
        capsys, "zpx-train: file error: torch could not finish writing a checkpoint file", "disk is probably full"
    )


class _CtrlC(TrainerCallback):
    """A real SIGINT to this process at the end of step `at` (Python raises KeyboardInterrupt on delivery)."""

    def __init__(self, at):
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            # Python's own SIGINT handler (a library may have swapped it), and raise_signal delivers the signal to
            # this thread before it returns: os.kill's delivery is asynchronous and once let the run finish
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.raise_signal(signal.SIGINT)


def test_ctrl_c_is_one_line_naming_the_intact_checkpoint_and_the_resume_command(tmp_path, capsys):
    out = tmp_path / "out"
    flags = ["--output_dir", str(out), "--max_steps", "6", "--save_steps", "2", "--eval_strategy", "no"]
    run = load_run_config(str(MICRO), [*flags, "--tasks", "mqar"])
    code, result = guarded(lambda: run_training(run, callbacks=[_CtrlC(3)]), "zpx-train", run=run)
    assert (code, result) == (130, None)
    err = _one_line(capsys, f"{out / 'checkpoint-2'} is the last complete checkpoint and is intact")
    assert f"zpx-train {MICRO} --output_dir {out} --resume_from_checkpoint last" in err
    assert not (out / "model.safetensors").exists()  # no final model saved as if the run had finished
    resumed = load_run_config(str(MICRO), [*flags, "--tasks", "mqar", "--resume_from_checkpoint", "last"])
    assert guarded(lambda: run_training(resumed), "zpx-train", run=resumed)[0] == 0
    assert resumed[TrainingArguments].output_dir == str(out) and (out / "model.safetensors").is_file()


def test_ctrl_c_during_an_overwrite_is_one_line_saying_the_old_run_is_back(tmp_path, capsys):
    out = tmp_path / "out"
    flags = ["--output_dir", str(out), "--max_steps", "4", "--save_steps", "2", "--eval_strategy", "no"]
    assert train_main([str(MICRO), *flags, "--max_steps", "2", "--tasks", "mqar"]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "_zpx.lock"}
    capsys.readouterr()
    run = load_run_config(str(MICRO), [*flags, "--tasks", "mqar", "passkey", "--overwrite_output_dir", "true"])
    assert guarded(lambda: run_training(run, callbacks=[_CtrlC(3)]), "zpx-train", run=run) == (130, None)
    line = _one_line(capsys, f"zpx-train: interrupted; the overwrite is undone: {out} holds the run it held before")
    assert "run the same command again to start the overwrite over" in line and "resume" not in line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "_zpx.lock"} == before


def test_ctrl_c_before_a_checkpoint_says_so(capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert guarded(interrupted, "zpx-train") == (130, None)
    _one_line(capsys, "zpx-train: interrupted before training started; nothing was written.")


@pytest.fixture
def lora_base(tmp_path):
    from zpx_hf import ZPXConfig, ZPXForCausalLM
    from zpx_hf.tokenization_bytes import VOCAB_SIZE, build_byte_tokenizer

    torch.manual_seed(0)
    config = ZPXConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        phase_channels=2,
        max_position_embeddings=128,
    )
    folder = tmp_path / "base"
    ZPXForCausalLM(config).save_pretrained(folder)
    build_byte_tokenizer().save_pretrained(folder)
    return folder


def _lora_flags(tmp_path, base):
    return [
        str(ROOT / "configs" / "zpx-tiny-lora.yaml"),
        *("--base_model", str(base), "--output_dir", str(tmp_path / "lora"), "--merged_output_dir", ""),
        *("--max_steps", "1", "--eval_strategy", "no", "--train_examples_per_task", "8"),
        *("--eval_examples_per_task", "2", "--mqar_num_pairs", "4"),
    ]


def test_lora_base_with_truncated_weights_is_one_line(tmp_path, capsys, lora_base):
    weights = lora_base / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert finetune_main(_lora_flags(tmp_path, lora_base)) == 2
    _one_line(capsys, "zpx-finetune-lora: config error: key `base_model`", "cannot be loaded")


def test_lora_base_whose_config_and_weights_disagree_is_one_line(tmp_path, capsys, lora_base):
    config = json.loads((lora_base / "config.json").read_text())
    (lora_base / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    assert finetune_main(_lora_flags(tmp_path, lora_base)) == 2
    _one_line(
        capsys,
        "zpx-finetune-lora: config error: key `base_model`",
        "mlp.down_proj.weight is [32, 64] in model.safetensors but [32, 96] by its config.json",
    )


def test_lora_targets_missing_from_the_model_are_one_line(tmp_path, capsys, lora_base):
    assert finetune_main([*_lora_flags(tmp_path, lora_base), "--target_modules", "no_such_proj"]) == 2
    _one_line(capsys, "key `lora.target_modules`: no_such_proj match no module of the base model", "q_proj")


def test_a_yaml_error_inside_a_job_config_names_the_line(tmp_path, capsys):
    text = yaml.safe_dump({"model_type": "zpx"}) + "data: [unclosed\n"
    assert train_main([_write(tmp_path, text)]) == 2
    _one_line(capsys, "line 3: not valid YAML")


def test_enospc_and_network_messages_name_the_fix():
    from zpx_hf_train.cli import expected_error

    kind, line = expected_error(ConnectionError("Max retries exceeded with url: /api/models"))
    assert kind == "network error" and line.endswith("check the network and your login (HF_TOKEN or `hf auth login`).")
    kind, line = expected_error(OSError(errno.ENOSPC, "No space left on device", "/data/run/optimizer.pt"))
    assert kind == "file error"
    assert (
        line
        == "No space left on device: '/data/run/optimizer.pt'; free space on that disk or choose another output_dir."
    )


def test_safetensors_errors_say_truncated_or_disk_full(tmp_path):
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import save_file

    from zpx_hf_train.cli import expected_error

    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(64)}, str(weights))
    weights.write_bytes(weights.read_bytes()[:20])
    with pytest.raises(SafetensorError) as truncated:
        safe_open(str(weights), "pt")
    assert expected_error(truncated.value)[1].endswith("it may be truncated.")
    # the text of Rust's io::Error for ENOSPC, as safetensors reports a failed write
    full = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space" })')
    assert expected_error(full)[1].endswith("the disk is full: free space or choose another output_dir.")
