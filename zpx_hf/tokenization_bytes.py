"""Byte-level tokenizer shared by every family: 4 specials + 256 byte tokens = vocab 260.

Built with the `tokenizers` library and wrapped as a standard fast tokenizer, so a saved
checkpoint's `tokenizer.json` loads with `AutoTokenizer.from_pretrained(path)` offline and
without remote code. Ids match `GeometricConfig` defaults: pad=0, bos=1, eos=2, unk=3; the byte
`b` is token `b + BYTE_OFFSET`. Every UTF-8 string round-trips exactly (no unknown bytes).

BOS: by default `tokenizer(text)` is the bytes alone and `add_bos_token` says False. transformers 5 drops a saved
`add_bos_token` when a `tokenizer.json` exists, so a reloaded tokenizer always reports False: a post-processor that
prepended BOS anyway would contradict it, and lm-eval's rolling log-likelihood (which prepends its own BOS prefix)
would then score log p(<s> | <s>) once per document. `AutoTokenizer.from_pretrained(path, add_bos_token=True)`
prepends BOS and says so (the training data of `data_tasks` starts every document with BOS itself). No saved file
carries that choice (a BOS post-processor saved in `tokenizer.json` would reload reporting False again).
"""

from __future__ import annotations

from typing import Any

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
BYTE_OFFSET = len(SPECIAL_TOKENS)
VOCAB_SIZE = BYTE_OFFSET + 256


def byte_to_id(byte: int) -> int:
    """Token id of one byte value (0..255)."""
    return byte + BYTE_OFFSET


def text_to_ids(text: str) -> list[int]:
    """Token ids of `text` (UTF-8 bytes, no specials); equals the tokenizer's output without BOS."""
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


def ids_to_text(ids: Any) -> str:
    """Inverse of `text_to_ids`; special tokens are dropped, invalid UTF-8 becomes U+FFFD."""
    return bytes(int(i) - BYTE_OFFSET for i in ids if int(i) >= BYTE_OFFSET).decode("utf-8", errors="replace")


def _byte_tokenizer_backend() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins of GPT-2 style byte-level BPE
    byte_chars = {b: c for b, c in enumerate(_bytes_to_unicode())}
    if set(byte_chars.values()) != set(alphabet):
        raise RuntimeError("unexpected byte-level alphabet in the installed `tokenizers` library")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({byte_chars[b]: byte_to_id(b) for b in range(256)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    # no specials by default (see the module docstring); transformers rebuilds this for add_bos_token=True
    tokenizer.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def _bytes_to_unicode() -> list[str]:
    # GPT-2's reversible byte -> printable character table (the one `ByteLevel` uses).
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def build_byte_tokenizer(model_max_length: int = 512) -> Any:
    """A `PreTrainedTokenizerFast` over bytes, no BOS (see the module docstring); pads with `<pad>` (id 0) on the
    right."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_byte_tokenizer_backend(),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    if tokenizer.pad_token_id != PAD_ID or tokenizer.bos_token_id != BOS_ID or tokenizer.eos_token_id != EOS_ID:
        raise RuntimeError("byte tokenizer special ids do not match GeometricConfig (pad=0, bos=1, eos=2)")
    return tokenizer


__all__ = [
    "BOS_ID",
    "BYTE_OFFSET",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "VOCAB_SIZE",
    "build_byte_tokenizer",
    "byte_to_id",
    "ids_to_text",
    "text_to_ids",
]
