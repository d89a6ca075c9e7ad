"""Config files: the shipped configs parse; bad keys, types and data paths fail before training, naming the key."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import TrainingArguments

from zpx_hf_train.config import ConfigError, ModelArguments
from zpx_hf_train.data import DataArguments, load_text_documents
from zpx_hf_train.train import load_run_config
from zpx_hf_train.train import main as train_main

ROOT = Path(__file__).resolve().parents[1]

MICRO = ROOT / "configs" / "test-micro.yaml"


def _write(tmp_path, raw, name="config.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _micro(**changes):
    raw = yaml.safe_load(MICRO.read_text())
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return raw


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml") if "lora" not in p.name))
def test_shipped_configs_parse_and_build_their_model_config(name):
    run = load_run_config(str(ROOT / "configs" / name))
    assert run.model_config.model_type == run[ModelArguments].model_type
    assert run.model_config.vocab_size >= 260


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*lora*.yaml")))
def test_shipped_lora_configs_parse(name, tmp_path):
    from zpx_hf import ZPXConfig
    from zpx_hf_train.finetune_lora import LoraArguments, load_finetune_config

    ZPXConfig().save_pretrained(tmp_path)
    run = load_finetune_config(str(ROOT / "configs" / name), ["--base_model", str(tmp_path)])
    assert run[LoraArguments].rank >= 1 and run[TrainingArguments].output_dir


def test_values_reach_the_dataclasses_and_cli_overrides_win(tmp_path):
    path = _write(tmp_path, _micro())
    run = load_run_config(path, ["--max_steps", "3", "--push_to_hub", "--hub_model_id", "me/zpx-micro"])
    training = run[TrainingArguments]
    assert training.max_steps == 3 and training.learning_rate == 3e-3  # YAML `3e-3` is a float
    assert training.push_to_hub is True and training.hub_model_id == "me/zpx-micro"
    assert run[DataArguments].tasks == ["mqar", "passkey", "selective_copy"]
    assert run.model_config.hidden_size == 32 and run.model_config.phase_channels == 4


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"optimiser": "adam"}, "`optimiser`"),
        ({"data.seq_length": 64}, "`data.seq_length`"),
        ({"training.learning_rat": 0.1}, "`training.learning_rat`"),
        ({"model.hiden_size": 64}, "`model.hiden_size`"),
    ],
)
def test_unknown_keys_are_named(tmp_path, change, key):
    with pytest.raises(ConfigError, match="unknown key " + key.replace(".", r"\.")):
        load_run_config(_write(tmp_path, _micro(**change)))


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"data.seq_len": 64.5}, "data.seq_len"),
        ({"data.tasks": "mqar"}, "data.tasks"),
        ({"training.learning_rate": "fast"}, "training.learning_rate"),
        ({"training.max_steps": "10"}, "training.max_steps"),
        ({"training.push_to_hub": "yes"}, "training.push_to_hub"),
        ({"model.hidden_size": "big"}, "hidden_size"),
        ({"model.rotary": "alibi"}, "rotary"),
        ({"model_type": 3}, "model_type"),
    ],
)
def test_wrong_types_are_named(tmp_path, change, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_run_config(_write(tmp_path, _micro(**change)))


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"data.text_source": "/nonexistent/corpus.txt"}, "data.text_source"),
        ({"data.tasks": ["mqar", "sorting"]}, "data.tasks"),
        ({"data.mqar_num_pairs": 40}, "data.mqar_num_pairs"),
        ({"data.passkey_length": 64}, "data.passkey_length"),
        ({"data.heldout_fraction": 1.5}, "data.heldout_fraction"),
        ({"model.vocab_size": 100}, "model.vocab_size"),
        ({"model_type": "no-such-family"}, "model_type"),
        ({"training.eval_strategy": "sometimes"}, "sometimes"),
    ],
)
def test_bad_values_and_missing_paths_are_named(tmp_path, change, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_run_config(_write(tmp_path, _micro(**change)))


def test_missing_model_type_and_bad_layout(tmp_path):
    raw = _micro()
    del raw["model_type"]
    with pytest.raises(ConfigError, match="`model_type` is missing"):
        load_run_config(_write(tmp_path, raw))
    with pytest.raises(ConfigError, match="`data` must be a mapping"):
        load_run_config(_write(tmp_path, {**copy.deepcopy(_micro()), "data": ["mqar"]}))
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(str(tmp_path / "nope.yaml"))


def test_cli_fails_before_training_with_the_key_in_the_message(tmp_path):
    output_dir = tmp_path / "out"
    path = _write(tmp_path, _micro(**{"data.text_source": str(tmp_path / "missing.txt")}))
    result = subprocess.run(
        [sys.executable, "-m", "zpx_hf_train.train", path, "--output_dir", str(output_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "config error" in result.stderr and "`data.text_source`" in result.stderr
    assert not output_dir.exists()


def _bad_sources(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,label\n")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("some text\n")
    (mixed / "b.csv").write_text("text\nmore text\n")
    return [
        (empty, "is empty"),
        (latin1, "is not valid UTF-8 (byte 0xe9 at offset 3)"),
        (header_only, "has a header but no rows"),
        (mixed, "mixes file types ['.csv', '.txt']"),
    ]


@pytest.mark.parametrize("case", range(4))
def test_bad_data_files_fail_in_one_line_with_exit_code_2(tmp_path, capsys, case):
    source, reason = _bad_sources(tmp_path)[case]
    path = _write(tmp_path, _micro(**{"data.text_source": str(source)}))
    assert train_main([path, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`data.text_source`" in err and str(source) in err and reason in err, err
    assert not (tmp_path / "out").exists()


def test_a_file_datasets_cannot_parse_fails_with_exit_code_2_and_its_cause(tmp_path, capsys):
    source = tmp_path / "broken.json"
    source.write_text('{"text": "a"}\n{not json\n')
    out = tmp_path / "out"
    assert train_main([_write(tmp_path, _micro(**{"data.text_source": str(source)})), "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    # one line: datasets' own progress bar and ERROR log line are off while it reads the file
    (line,) = err.strip().splitlines()
    assert line.startswith("zpx-train: config error: key `data.text_source`") and str(source) in line, err
    assert "`datasets` cannot read it (JSON parse error" in line, err
    assert not out.exists()  # the run folder (lock, marker) is not left behind for a run that never started


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--per_device_train_batch_size", "0"], "`training.per_device_train_batch_size` = 0 must be >= 1"),
        (["--resume_from_checkpoint", "last"], "`training.resume_from_checkpoint` = 'last': no complete checkpoint"),
    ],
)
def test_cli_errors_after_parsing_fail_in_one_line_with_exit_code_2(tmp_path, capsys, flags, expected):
    out = tmp_path / "out"
    assert train_main([str(MICRO), "--output_dir", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_fifo_as_text_source_is_refused_without_blocking(tmp_path):
    import os
    import signal

    def hung(signum, frame):
        raise TimeoutError("blocked reading a FIFO")

    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text("some text\n")
    os.mkfifo(folder / "b.txt")
    signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)  # today's check reads the FIFO and blocks forever: fail instead of hanging the suite
    try:
        for source in (fifo, folder):
            with pytest.raises(ConfigError, match="is not a regular file"):
                load_run_config(_write(tmp_path, _micro(**{"data.text_source": str(source)})))
    finally:
        signal.alarm(0)


def test_a_csv_with_a_utf8_byte_order_mark_is_read(tmp_path, monkeypatch):
    from zpx_hf_train.data_tasks import load_documents

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    corpus = tmp_path / "excel.csv"
    corpus.write_bytes("\ufefftext,label\nthe first row,1\nthe second row,2\n".encode("utf-8"))
    run = load_run_config(_write(tmp_path, _micro(**{"data.text_source": str(corpus)})))
    assert load_documents(run[DataArguments].text_source, "text") == ["the first row", "the second row"]


@pytest.mark.parametrize("key", ["max_train_blocks", "max_eval_blocks", "max_documents"])
def test_zero_caps_are_refused(tmp_path, key):
    with pytest.raises(ConfigError, match=rf"`data\.{key}` = 0 must be >= 1"):
        load_run_config(_write(tmp_path, _micro(**{f"data.{key}": 0})))


def test_a_csv_cell_over_pythons_field_limit_is_read(tmp_path, monkeypatch):
    from zpx_hf_train.data_tasks import load_documents

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    long_cell = "word " * 40_000  # 200,000 characters: over the csv module's default 131,072
    corpus = tmp_path / "long.csv"
    corpus.write_text(f'text,label\n"{long_cell}",1\nshort row,2\n', encoding="utf-8")
    run = load_run_config(_write(tmp_path, _micro(**{"data.text_source": str(corpus)})))
    assert load_documents(run[DataArguments].text_source, "text") == [long_cell, "short row"]


def test_the_data_check_reads_only_the_start_of_a_large_file(tmp_path):
    """A corpus of gigabytes with `max_train_blocks: 64`: the check must not read (and decode) it whole. Here a
    64 MiB sparse file stands in: the check's peak Python allocation stays far below the file's size."""
    import tracemalloc

    from zpx_hf_train.data import check_local_source

    corpus = tmp_path / "large.txt"
    with open(corpus, "wb") as f:
        f.write(b"the first paragraph of a large corpus\n\n")
        f.truncate(64 << 20)  # sparse: 64 MiB of NUL bytes (valid UTF-8 text) without writing them
    tracemalloc.start()
    try:
        check_local_source("config.yaml", str(corpus), "text")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"the check allocated {peak / 2**20:.0f} MiB for a 64 MiB file"
    late = tmp_path / "late.txt"  # a bad byte past what the check reads: the loader names it in one line
    late.write_bytes(b"text\n\n" * 300_000 + b"caf\xe9\n")
    check_local_source("config.yaml", str(late), "text")
    with pytest.raises(ConfigError, match=r"key `data.text_source` = .*late.txt.*cannot read it"):
        load_text_documents(DataArguments(text_source=str(late)))


def test_a_large_corpus_with_block_caps_is_read_only_as_far_as_the_blocks_need(tmp_path, monkeypatch):
    """`max_train_blocks: 64` on a corpus of gigabytes: the job must not hold every document in memory (a 3 GB
    `.txt` ran out of a 4 GiB cap). A 48 MiB corpus stands in: building the datasets after `datasets` has
    cached the file allocates a small fraction of it in Python, and the blocks are the same as from a list."""
    import tracemalloc

    import datasets

    from zpx_hf_train.data import build_datasets
    from zpx_hf_train.data_tasks import open_documents, pack_documents, split_documents

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))  # not the user's cache
    corpus = tmp_path / "large.txt"
    paragraph = "a paragraph of the corpus, " * 36
    with open(corpus, "w", encoding="utf-8") as f:
        for i in range(48 << 10):  # 48 Ki paragraphs of ~1 KiB
            f.write(f"{i} {paragraph}\n\n")
    data = DataArguments(text_source=str(corpus), seq_len=64, max_train_blocks=64, max_eval_blocks=4, tasks=[])
    view = open_documents(str(corpus))  # datasets builds its cache of the file (not measured)
    assert len(view) == 48 << 10 and view[5] == f"5 {paragraph}"
    tracemalloc.start()
    try:
        built = build_datasets(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"building the datasets allocated {peak / 2**20:.0f} MiB for a 48 MiB corpus"
    train_docs, heldout_docs = split_documents(list(view), data.heldout_fraction, data.split_seed)  # the list path
    assert built["train"]["input_ids"] == pack_documents(train_docs, 64, 64)
    assert len(built["heldout"]) == 4 and built["heldout"]["input_ids"] == pack_documents(heldout_docs, 64, 4)
