"""The corpus through Arrow files and streams (`zpx_hf_train.data_pipeline`): cached tokenization reused and
invalidated by fingerprint, blocks and packed rows equal to the list-based references, the held-out split, and
streamed shards that are disjoint, complete and resumed exactly."""

import json
import os
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_training import StopAt

from zpx_hf.tokenization_bytes import BOS_ID, PAD_ID, build_byte_tokenizer, text_to_ids
from zpx_hf_train import data_pipeline
from zpx_hf_train.config import ConfigError
from zpx_hf_train.data import DataArguments, build_datasets
from zpx_hf_train.data_pipeline import (
    STREAM_STATE,
    group_blocks,
    is_heldout,
    pack_rows,
    split_side,
    stream_blocks,
    stream_documents,
    tokenize_documents,
)
from zpx_hf_train.data_tasks import (
    IGNORE_INDEX,
    DocumentView,
    open_stream,
    pack_documents,
    split_documents,
    task_dataset,
    text_dataset,
)
from zpx_hf_train.train import load_run_config, main, run_training

MICRO = str(Path(__file__).resolve().parents[1] / "configs" / "test-micro.yaml")
pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py


def write_corpus(path, documents):
    with open(path, "w", encoding="utf-8") as f:
        for text in documents:
            f.write(json.dumps({"text": text}) + "\n")
    return str(path)


DOCUMENTS = [f"document {i}: " + "word " * (i % 7 * 9 + 3) + ("<s> literal" if i == 5 else "") for i in range(40)]


def corpus_args(tmp_path, **overrides):
    source = write_corpus(tmp_path / "corpus.jsonl", DOCUMENTS)
    kwargs = dict(text_source=source, seq_len=32, tasks=[], max_eval_blocks=None, cache_dir=str(tmp_path / "cache"))
    return DataArguments(**{**kwargs, **overrides})


def test_blocks_equal_the_list_reference_and_a_second_run_reuses_the_cache(tmp_path, capsys):
    data = corpus_args(tmp_path)
    built = build_datasets(data)
    first = capsys.readouterr().out
    assert "data: tokenized the corpus into" in first
    train_docs, heldout_docs = split_documents(DOCUMENTS, data.heldout_fraction, data.split_seed)
    assert built["train"]["input_ids"] == pack_documents(train_docs, 32)  # a literal "<s>" stays bytes
    assert built["heldout"]["input_ids"] == pack_documents(heldout_docs, 32)
    assert built["train"]["labels"] == built["train"]["input_ids"] and all(map(all, built["train"]["attention_mask"]))
    files = sorted(os.listdir(tmp_path / "cache"))
    again = build_datasets(data)
    assert "data: reusing the tokenized corpus cached in" in capsys.readouterr().out
    assert (
        sorted(os.listdir(tmp_path / "cache")) == files and again["train"]["input_ids"] == built["train"]["input_ids"]
    )


def test_a_changed_corpus_or_tokenizer_is_tokenized_again(tmp_path, capsys):
    data = corpus_args(tmp_path)
    build_datasets(data)
    capsys.readouterr()
    changed = [text.replace("word", "WORD") for text in DOCUMENTS]  # same sizes: only the content differs
    write_corpus(tmp_path / "corpus.jsonl", changed)
    os.utime(tmp_path / "corpus.jsonl", ns=(1, 1))  # an older mtime than the first file's
    built = build_datasets(data)
    assert "data: tokenized the corpus into" in capsys.readouterr().out
    assert built["train"]["input_ids"] == pack_documents(split_documents(changed, 0.1, 0)[0], 32)
    # another tokenizer: the byte tokenizer with one more token ("word" as one id)
    other = build_byte_tokenizer(model_max_length=32)
    other.add_tokens(["WORD"])
    built = build_datasets(data, other)
    assert "data: tokenized the corpus into" in capsys.readouterr().out
    word = other.convert_tokens_to_ids("WORD")
    assert word in {t for row in built["train"]["input_ids"] for t in row}


def test_capped_blocks_tokenize_ranges_until_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(data_pipeline, "FIRST_RANGE", 2)
    data = corpus_args(tmp_path, max_train_blocks=7, max_eval_blocks=2)
    built = build_datasets(data)
    train_docs, heldout_docs = split_documents(DOCUMENTS, 0.1, 0)
    assert built["train"]["input_ids"] == pack_documents(train_docs, 32, 7)
    assert built["heldout"]["input_ids"] == pack_documents(heldout_docs, 32, 2)
    from datasets import Dataset

    tokenized = [len(Dataset.from_file(str(f))) for f in (tmp_path / "cache").glob("tokens-*.arrow")]
    assert len(tokenized) >= 2 and sum(tokenized) <= 8  # ranges of 2, 4, ... documents, not all 40 of them


def test_group_blocks_across_map_batches_and_multiprocess_tokenizing(tmp_path, monkeypatch):
    monkeypatch.setattr(data_pipeline, "ROW_BATCH", 3)
    tokenizer = build_byte_tokenizer()
    from datasets import Dataset

    view = DocumentView(Dataset.from_dict({"text": DOCUMENTS}), "text", range(len(DOCUMENTS)))
    tokens, reused = tokenize_documents(view, tokenizer, num_proc=2, cache_dir=str(tmp_path))
    assert not reused and tokens["input_ids"] == [[BOS_ID, *text_to_ids(t), 2] for t in DOCUMENTS]
    assert tokenize_documents(view, tokenizer, num_proc=2, cache_dir=str(tmp_path))[1]  # reused
    assert group_blocks(tokens, tokenizer, 16)["input_ids"] == pack_documents(DOCUMENTS, 16)
    with pytest.raises(ValueError, match="shorter than one block"):
        group_blocks(tokens.select(range(1)), tokenizer, 4096)


def mapped_rss_kb(path):
    """Resident KB of this process's memory maps of `path` (/proc/self/smaps)."""
    total, current = 0, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line: address range ... [path]
            current = fields[5] if len(fields) > 5 else None
        elif fields[0] == "Rss:" and current == str(path):
            total += int(fields[1])
    return total


def file_corpus(tmp_path, texts):
    """A file-backed corpus (an Arrow file in tmp_path, with a second column) and its `text_documents` view."""
    from datasets import Dataset

    from zpx_hf_train.data_tasks import text_documents

    rows = {"text": texts, "other": list(range(len(texts)))}
    corpus = Dataset.from_dict(rows).map(lambda b: b, batched=True, cache_file_name=str(tmp_path / "corpus.arrow"))
    return text_documents(corpus, "text")


def test_file_backed_corpus_tokenized_in_ranges_and_cut_without_memory_map(tmp_path, monkeypatch):
    monkeypatch.setattr(data_pipeline, "TOKENIZE_RANGE", 7)  # 40 documents: 6 ranges, each over a fresh map
    monkeypatch.setattr(data_pipeline, "ROW_BATCH", 3)
    tokenizer = build_byte_tokenizer()
    view = file_corpus(tmp_path, [DOCUMENTS[0], "  ", *DOCUMENTS[1:], None])  # blank / missing rows are no document
    assert list(view) == DOCUMENTS
    tokens, reused = tokenize_documents(view, tokenizer, num_proc=2, cache_dir=str(tmp_path / "cache"))
    assert not reused and tokens["input_ids"] == [[BOS_ID, *text_to_ids(t), 2] for t in DOCUMENTS]
    assert tokenize_documents(view, tokenizer, num_proc=2, cache_dir=str(tmp_path / "cache"))[1]  # reused
    assert group_blocks(tokens, tokenizer, 16, cache_dir=str(tmp_path / "cache"))["input_ids"] == pack_documents(
        DOCUMENTS, 16
    )
    assert group_blocks(tokens, tokenizer, 16, 5, str(tmp_path / "cache"))["input_ids"] == pack_documents(
        DOCUMENTS, 16, 5
    )
    blocks = group_blocks(tokens, tokenizer, 24, cache_dir=str(tmp_path / "cache"))  # record batches of 24 rows
    expected, packed = reference_pack_rows(blocks, 24), pack_rows(blocks, 24, tokenizer)  # read forward, in batches
    for key in ("input_ids", "labels", "position_ids", "attention_mask"):
        assert packed[key] == expected[key], key
    sliced = tokens.select(range(3, 9))  # a view of the files' rows: read through datasets, not the files
    assert data_pipeline.file_batches(sliced, ["input_ids"]) is None
    assert data_pipeline.file_batches(tokens, ["absent"]) is None


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="resident pages per mapping: Linux /proc")
def test_group_blocks_leaves_the_token_file_pages_unmapped(tmp_path):
    tokenizer = build_byte_tokenizer()
    texts = [text * 200 for text in DOCUMENTS * 5]  # ~12 MB of uint16 tokens: fault-around (64 KB) is small in it
    view = file_corpus(tmp_path, texts)
    tokens, _ = tokenize_documents(view, tokenizer, cache_dir=str(tmp_path / "cache"))
    files = [Path(entry["filename"]) for entry in tokens.cache_files]
    size_kb = sum(f.stat().st_size for f in files) // 1024
    blocks = group_blocks(tokens, tokenizer, 64, cache_dir=str(tmp_path / "cache"))
    assert blocks[len(blocks) - 1]["input_ids"] == pack_documents(texts, 64)[-1]
    # read batch by batch into freed buffers: only the stream's headers and list offsets were touched in the map
    assert sum(mapped_rss_kb(f) for f in files) < size_kb / 4, size_kb


def reference_pack_rows(train, seq_len):
    """The list-based packing of zpx-hf before the Arrow pipeline (the semantics `pack_rows` keeps)."""
    rows = {"input_ids": [], "labels": [], "position_ids": [], "attention_mask": []}
    current = {"input_ids": [], "labels": [], "position_ids": []}

    def close_row():
        tail = seq_len - len(current["input_ids"])
        if not current["input_ids"]:
            return
        rows["input_ids"].append(current["input_ids"] + [PAD_ID] * tail)
        rows["labels"].append(current["labels"] + [IGNORE_INDEX] * tail)
        rows["position_ids"].append(current["position_ids"] + list(range(tail)))
        rows["attention_mask"].append([1] * seq_len)
        for values in current.values():
            values.clear()

    for ids, mask, labels in zip(train["input_ids"], train["attention_mask"], train["labels"]):
        real = [index for index, keep in enumerate(mask) if keep]
        starts = [i for i in real if ids[i] == BOS_ID and i != real[0]] if real else []
        for begin, end in zip([real[0]] + starts if real else [], starts + [real[-1] + 1] if real else []):
            if len(current["input_ids"]) + end - begin > seq_len:
                close_row()
            current["input_ids"] += ids[begin:end]
            current["labels"] += [IGNORE_INDEX] + labels[begin + 1 : end]
            current["position_ids"] += list(range(end - begin))
    close_row()
    return rows


def test_vectorised_packing_equals_the_list_reference(tmp_path, monkeypatch):
    from datasets import concatenate_datasets

    monkeypatch.setattr(data_pipeline, "ROW_BATCH", 2)  # packed rows and input rows cross many map batches
    tokenizer = build_byte_tokenizer()
    columns = ["input_ids", "attention_mask", "labels"]
    text = text_dataset(DOCUMENTS, 128)
    tasks = [task_dataset(task, 5, 0, 128) for task in ("mqar", "selective_copy")]
    tasks.append(task_dataset("passkey", 3, 0, 128, length=110))
    train = concatenate_datasets([text, *(t.select_columns(columns) for t in tasks)]).shuffle(seed=0).flatten_indices()
    expected = reference_pack_rows(train, 128)
    packed = pack_rows(train, 128, tokenizer)
    for key in ("input_ids", "labels", "position_ids", "attention_mask"):
        assert packed[key] == expected[key], key
    cached = pack_rows(train, 128, tokenizer, str(tmp_path), key="train-1")
    assert cached["input_ids"] == expected["input_ids"] and cached.cache_files


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="resident pages per mapping: Linux /proc")
def test_packing_text_blocks_with_task_examples_leaves_the_block_file_pages_unmapped(tmp_path):
    from datasets import concatenate_datasets

    from zpx_hf_train.data import COLUMNS
    from zpx_hf_train.data_pipeline import row_features

    tokenizer = build_byte_tokenizer()
    texts = [text * 40 for text in DOCUMENTS * 5]  # ~1.2 M tokens: blocks file of ~8 MB (7 bytes per token)
    tokens, _ = tokenize_documents(file_corpus(tmp_path, texts), tokenizer, cache_dir=str(tmp_path / "cache"))
    blocks = group_blocks(tokens, tokenizer, 128, cache_dir=str(tmp_path / "cache"))
    examples = [task_dataset(task, 5, 0, 128).select_columns(COLUMNS) for task in ("mqar", "passkey")]
    train = concatenate_datasets([blocks, *(t.cast(row_features(tokenizer)) for t in examples)])  # as build_datasets
    assert [len(b) for b in data_pipeline.table_blocks(train)] == [len(blocks), 10]  # the file, the examples
    packed = pack_rows(train, 128, tokenizer)
    # the file's rows were read into freed buffers, the examples from memory: few of the file's pages were touched
    path = Path(blocks.cache_files[0]["filename"])
    assert mapped_rss_kb(path) < path.stat().st_size // 1024 // 4, path.stat().st_size
    expected = reference_pack_rows(train, 128)
    for key in ("input_ids", "labels", "position_ids"):
        assert packed[key] == expected[key], key
    assert data_pipeline.table_blocks(train.select([5, 3])) is None  # through indices: read through datasets
    assert data_pipeline.file_batches(train.select(range(3, 9)), COLUMNS) is None  # a slice of the file
    joined = concatenate_datasets([blocks, blocks.rename_column("labels", "y").select_columns(["y"])], axis=1)
    assert data_pipeline.table_blocks(joined) is None  # columns joined: no block holds a row whole
    assert data_pipeline.file_batches(blocks.rename_column("labels", "y"), ["y"]) is None  # not as the file has it


def test_streaming_split_is_deterministic_and_disjoint():
    heldout = [is_heldout(text, 0.25, 3) for text in DOCUMENTS]
    assert heldout == [is_heldout(text, 0.25, 3) for text in DOCUMENTS]  # deterministic
    assert 0 < sum(heldout) < len(DOCUMENTS) and heldout != [is_heldout(t, 0.25, 4) for t in DOCUMENTS]
    import hashlib

    digest = [int.from_bytes(hashlib.blake2b(f"3\0{t}".encode(), digest_size=8).digest(), "big") for t in DOCUMENTS]
    assert heldout == [d < 0.25 * 2**64 for d in digest]  # the rule the docs state


def rank_documents(source, rank, world_size):
    from datasets.distributed import split_dataset_by_node

    return [row["text"] for row in split_dataset_by_node(stream_documents(source, "text"), rank, world_size)]


def test_streamed_shards_are_disjoint_and_cover_every_document_once_per_epoch(tmp_path):
    source = open_stream(write_corpus(tmp_path / "c.jsonl", DOCUMENTS + ["   "]))  # a blank line is skipped
    shards = [rank_documents(source, rank, 2) for rank in (0, 1)]
    assert not set(shards[0]) & set(shards[1]) and sorted(shards[0] + shards[1]) == sorted(DOCUMENTS)
    tokenizer = build_byte_tokenizer()
    train = [t for t in DOCUMENTS if not is_heldout(t, 0.1, 0)]
    for rank in (0, 1):
        train_side = split_side(source, "text", 0.1, 0, heldout=False)
        stream = stream_blocks(train_side, tokenizer, "text", 16, buffer_size=5, seed=0, rank=rank, world_size=2)
        mine = train[rank::2]  # one file: every other training document
        expected = pack_documents(mine, 16)
        drawn = [row["input_ids"] for row in islice(stream, len(expected) - 5)]  # 5 stay in the buffer
        assert stream.epoch == 0 and len(drawn) + len(stream.buffer) == len(expected)
        assert sorted(drawn + [b.tolist() for b in stream.buffer]) == sorted(expected)  # each block once
        assert drawn != expected[: len(drawn)]  # shuffled


def test_a_resumed_stream_continues_exactly(tmp_path):
    source = open_stream(write_corpus(tmp_path / "c.jsonl", DOCUMENTS))
    tokenizer = build_byte_tokenizer()

    def fresh():
        return stream_blocks(split_side(source, "text", 0.1, 0, False), tokenizer, "text", 16, 7, 1, 0, 1)

    per_epoch = len(pack_documents([t for t in DOCUMENTS if not is_heldout(t, 0.1, 0)], 16))
    total = 2 * per_epoch + 10  # across two epoch ends
    whole = [row["input_ids"] for row in islice(fresh(), total)]
    for cut in (3, per_epoch + 1):
        first = fresh()
        head = [row["input_ids"] for row in islice(first, cut)]
        first.save(tmp_path)  # as a checkpoint: JSON on disk
        resumed = fresh()
        resumed.restore(tmp_path)
        tail = [row["input_ids"] for row in islice(resumed, total - cut)]
        assert head + tail == whole, cut
    with pytest.raises(ValueError, match="holds no data_stream_state-rank0.json"):
        fresh().restore(tmp_path / "elsewhere")


STREAMING = [
    *("--streaming", "true", "--train_examples_per_task", "0", "--max_eval_blocks", "4", "--shuffle_buffer", "8"),
    *("--tasks", "mqar", "--eval_examples_per_task", "4", "--logging_steps", "1", "--eval_strategy", "no"),
    *("--per_device_train_batch_size", "4", "--save_steps", "3", "--max_steps", "6", "--disable_tqdm", "true"),
]


def test_zpx_train_streaming_resumes_where_the_stream_stopped(tmp_path):
    cache = ["--cache_dir", str(tmp_path / "cache")]
    full = run_training(load_run_config(MICRO, [*STREAMING, *cache, "--output_dir", str(tmp_path / "full")]))
    interrupted = str(tmp_path / "interrupted")
    run_training(load_run_config(MICRO, [*STREAMING, *cache, "--output_dir", interrupted]), callbacks=[StopAt(3)])
    state = Path(interrupted, "checkpoint-3", STREAM_STATE.format(rank=0))
    manifest = json.loads(Path(interrupted, "checkpoint-3", "zpx_checkpoint.json").read_text())
    assert state.name in manifest["files"]  # checksummed with the checkpoint
    args = [*STREAMING, *cache, "--output_dir", interrupted, "--resume_from_checkpoint", "last"]
    resumed = run_training(load_run_config(MICRO, args))
    losses = [e["loss"] for e in full["trainer"].state.log_history if "loss" in e]
    resumed_losses = [e["loss"] for e in resumed["trainer"].state.log_history if "loss" in e]
    assert resumed_losses[-3:] == pytest.approx(losses[-3:], abs=1e-6)  # steps 4-6 saw the same blocks
    reference = full["trainer"].model.state_dict()
    for name, value in resumed["trainer"].model.state_dict().items():
        torch.testing.assert_close(value, reference[name], atol=1e-7, rtol=0, msg=name)
    assert any("streamed" in line for line in full["datasets"]["description"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--max_steps", "-1", "--num_train_epochs", "1"],
            "key `training.max_steps` must be > 0 with `data.streaming`",
        ),
        (["--packing", "true"], "key `data.packing` cannot pack a streamed corpus"),
        (["--train_examples_per_task", "2"], "key `data.train_examples_per_task`: a streamed corpus trains on text"),
        (["--dataloader_num_workers", "1"], "key `training.dataloader_num_workers` must be 0 with `data.streaming`"),
        (["--num_proc", "0"], "key `data.num_proc` = 0 must be >= 1"),
        (["--tokenizer", '{"train": "bpe", "vocab_size": 512}'], "key `data.tokenizer` trains a tokenizer on the"),
    ],
)
def test_streaming_misuse_is_one_line(tmp_path, capsys, flags, message):
    args = [*STREAMING, "--output_dir", str(tmp_path / "out"), *flags]
    assert main([MICRO, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_resuming_a_checkpoint_without_stream_state_is_refused(tmp_path):
    cache = ["--cache_dir", str(tmp_path / "cache")]
    out = str(tmp_path / "out")
    run_training(load_run_config(MICRO, [*STREAMING, *cache, "--output_dir", out]), callbacks=[StopAt(3)])
    state = Path(out, "checkpoint-3", STREAM_STATE.format(rank=0))
    state.unlink()
    manifest = Path(out, "checkpoint-3", "zpx_checkpoint.json")
    files = json.loads(manifest.read_text())
    del files["files"][state.name]
    manifest.write_text(json.dumps(files))
    with pytest.raises(ConfigError, match="holds no data_stream_state-rank0.json"):
        run_training(
            load_run_config(MICRO, [*STREAMING, *cache, "--output_dir", out, "--resume_from_checkpoint", "last"])
        )


def test_a_missing_text_column_in_a_stream_fails_early(tmp_path):
    with pytest.raises(ValueError, match="column 'body' not in"):
        open_stream(write_corpus(tmp_path / "c.jsonl", DOCUMENTS), text_column="body")
    assert np.isclose(np.mean([is_heldout(str(i), 0.5, 0) for i in range(2000)]), 0.5, atol=0.05)
