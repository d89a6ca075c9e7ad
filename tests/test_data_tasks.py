"""Synthetic tasks (deterministic, exact labels and answer masks) and the embedded / local text corpora."""

import json
import re
import statistics
import time

import pytest

from zpx_hf.tokenization_bytes import BOS_ID, BYTE_OFFSET, EOS_ID, PAD_ID, ids_to_text
from zpx_hf_train.data_tasks import (
    IGNORE_INDEX,
    SEPARATOR,
    listops_examples,
    load_documents,
    mqar_examples,
    pack_documents,
    passkey_examples,
    pydoc_documents,
    selective_copy_examples,
    split_documents,
    task_dataset,
    task_examples,
    text_dataset,
)


def _answers(example):
    return ids_to_text([t for t, m in zip(example["input_ids"], example["answer_mask"]) if m])


def _check_layout(example, seq_len=None):
    n = len(example["input_ids"])
    assert all(len(example[k]) == n for k in ("attention_mask", "labels", "answer_mask"))
    if seq_len is not None:
        assert n == seq_len
    assert example["input_ids"][0] == BOS_ID
    for tok, att, lab, ans in zip(
        example["input_ids"], example["attention_mask"], example["labels"], example["answer_mask"]
    ):
        assert lab == (tok if ans else IGNORE_INDEX)
        if not att:
            assert tok == PAD_ID and not ans
    assert sum(example["answer_mask"]) > 0


@pytest.mark.parametrize("task", ["mqar", "passkey", "selective_copy"])
def test_tasks_are_deterministic_and_seed_dependent(task):
    a = task_examples(task, 8, seed=3, seq_len=128)
    b = task_examples(task, 8, seed=3, seq_len=128)
    c = task_examples(task, 8, seed=4, seq_len=128)
    assert a == b
    assert a != c
    for example in a:
        _check_layout(example, 128)


def test_mqar_answers_are_the_queried_values():
    for example in mqar_examples(20, seed=0, num_pairs=6, num_queries=4):
        _check_layout(example)
        text = ids_to_text(example["input_ids"])
        pairs, queries = text.split(SEPARATOR)
        table = {pairs[i]: pairs[i + 1] for i in range(0, len(pairs), 2)}
        assert len(table) == 6 and len(queries) == 8
        assert _answers(example) == "".join(table[q] for q in queries[0::2])
        assert "".join(queries[1::2]) == _answers(example)


def test_mqar_queries_with_replacement_answer_from_the_table():
    for example in mqar_examples(20, seed=5, num_pairs=4, num_queries=8, query_replacement=True):
        _check_layout(example, 2 + 2 * 4 + 2 * 8)
        pairs, queries = ids_to_text(example["input_ids"]).split(SEPARATOR)
        table = {pairs[i]: pairs[i + 1] for i in range(0, len(pairs), 2)}
        assert set(queries[0::2]) <= set(table)
        assert _answers(example) == "".join(table[q] for q in queries[0::2])
    with pytest.raises(ValueError, match="query_replacement"):
        mqar_examples(1, seed=0, num_pairs=4, num_queries=8)


def _passkey_parts(example):
    """(needles {letter: digits}, distractor numbers, asked letter) parsed from the decoded context."""
    text = ids_to_text([t for t, m in zip(example["input_ids"], example["answer_mask"]) if not m][1:])
    needles = dict(re.findall(r"Key ([A-Z]) is (\d+)\.", text))
    distractors = re.findall(r"Room (\d+)\.", text)
    asked = re.search(r"What is key ([A-Z])\? Key ([A-Z]) is $", text)
    assert asked and asked.group(1) == asked.group(2)
    return needles, distractors, asked.group(1)


@pytest.mark.parametrize("length", [105, 257, 1024])
def test_passkey_answer_is_the_named_keys_code_among_distractors(length):
    asked_positions = set()
    for example in passkey_examples(12, seed=1, seq_len=length):
        _check_layout(example, length)
        assert sum(example["attention_mask"]) == length
        needles, distractors, asked = _passkey_parts(example)
        assert len(needles) == 3 and len(distractors) == 2  # distinct key letters, distractor numbers present
        answer = _answers(example)
        assert len(answer) == 5 and answer.isdigit()
        assert answer == needles[asked]  # determined by the named key, not by position or uniqueness
        assert all(len(code) == 5 for code in [*needles.values(), *distractors])
        asked_positions.add(list(needles).index(asked))
    assert len(asked_positions) > 1  # the question does not always name the first (or last) needle
    padded = task_examples("passkey", 2, seed=1, seq_len=256, length=128)
    assert all(sum(e["attention_mask"]) == 128 and len(e["input_ids"]) == 256 for e in padded)


def test_passkey_needles_and_distractors_are_configurable_and_minimum_length_is_exact():
    example = passkey_examples(1, seed=2, seq_len=200, num_needles=5, num_distractors=4, num_digits=3)[0]
    needles, distractors, asked = _passkey_parts(example)
    assert len(needles) == 5 and len(distractors) == 4 and _answers(example) == needles[asked]
    # BOS + 3 needles " Key x is ddddd." (16) + 2 distractors " Room ddddd." (12) + question (24) + 5 digits
    minimum = 1 + 3 * 16 + 2 * 12 + len(" What is key x? Key x is ") + 5
    assert len(passkey_examples(1, seed=0, seq_len=minimum)[0]["input_ids"]) == minimum
    with pytest.raises(ValueError, match=f"at least {minimum}"):
        passkey_examples(1, seed=0, seq_len=minimum - 1)
    with pytest.raises(ValueError, match="num_needles"):
        passkey_examples(1, seed=0, seq_len=300, num_needles=0)


def test_compact_passkey_puts_each_key_next_to_its_number_and_the_key_nowhere_else():
    for example in passkey_examples(
        8, seed=3, seq_len=80, num_needles=2, num_distractors=2, num_digits=3, compact=True
    ):
        _check_layout(example, 80)
        text = ids_to_text(example["input_ids"])
        needles = dict(re.findall(r"([A-Z])(\d{3})\.", text))
        asked = re.search(r" What is ([A-Z])\? ([A-Z])(\d{3})$", text)
        assert len(needles) == 2 and asked and asked.group(1) == asked.group(2)
        assert _answers(example) == needles[asked.group(1)] == asked.group(3)
        assert len(re.findall(r"(?<![A-Z\d])(\d{3})\.", text)) == 2  # the two bare distractor numbers
        for key in needles:  # a key occurs only in its needle and, if asked, the question
            assert text.count(key) == (3 if key == asked.group(1) else 1)


def test_selective_copy_answers_are_the_data_tokens_in_order():
    for example in selective_copy_examples(20, seed=2, num_tokens=5, num_positions=20):
        _check_layout(example)
        noisy, copied = ids_to_text(example["input_ids"]).split(SEPARATOR)
        assert len(noisy) == 20
        assert noisy.replace(".", "") == copied == _answers(example)


def _listops_evaluate(text, i=0):
    """(value, end index, tree depth, widest operator) of the ListOps expression starting at text[i], parsed
    recursively from the printed tokens (an independent reading of LRA's to_value: MED is int(median))."""
    if text[i].isdigit():
        return int(text[i]), i + 1, 1, 0
    op, i, args, depth, width = text[i], i + 1, [], 0, 0
    while text[i] != "]":
        value, i, sub_depth, sub_width = _listops_evaluate(text, i)
        args.append(value)
        depth, width = max(depth, sub_depth), max(width, sub_width)
    apply = {"X": max, "N": min, "D": lambda v: int(statistics.median(v)), "S": lambda v: sum(v) % 10}[op]
    return apply(args), i + 1, depth + 1, max(width, len(args))


def _listops_parts(example):
    text = ids_to_text(example["input_ids"])
    expression, answer = text.split("=")
    return expression, answer


def test_listops_answer_is_the_value_of_the_printed_expression_within_the_limits():
    limits = {"min_length": 20, "max_length": 120, "max_depth": 5, "max_args": 6}
    examples = listops_examples(200, seed=3, **limits)
    operators = set()
    for example in examples:
        _check_layout(example)
        expression, answer = _listops_parts(example)
        assert answer == _answers(example) and len(answer) == 1
        value, end, depth, width = _listops_evaluate(expression)
        assert end == len(expression) and str(value) == answer
        assert 20 < len(expression) < 120 and depth <= 5 and 2 <= width <= 6
        assert len(example["input_ids"]) == len(expression) + 3  # BOS, expression, =, the digit
        operators |= set(expression) - set("0123456789]")
    assert operators == {"X", "N", "D", "S"}
    assert len({_listops_parts(e)[1] for e in examples}) == 10  # every class occurs
    assert listops_examples(3, seed=3, **limits) == examples[:3]
    assert listops_examples(3, seed=4, **limits) != examples[:3]


def test_listops_at_lra_settings_and_padding():
    examples = listops_examples(6, seed=0, seq_len=2002)  # LRA: 500 < tokens < 2000, depth 10, 10 arguments
    for example in examples:
        _check_layout(example, seq_len=2002)
        expression, answer = _listops_parts(example)
        value, _, depth, width = _listops_evaluate(expression)
        assert 500 < len(expression) < 2000 and depth <= 10 and width <= 10 and str(value) == answer


def test_listops_splits_are_disjoint_whatever_the_seeds():
    limits = {"min_length": 3, "max_length": 12, "max_depth": 3, "max_args": 3}  # few distinct expressions
    seen = {}
    for split in ("train", "val", "test"):
        seen[split] = {_listops_parts(e)[0] for e in listops_examples(300, seed=0, split=split, **limits)}
    assert all(len(v) > 30 for v in seen.values())
    assert not seen["train"] & seen["val"] and not seen["train"] & seen["test"] and not seen["val"] & seen["test"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"split": "dev"}, "split"),
        ({"max_depth": 1}, "max_depth"),
        ({"min_length": 10, "max_length": 11}, "min_length"),
        ({"min_length": 30, "max_depth": 3, "max_args": 3}, "at most 17 tokens"),
    ],
)
def test_listops_bad_arguments_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        listops_examples(1, seed=0, **kwargs)


def test_task_too_long_for_seq_len_raises():
    with pytest.raises(ValueError, match="seq_len"):
        task_examples("mqar", 1, seed=0, seq_len=16, num_pairs=8)
    with pytest.raises(ValueError, match="unknown task"):
        task_examples("sorting", 1, seed=0, seq_len=16)


def test_task_dataset_columns():
    dataset = task_dataset("selective_copy", 4, seed=0, seq_len=64)
    assert set(dataset.column_names) == {"input_ids", "attention_mask", "labels", "answer_mask", "task"}
    assert len(dataset) == 4 and len(dataset[0]["input_ids"]) == 64


def test_pydoc_corpus_split_is_deterministic_and_disjoint():
    documents = pydoc_documents()
    assert len(documents) > 50 and sum(map(len, documents)) > 100_000
    train, heldout = split_documents(documents, 0.1, seed=0)
    assert (train, heldout) == split_documents(documents, 0.1, seed=0)
    assert not set(train) & set(heldout)
    assert len(train) + len(heldout) == len(documents)
    assert split_documents(documents, 0.1, seed=1)[1] != heldout
    single_train, single_heldout = split_documents(["abcdefghij"], 0.3, seed=0)
    assert single_train == ["abcdefg"] and single_heldout == ["hij"]


def test_pack_documents_blocks():
    blocks = pack_documents(["abc", "defgh"], seq_len=4)
    assert blocks == [[BOS_ID, 101, 102, 103], [EOS_ID, BOS_ID, 104, 105], [106, 107, 108, EOS_ID]]
    assert pack_documents(["abc", "defgh"], seq_len=5) == [
        [BOS_ID, 101, 102, 103, EOS_ID],
        [BOS_ID, 104, 105, 106, 107],
    ]
    dataset = text_dataset(["x" * 100], seq_len=32)
    assert len(dataset) == 3 and dataset[0]["labels"] == dataset[0]["input_ids"]
    with pytest.raises(ValueError, match="shorter than one block"):
        text_dataset(["tiny"], seq_len=32)


def test_pack_documents_caps_blocks_exactly():
    documents = ["x" * 50, "y" * 50]
    assert pack_documents(documents, seq_len=16, max_blocks=0) == []  # was one block
    assert len(pack_documents(documents, seq_len=16, max_blocks=2)) == 2
    assert pack_documents(documents, seq_len=16, max_blocks=100) == pack_documents(documents, seq_len=16)


def test_pack_documents_is_linear_in_one_long_paragraph():
    """4 MB in one paragraph: the blocks are the byte stream cut every seq_len tokens, and packing costs a small
    multiple of encoding the text once (both measured here, in the same run). Cutting the stream's head off after
    each block made it quadratic: 171 s at 4 MB where encoding takes well under a second."""
    document = ("The quick brown fox jumps over the lazy dog; " * 90_000)[:4_000_000]
    started = time.perf_counter()
    stream = [BOS_ID, *(b + BYTE_OFFSET for b in document.encode("utf-8")), EOS_ID]
    encode_seconds = time.perf_counter() - started
    started = time.perf_counter()
    blocks = pack_documents([document], seq_len=128)
    pack_seconds = time.perf_counter() - started
    assert len(blocks) == len(stream) // 128
    assert all(block == stream[i * 128 : (i + 1) * 128] for i, block in enumerate(blocks))
    assert pack_seconds < 50 * encode_seconds, (pack_seconds, encode_seconds)


def test_local_text_and_jsonl_files_load_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("First paragraph,\nstill first.\n\nSecond paragraph.\n\nThird.\n")
    documents = load_documents(str(text_file))
    assert len(documents) == 3 and documents[0].startswith("First paragraph,\nstill first.")
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("\n".join(json.dumps({"body": f"document {i}"}) for i in range(4)))
    assert load_documents(str(jsonl), text_column="body") == [f"document {i}" for i in range(4)]
    with pytest.raises(ValueError, match="data.text_column"):
        load_documents(str(jsonl), text_column="text")
    with pytest.raises(FileNotFoundError, match="data.text_source"):
        load_documents(str(tmp_path / "missing.txt"))


def test_local_dataset_folders_load_offline(tmp_path):
    from datasets import Dataset, DatasetDict

    Dataset.from_dict({"text": ["alpha", "beta"]}).save_to_disk(str(tmp_path / "saved"))
    assert load_documents(str(tmp_path / "saved")) == ["alpha", "beta"]
    DatasetDict({"validation": Dataset.from_dict({"text": ["gamma"]})}).save_to_disk(str(tmp_path / "dict"))
    assert load_documents(str(tmp_path / "dict"), split="validation") == ["gamma"]
    with pytest.raises(ValueError, match="data.dataset_split"):
        load_documents(str(tmp_path / "dict"))
    files = tmp_path / "files"
    files.mkdir()
    (files / "train.jsonl").write_text(json.dumps({"text": "delta"}) + "\n" + json.dumps({"text": "epsilon"}))
    assert load_documents(str(files)) == ["delta", "epsilon"]
