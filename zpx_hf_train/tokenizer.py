"""The `data.tokenizer` key: which tokenizer a training run reads its text with, checked up front, built once.

Three kinds (`TokenizerSpec.kind`):

- `bytes` (the default): the package's 260-token byte tokenizer (`zpx_hf.tokenization_bytes`);
- a local tokenizer folder, or a Hub id already in the local cache (offline), loaded with `AutoTokenizer`;
- `{train: bpe | unigram, vocab_size: N}`: a model trained with the `tokenizers` library on the training split
  (from an iterator over the documents, never a second copy of the corpus), over the 256 byte symbols of GPT-2's
  byte-level alphabet (every text encodes, nothing is unknown) with `<pad>`, `<s>`, `</s>`, `<unk>` as ids 0-3
  (the family configs' defaults). It is saved with the checkpoint as `tokenizer.json` (`PreTrainedTokenizerFast`).

Documents are written `start + text + end` (`document_markers`): `<s> text </s>` for a tokenizer with distinct BOS
and EOS, `<eos> text` for one whose BOS is its EOS (GPT-2's `<|endoftext|>`). The model's `vocab_size` and special
token ids follow the tokenizer (`fit_model_config`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ConfigError, unknown_key
from .distributed import process_zero_value

TRAINED_KINDS = ("bpe", "unigram")
TRAIN_KEYS = ("train", "vocab_size", "min_frequency")  # of the mapping form; min_frequency is bpe's only
TRAINED_SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0-3: the family configs' pad/bos/eos defaults
TRAINED_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
BYTE_SYMBOLS = 256  # the byte-level alphabet every trained model starts from
TRAIN_BATCH = 1024  # documents handed to the `tokenizers` trainer at a time
ENCODE_BATCH = 256  # documents tokenized per call while packing


@dataclass(frozen=True)
class TokenizerSpec:
    """A parsed `data.tokenizer`: `kind` is 'bytes', 'pretrained' (`source`: folder or cached Hub id) or 'train'
    (`algorithm` bpe/unigram, `vocab_size`, `min_frequency`)."""

    kind: str
    source: str = ""  # set for 'pretrained' (the parser refuses an empty one)
    algorithm: str = ""  # set for 'train', as vocab_size (>= the byte symbols and specials)
    vocab_size: int = 0
    min_frequency: int | None = None


def parse_tokenizer_spec(path: str, value: Any) -> TokenizerSpec:
    """`data.tokenizer` as written in the YAML (or a JSON mapping on the command line); `ConfigError` naming the
    key and the fix for anything else."""
    key = "data.tokenizer"
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: key `{key}` = {value!r} is not a JSON mapping ({error.msg}).") from None
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{path}: key `{key}` is empty; give 'bytes', a tokenizer folder or a mapping.")
        return TokenizerSpec("bytes") if value == "bytes" else TokenizerSpec("pretrained", source=value)
    if not isinstance(value, dict):
        raise ConfigError(
            f"{path}: key `{key}` = {value!r}: give 'bytes', a tokenizer folder (or cached Hub id), or a mapping "
            "such as {train: bpe, vocab_size: 4096}."
        )
    for name in value:
        if name not in TRAIN_KEYS:
            raise unknown_key(path, f"{key}.", str(name), list(TRAIN_KEYS))
    algorithm = value.get("train")
    if algorithm not in TRAINED_KINDS:
        raise ConfigError(f"{path}: key `{key}.train` = {algorithm!r} must be one of {', '.join(TRAINED_KINDS)}.")
    vocab_size, minimum = value.get("vocab_size"), BYTE_SYMBOLS + len(TRAINED_SPECIALS)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < minimum:
        raise ConfigError(
            f"{path}: key `{key}.vocab_size` = {vocab_size!r} must be a whole number >= {minimum} (the "
            f"{BYTE_SYMBOLS} byte symbols and {len(TRAINED_SPECIALS)} special tokens)."
        )
    min_frequency = value.get("min_frequency")
    if min_frequency is not None and algorithm != "bpe":
        raise ConfigError(f"{path}: key `{key}.min_frequency` applies to bpe only; remove it for {algorithm}.")
    if min_frequency is not None and (isinstance(min_frequency, bool) or not isinstance(min_frequency, int)):
        raise ConfigError(f"{path}: key `{key}.min_frequency` = {min_frequency!r} must be a whole number >= 0.")
    if min_frequency is not None and min_frequency < 0:
        raise ConfigError(f"{path}: key `{key}.min_frequency` = {min_frequency} must be >= 0.")
    return TokenizerSpec("train", algorithm=algorithm, vocab_size=vocab_size, min_frequency=min_frequency)


def load_pretrained_tokenizer(path: str, source: str, seq_len: int) -> Any:
    """`AutoTokenizer` of a local folder, or of a Hub id found in the local cache (never downloaded)."""
    from transformers import AutoTokenizer

    where = f"{path}: key `data.tokenizer` = {source!r}"
    local = Path(os.path.expanduser(source))
    if local.exists() and not local.is_dir():
        raise ConfigError(f"{where} is a file; give the folder that holds it (tokenizer.json, tokenizer_config.json).")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(local) if local.is_dir() else source, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        kind = "folder" if local.is_dir() else "not a local folder, and not a Hub id in the local cache"
        raise ConfigError(
            f"{where}: {kind} that AutoTokenizer can load ({first[:160]}); give a tokenizer folder, 'bytes', or "
            "{train: bpe, vocab_size: N}."
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"{where}: a slow (Python) tokenizer; save it as a fast one (tokenizer.json) and use that.")
    tokenizer.model_max_length = seq_len  # after loading: as a keyword it would reach a checkpoint's config too
    document_markers(tokenizer, where)
    return tokenizer


def config_tokenizer(path: str, spec: TokenizerSpec, seq_len: int) -> Any | None:
    """The tokenizer when it is known before any data is read (bytes, a folder); None for one trained on the data."""
    from zpx_hf.tokenization_bytes import build_byte_tokenizer

    if spec.kind == "bytes":
        return build_byte_tokenizer(model_max_length=seq_len)
    if spec.kind == "pretrained":
        return load_pretrained_tokenizer(path, spec.source, seq_len)
    return None


def _batched(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def train_tokenizer(spec: TokenizerSpec, texts: Iterable[str], seq_len: int) -> Any:
    """A byte-level BPE or unigram model trained on `texts` (read once, in batches) as a `PreTrainedTokenizerFast`
    with `<pad>`/`<s>`/`</s>`/`<unk>` = 0/1/2/3, adding no special tokens by default (as the byte tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if spec.algorithm == "bpe":
        backend = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer: Any = trainers.BpeTrainer(
            vocab_size=spec.vocab_size,
            min_frequency=spec.min_frequency or 0,
            special_tokens=list(TRAINED_SPECIALS),
            initial_alphabet=alphabet,
            show_progress=False,
        )
    else:
        backend = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=spec.vocab_size,
            special_tokens=list(TRAINED_SPECIALS),
            initial_alphabet=alphabet,
            unk_token="<unk>",
            show_progress=False,
        )
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's split, bytes as symbols
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(_batched(texts, TRAIN_BATCH), trainer=trainer)
    # every process trains on the same split, but unigram's EM scores differ at float rounding from one training
    # to the next: all take process 0's
    backend = Tokenizer.from_str(process_zero_value(backend.to_str()))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=seq_len,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    ids = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id]
    if ids != [0, 1, 2, 3]:
        raise RuntimeError(f"trained tokenizer: special ids {ids}, expected [0, 1, 2, 3]")
    missing = [c for c in alphabet if c not in tokenizer.get_vocab()]
    if missing:  # a byte that cannot be encoded would become <unk>: never silently
        raise RuntimeError(f"trained tokenizer lacks {len(missing)} byte symbols of the byte-level alphabet")
    return tokenizer


def training_tokenizer(data: Any, train_texts: Iterable[str]) -> Any:
    """The tokenizer of a run (`data` is its `DataArguments`): the byte tokenizer, the folder's, or a model trained
    on `train_texts` (the training split; iterated once). A `PreTrainedTokenizerBase`."""
    spec = parse_tokenizer_spec("config", data.tokenizer)
    tokenizer = config_tokenizer("config", spec, data.seq_len)
    return tokenizer if tokenizer is not None else train_tokenizer(spec, train_texts, data.seq_len)


def document_markers(tokenizer: Any, where: str = "key `data.tokenizer`") -> tuple[list[int], list[int]]:
    """`(start, end)` token ids written around every document: `[bos]`, `[eos]` (none twice when BOS is EOS)."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    start = [bos] if bos is not None else []
    end = [eos] if eos is not None and eos != bos else []
    if not start and not end:
        raise ConfigError(
            f"{where}: the tokenizer has neither a BOS nor an EOS token to separate documents; set bos_token or "
            "eos_token in its tokenizer_config.json."
        )
    return start, end


def pad_id(tokenizer: Any) -> int:
    """The id written in padding (never attended, never a label): the tokenizer's pad, else its EOS, else BOS."""
    for token in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id):
        if token is not None:
            return token
    raise ConfigError("key `data.tokenizer`: the tokenizer has no pad, EOS or BOS token to pad with.")


def encode_texts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens added, and none read from the text: a literal `<s>` in a document
    is text (`split_special_tokens`), not a document boundary."""
    return tokenizer(texts, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]


def is_byte_tokenizer(tokenizer: Any) -> bool:
    """Whether `tokenizer` is the package's byte tokenizer (same vocabulary, same specials)."""
    from zpx_hf.tokenization_bytes import VOCAB_SIZE, build_byte_tokenizer

    return len(tokenizer) == VOCAB_SIZE and tokenizer.get_vocab() == build_byte_tokenizer().get_vocab()


def describe_tokenizer(data: Any, tokenizer: Any) -> str:
    """One line for cards and reports: the kind, where it came from (never an absolute path), its size."""
    spec = parse_tokenizer_spec("config", data.tokenizer)
    size = f"{len(tokenizer):,} tokens"
    if spec.kind == "bytes":
        return f"byte-level (zpx-hf's byte tokenizer), {size}"
    if spec.kind == "pretrained":
        name = Path(spec.source).name if Path(os.path.expanduser(spec.source)).is_dir() else spec.source
        return f"`{name}` ({type(tokenizer).__name__} through AutoTokenizer), {size}"
    return f"byte-level {spec.algorithm.upper()} trained on the training split with `tokenizers`, {size}"


TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def tokenizer_model_kwargs(path: str, model: dict[str, Any], spec: TokenizerSpec, tokenizer: Any | None) -> dict:
    """The `model:` mapping with `vocab_size` and the BOS/EOS/pad ids following the tokenizer (`tokenizer` None:
    one still to be trained, `spec.vocab_size` tokens, specials `TRAINED_SPECIALS`); an explicit value that
    disagrees is a `ConfigError` naming both keys. The byte tokenizer's ids are the family defaults."""
    size = len(tokenizer) if tokenizer is not None else spec.vocab_size
    init_from = model.get("init_from")
    if init_from is not None and spec.kind == "train":
        raise ConfigError(
            f"{path}: key `model.init_from` = {init_from!r} with `data.tokenizer` trained on the corpus: the new "
            "vocabulary would not match the checkpoint's; set data.tokenizer to the init_from folder."
        )
    explicit = model.get("vocab_size")
    if explicit is not None and explicit != size:
        raise ConfigError(
            f"{path}: key `model.vocab_size` = {explicit} conflicts with `data.tokenizer` ({size} tokens); remove "
            "model.vocab_size (it follows the tokenizer)."
        )
    if spec.kind == "bytes":
        return dict(model)
    kwargs = dict(model) if init_from is not None else {**model, "vocab_size": size}
    for key in TOKEN_ID_KEYS:
        token = getattr(tokenizer, key) if tokenizer is not None else TRAINED_IDS[key]
        if key in model and model[key] != token:
            raise ConfigError(
                f"{path}: key `model.{key}` = {model[key]} conflicts with `data.tokenizer`'s {key} {token}; remove "
                f"model.{key} (it follows the tokenizer)."
            )
        kwargs[key] = token  # no pad token: None, no padding row in the embedding (padding is masked and ignored)
    return kwargs


def fit_model_config(config: Any, model: dict[str, Any], tokenizer: Any, requested: int) -> None:
    """After training a tokenizer: the model config takes its size (a small corpus may give fewer than `requested`
    tokens) and special ids; `ConfigError` when `model.vocab_size` was given and the size differs."""
    size = len(tokenizer)
    if size != requested:
        if model.get("vocab_size") is not None:
            raise ConfigError(
                f"key `model.vocab_size` = {model['vocab_size']}: `data.tokenizer` learned only {size} of its "
                f"vocab_size {requested} tokens from this corpus; remove model.vocab_size or lower "
                "data.tokenizer.vocab_size."
            )
        print(
            f"warning: data.tokenizer learned {size} tokens, fewer than its vocab_size {requested} (the corpus has "
            f"no more merges); the model's vocab_size is {size}.",
            flush=True,
        )
    config.vocab_size = size
    for key in TOKEN_ID_KEYS:
        setattr(config, key, getattr(tokenizer, key))


__all__ = [
    "TokenizerSpec",
    "config_tokenizer",
    "describe_tokenizer",
    "document_markers",
    "encode_texts",
    "fit_model_config",
    "is_byte_tokenizer",
    "load_pretrained_tokenizer",
    "pad_id",
    "parse_tokenizer_spec",
    "tokenizer_model_kwargs",
    "train_tokenizer",
    "training_tokenizer",
]
