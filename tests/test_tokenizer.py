"""Byte-level tokenizer: ids match GeometricConfig, exact round-trip, offline AutoTokenizer without remote code."""

import json

import pytest
from transformers import AutoTokenizer

from zpx_hf import ZPXConfig
from zpx_hf.tokenization_bytes import (
    BOS_ID,
    BYTE_OFFSET,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    VOCAB_SIZE,
    build_byte_tokenizer,
    ids_to_text,
    text_to_ids,
)

SAMPLES = ["", "hello world", "tabs\tand\nnewlines  ", "unicode: héllo wörld — “quotes” 日本語 🙂", "\x00\x7f"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def test_vocab_and_special_ids_match_config_defaults(tokenizer):
    config = ZPXConfig()
    assert len(tokenizer) == VOCAB_SIZE == 260 == config.vocab_size
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert tokenizer.unk_token_id == UNK_ID
    assert tokenizer.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(BYTE_OFFSET)) == BYTE_OFFSET


@pytest.mark.parametrize("text", SAMPLES)
def test_every_byte_is_one_token_and_round_trips(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert ids == text_to_ids(text) == [b + BYTE_OFFSET for b in text.encode("utf-8")]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert ids_to_text(ids) == text


def test_all_256_bytes_have_distinct_ids(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(list(range(BYTE_OFFSET, VOCAB_SIZE)))
    assert len(set(tokens)) == 256
    assert UNK_ID not in tokenizer(bytes(range(128)).decode("ascii"))["input_ids"]


def test_right_padding_with_pad_id_zero(tokenizer):
    batch = tokenizer(["a", "abcd"], padding=True)
    assert batch["input_ids"][0] == [text_to_ids("a")[0], PAD_ID, PAD_ID, PAD_ID]
    assert batch["attention_mask"][0] == [1, 0, 0, 0]


def test_saved_tokenizer_loads_offline_without_remote_code(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "auto_map" not in saved
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == VOCAB_SIZE
    for text in SAMPLES:
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
