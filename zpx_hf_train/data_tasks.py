"""Embedded training data: a natural-language corpus and synthetic recall tasks, no downloads.

Text: the reference-manual topics that every CPython install carries in `pydoc_data.topics`
(Python Software Foundation documentation, PSF licence), split by topic deterministically into
train / held-out, or any local file or cached `datasets` dataset.

Synthetic tasks (token ids of the byte tokenizer, printable so examples decode legibly), each
deterministic given a seed:

- `mqar`: multi-query associative recall. `<s> aXbQcZ|bQaX`: key/value pairs, then queries; the
  answers are the values after each queried key.
- `passkey`: keyed retrieval in a haystack of a configurable total length. Several needles
  `Key Q is 83920.` (distinct capital key letters found nowhere else in the example, random digits)
  and distractor numbers `Room 51734.` sit at random depths in filler text; the question names one
  key (`What is key Q? Key Q is `) and the answer is that key's digits, so neither "copy the only
  number" nor "copy the last number" solves it. `compact=True`: needles `Q839.`, distractors `517.`,
  question `What is Q? Q`.
- `selective_copy`: data tokens scattered among noise `.` tokens; after `|` the answer is the data
  tokens in order.
- `listops_examples` (Long Range Arena's ListOps, Nangia & Bowman 2018; Tay et al. 2020): a nested
  expression of MAX / MIN / MED / SM (sum mod 10) over digits, one token per LRA token
  (`X2N93]7]` is LRA's `[MAX 2 [MIN 9 3 ] 7 ]`), then `=` and the value digit as the answer.

Every example is a dict of equal-length lists: `input_ids`, `attention_mask`, `labels` (the token
at answer positions, -100 elsewhere; HF causal convention, the model shifts) and `answer_mask`
(1 at answer positions), so accuracy is exact: position t is correct when
`argmax logits[t-1] == input_ids[t]`.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import itertools
import os
import random
import string
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from zpx_hf.tokenization_bytes import BOS_ID, EOS_ID, PAD_ID, text_to_ids

IGNORE_INDEX = -100
KEY_CHARS = string.ascii_lowercase
VALUE_CHARS = string.ascii_uppercase
DIGITS = string.digits
NOISE_CHAR = "."
SEPARATOR = "|"
PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
PASSKEY_TEMPLATE = " Key  is . Room . What is key ? "
# Needle keys: capital letters that occur nowhere else in a passkey example (not in the filler, not in the
# template words), so a key is one unambiguous token and matching it is the retrieval the task tests.
NEEDLE_KEY_CHARS = "".join(c for c in VALUE_CHARS if c not in PASSKEY_FILLER + PASSKEY_TEMPLATE)
TEXT_FILE_BUILDERS = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json"}
TEXT_FILE_BUILDERS.update({".csv": "csv", ".parquet": "parquet"})


def _example(
    segments: Sequence[tuple[str, bool]], seq_len: int | None, task: str, tokenizer: Any = None
) -> dict[str, Any]:
    """Concatenate `(text, is_answer)` segments after BOS; pad on the right to `seq_len`. With a `tokenizer` each
    segment is its tokens, after its document start marker (`zpx_hf_train.tokenizer.document_markers`)."""
    if tokenizer is None:
        encoded, pad = [text_to_ids(text) for text, _ in segments], PAD_ID
        input_ids = [BOS_ID]
    else:
        from zpx_hf_train.tokenizer import document_markers, encode_texts, pad_id

        encoded, pad = encode_texts(tokenizer, [text for text, _ in segments]), pad_id(tokenizer)
        input_ids = list(document_markers(tokenizer)[0])
    answer_mask = [0] * len(input_ids)
    for (_, is_answer), ids in zip(segments, encoded):
        input_ids += ids
        answer_mask += [int(is_answer)] * len(ids)
    length = len(input_ids)
    if seq_len is not None:
        if length > seq_len:
            raise ValueError(
                f"task `{task}` needs {length} tokens but seq_len={seq_len}: raise seq_len or shrink the task."
            )
        input_ids += [pad] * (seq_len - length)
        answer_mask += [0] * (seq_len - length)
    attention_mask = [1] * length + [0] * (len(input_ids) - length)
    labels = [tok if is_answer else IGNORE_INDEX for tok, is_answer in zip(input_ids, answer_mask)]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "answer_mask": answer_mask}


def mqar_examples(
    num_examples: int,
    seed: int,
    num_pairs: int = 8,
    num_queries: int | None = None,
    seq_len: int | None = None,
    query_replacement: bool = False,
    tokenizer: Any = None,
) -> list[dict[str, Any]]:
    """Multi-query associative recall: distinct keys (a-z), values (A-Z).

    Queries are drawn without replacement by default; `query_replacement=True` draws each query
    independently (a key may be asked twice, `num_queries` may exceed `num_pairs`), which removes the
    "answer a value not yet asked" shortcut that otherwise scores well above chance without any recall."""
    num_queries = num_pairs if num_queries is None else num_queries
    if not 1 <= num_pairs <= len(KEY_CHARS):
        raise ValueError(f"mqar num_pairs={num_pairs} must be in [1, {len(KEY_CHARS)}] (one letter per key).")
    if num_queries < 1 or (not query_replacement and num_queries > num_pairs):
        raise ValueError(
            f"mqar num_queries={num_queries} must be in [1, num_pairs={num_pairs}] "
            "(or set query_replacement=True to ask more queries than pairs)."
        )
    rng = random.Random(f"mqar-{seed}")
    out = []
    for _ in range(num_examples):
        keys = rng.sample(KEY_CHARS, num_pairs)
        values = [rng.choice(VALUE_CHARS) for _ in keys]
        table = dict(zip(keys, values))
        segments: list[tuple[str, bool]] = [("".join(k + v for k, v in zip(keys, values)) + SEPARATOR, False)]
        queries = [rng.choice(keys) for _ in range(num_queries)] if query_replacement else rng.sample(keys, num_queries)
        for query in queries:
            segments += [(query, False), (table[query], True)]
        out.append(_example(segments, seq_len, "mqar", tokenizer))
    return out


def passkey_examples(
    num_examples: int,
    seed: int,
    seq_len: int = 128,
    num_digits: int = 5,
    pad_to: int | None = None,
    num_needles: int = 3,
    num_distractors: int = 2,
    compact: bool = False,
    tokenizer: Any = None,
) -> list[dict[str, Any]]:
    """Keyed pass-key retrieval filling exactly `seq_len` tokens (BOS included) of the byte tokenizer (with another
    `tokenizer`: `seq_len` characters, as many tokens as they encode to).

    `num_needles` statements `Key <letter> is <digits>.` with distinct capital letters (`NEEDLE_KEY_CHARS`) and
    `num_distractors` numbers `Room <digits>.` (same digit count) are inserted at uniform random depths of the
    filler; the question (`What is key <letter>? Key <letter> is `) asks for one needle's key, uniformly chosen.
    `compact=True` writes a needle as `<letter><digits>.`, a distractor as `<digits>.` and the question as
    `What is <letter>? <letter>`: the key sits next to its number, the form a 2-layer model learns quickly."""
    if not 1 <= num_needles <= len(NEEDLE_KEY_CHARS):
        raise ValueError(
            f"passkey num_needles={num_needles} must be in [1, {len(NEEDLE_KEY_CHARS)}] (one letter per key)."
        )
    if num_distractors < 0 or num_digits < 1:
        raise ValueError(f"passkey num_distractors={num_distractors} must be >= 0 and num_digits={num_digits} >= 1.")
    rng = random.Random(f"passkey-{seed}")
    out = []
    for _ in range(num_examples):
        letters = rng.sample(NEEDLE_KEY_CHARS, num_needles)
        codes = ["".join(rng.choice(DIGITS) for _ in range(num_digits)) for _ in letters]
        needle, distractor = (" {}{}.", " {}.") if compact else (" Key {} is {}.", " Room {}.")
        pieces = [needle.format(letter, code) for letter, code in zip(letters, codes)]
        pieces += [
            distractor.format("".join(rng.choice(DIGITS) for _ in range(num_digits))) for _ in range(num_distractors)
        ]
        rng.shuffle(pieces)
        asked = rng.randrange(num_needles)
        key = letters[asked]
        question = f" What is {key}? {key}" if compact else f" What is key {key}? Key {key} is "
        filler_len = seq_len - 1 - sum(map(len, pieces)) - len(question) - num_digits
        if filler_len < 0:
            minimum = seq_len - filler_len
            raise ValueError(
                f"passkey seq_len={seq_len} is too short for {num_needles} needles and {num_distractors} "
                f"distractors: it needs at least {minimum} tokens."
            )
        filler = (PASSKEY_FILLER * (filler_len // len(PASSKEY_FILLER) + 1))[:filler_len]
        depths = sorted(rng.randint(0, filler_len) for _ in pieces)
        context, cut = "", 0
        for depth, piece in zip(depths, pieces):
            context += filler[cut:depth] + piece
            cut = depth
        context += filler[cut:] + question
        out.append(
            _example(
                [(context, False), (codes[asked], True)],
                pad_to if pad_to is not None else seq_len,
                "passkey",
                tokenizer,
            )
        )
    return out


def selective_copy_examples(
    num_examples: int,
    seed: int,
    num_tokens: int = 8,
    num_positions: int = 32,
    seq_len: int | None = None,
    tokenizer: Any = None,
) -> list[dict[str, Any]]:
    """Selective copying: `num_tokens` letters at random positions among `num_positions` noise slots."""
    if not 1 <= num_tokens <= num_positions:
        raise ValueError(f"selective_copy num_tokens={num_tokens} must be in [1, num_positions={num_positions}].")
    rng = random.Random(f"selective_copy-{seed}")
    out = []
    for _ in range(num_examples):
        data = [rng.choice(KEY_CHARS) for _ in range(num_tokens)]
        slots = [NOISE_CHAR] * num_positions
        for position, token in zip(sorted(rng.sample(range(num_positions), num_tokens)), data):
            slots[position] = token
        segments = [("".join(slots) + SEPARATOR, False), ("".join(data), True)]
        out.append(_example(segments, seq_len, "selective_copy", tokenizer))
    return out


# ListOps, as LRA's generator (lra_benchmarks/data/listops.py): operators, the probability that a node below the
# maximum depth is an operator, the answer marker; one byte token per LRA token.
LISTOPS_OPERATORS = {"X": "MAX", "N": "MIN", "D": "MED", "S": "SM"}
LISTOPS_END = "]"
LISTOPS_OPERATOR_P = 0.25
LISTOPS_MARKER = "="
# Splits by a hash of the expression, so that validation / test expressions never occur in training whatever
# the seeds (LRA splits one de-duplicated set): bucket 0 test, 1 validation, 2-9 training.
LISTOPS_SPLITS = {"test": (0,), "val": (1,), "train": tuple(range(2, 10))}


def _listops_tree(rng: random.Random, depth: int, max_depth: int, max_args: int) -> tuple[str, int]:
    """(tokens, value) of a subtree at `depth` (1 = the root), drawn in LRA's order: operator or leaf, the
    argument count, the arguments, then the operator."""
    if depth >= max_depth or rng.random() > LISTOPS_OPERATOR_P:
        value = rng.randrange(10)
        return str(value), value
    args = [_listops_tree(rng, depth + 1, max_depth, max_args) for _ in range(rng.randint(2, max_args))]
    op = rng.choice(list(LISTOPS_OPERATORS))
    values = [v for _, v in args]
    if op == "X":
        value = max(values)
    elif op == "N":
        value = min(values)
    elif op == "D":  # LRA: int(np.median(values)), the mean of the two middle values rounded down
        ordered = sorted(values)
        value = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) // 2
    else:
        value = sum(values) % 10
    return op + "".join(t for t, _ in args) + LISTOPS_END, value


def listops_max_tokens(max_depth: int, max_args: int) -> int:
    """Tokens of the longest expression the limits allow (every node an operator with `max_args` arguments)."""
    length = 1
    for _ in range(max_depth - 1):
        length = 2 + max_args * length
    return length


def listops_examples(
    num_examples: int,
    seed: int,
    split: str = "train",
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    seq_len: int | None = None,
) -> list[dict[str, Any]]:
    """ListOps as LRA generates it: expressions with `min_length < tokens < max_length` (LRA: 500, 2000), tree
    depth <= `max_depth` (the root is depth 1, a leaf at `max_depth`), 2 .. `max_args` arguments per operator;
    `<s> expression = value`, the value digit (10 classes) the one answer token. Examples of different splits
    are disjoint (`LISTOPS_SPLITS`); `seq_len` pads on the right (default: unpadded)."""
    if split not in LISTOPS_SPLITS:
        raise ValueError(f"listops split={split!r} must be one of {sorted(LISTOPS_SPLITS)}.")
    if max_depth < 2 or max_args < 2:
        raise ValueError(f"listops max_depth={max_depth} and max_args={max_args} must be >= 2 (one operator).")
    if min_length < 1 or max_length <= max(min_length + 1, 4):
        raise ValueError(
            f"listops needs 1 <= min_length < max_length - 1 and max_length > 4 (an operator over two digits is 4 "
            f"tokens); got min_length={min_length}, max_length={max_length}."
        )
    if min_length >= listops_max_tokens(max_depth, max_args):
        raise ValueError(
            f"listops min_length={min_length}: expressions of max_depth={max_depth}, max_args={max_args} have at most "
            f"{listops_max_tokens(max_depth, max_args)} tokens; lower min_length or raise the limits."
        )
    rng = random.Random(f"listops-{split}-{seed}")
    buckets = LISTOPS_SPLITS[split]
    out: list[dict[str, Any]] = []
    while len(out) < num_examples:
        tokens, value = _listops_tree(rng, 1, max_depth, max_args)
        if not min_length < len(tokens) < max_length:  # LRA's rejection of too short / too long expressions
            continue
        if hashlib.sha1(tokens.encode()).digest()[0] % 10 not in buckets:
            continue
        out.append(_example([(tokens + LISTOPS_MARKER, False), (str(value), True)], seq_len, "listops"))
    return out


TASKS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "mqar": mqar_examples,
    "passkey": passkey_examples,
    "selective_copy": selective_copy_examples,
}


def task_examples(task: str, num_examples: int, seed: int, seq_len: int | None, **params: Any) -> list[dict[str, Any]]:
    """Examples of one task padded to `seq_len`; passkey fills exactly `params.get('length', seq_len)` tokens."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: expected one of {sorted(TASKS)}.")
    if task == "passkey":
        length = params.pop("length", seq_len)
        return passkey_examples(num_examples, seed, seq_len=length, pad_to=seq_len, **params)
    return TASKS[task](num_examples, seed, seq_len=seq_len, **params)


def task_dataset(task: str, num_examples: int, seed: int, seq_len: int, **params: Any) -> Any:
    """`datasets.Dataset` of one task (columns: input_ids, attention_mask, labels, answer_mask, task)."""
    from datasets import Dataset

    rows = task_examples(task, num_examples, seed, seq_len, **params)
    columns = {key: [row[key] for row in rows] for key in ("input_ids", "attention_mask", "labels", "answer_mask")}
    columns["task"] = [task] * len(rows)
    return Dataset.from_dict(columns)


# ---- text corpus -----------------------------------------------------------------------------


def pydoc_documents() -> list[str]:
    """The reference-manual topics shipped with CPython (`pydoc_data.topics`), sorted by topic name."""
    try:
        from pydoc_data.topics import topics
    except ImportError as error:  # some distributions split pydoc_data out of the stdlib package
        raise RuntimeError(
            "the embedded corpus needs the stdlib module `pydoc_data` (missing from this Python); "
            "point `data.text_source` at a local text file instead."
        ) from error
    return [topics[name] for name in sorted(topics)]


class DocumentView(Sequence[str]):
    """The text documents of a `datasets.Dataset` column (rows `indices`), read when used and in batches: a corpus
    larger than memory is never held whole, and `pack_documents` with `max_blocks` reads only what it packs."""

    BATCH = 1024

    def __init__(self, dataset: Any, column: str, indices: Sequence[int]) -> None:
        self.dataset, self.column = dataset, column
        self.indices = array.array("q", indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.subset(range(len(self))[index])
        return self.dataset[int(self.indices[index])][self.column]

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), self.BATCH):
            yield from self.dataset[list(self.indices[start : start + self.BATCH])][self.column]

    def subset(self, positions: Sequence[int]) -> DocumentView:
        """The documents at `positions` of this view, still unread."""
        return DocumentView(self.dataset, self.column, [self.indices[i] for i in positions])


def text_documents(dataset: Any, column: str) -> DocumentView:
    """The rows of `column` that hold text (a string, not blank), found in one streamed pass over the column (read
    from the dataset's files without a memory map, `data_pipeline.file_batches`: no page stays resident)."""
    from .data_pipeline import file_batches

    rows = dataset.select_columns([column])
    indices, offset = array.array("q"), 0
    batches = file_batches(dataset, [column])
    if batches is None:  # in memory, sliced or through indices: datasets' own reads
        batches = (batch[column] for batch in rows.iter(batch_size=DocumentView.BATCH))
    for batch in batches:
        texts = batch if isinstance(batch, list) else batch.column(0).to_pylist()
        indices.extend(offset + i for i, text in enumerate(texts) if isinstance(text, str) and text.strip())
        offset += len(texts)
    return DocumentView(rows, column, indices)


def split_documents(
    documents: Sequence[str], heldout_fraction: float, seed: int
) -> tuple[Sequence[str], Sequence[str]]:
    """Deterministic document-level split `(train, held out)`; a single document is split by characters instead.
    A `DocumentView` (documents already non-blank) is split into views, unread; a list into lists."""
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction={heldout_fraction} must be in (0, 1).")
    if not isinstance(documents, DocumentView):
        documents = [doc for doc in documents if doc]
    if len(documents) < 2:
        text = documents[0] if len(documents) else ""
        cut = int(len(text) * (1 - heldout_fraction))
        return [text[:cut]], [text[cut:]]
    order = list(range(len(documents)))
    random.Random(f"split-{seed}").shuffle(order)
    num_heldout = max(1, round(len(documents) * heldout_fraction))
    heldout = set(order[:num_heldout])
    train = [i for i in range(len(documents)) if i not in heldout]
    held = [i for i in range(len(documents)) if i in heldout]
    if isinstance(documents, DocumentView):
        return documents.subset(train), documents.subset(held)
    return [documents[i] for i in train], [documents[i] for i in held]


def is_local_source(source: str) -> bool:
    """Whether a text source names a local file or folder (rather than a Hub dataset id)."""
    return (
        os.path.exists(source)
        or os.path.splitext(source)[1].lower() in TEXT_FILE_BUILDERS
        or source.startswith((".", "/", "~"))
    )


def load_documents(
    source: str = "pydoc",
    text_column: str = "text",
    dataset_config_name: str | None = None,
    split: str = "train",
    max_documents: int | None = None,
) -> list[str]:
    """Documents from `"pydoc"` (embedded), a local file (txt/md: one document per paragraph;
    json/jsonl/csv/parquet: `text_column`), a local folder (`save_to_disk` output or data files), or a
    dataset id that `datasets` can load (offline: from the cache)."""
    return list(open_documents(source, text_column, dataset_config_name, split, max_documents))


def open_documents(
    source: str = "pydoc",
    text_column: str = "text",
    dataset_config_name: str | None = None,
    split: str = "train",
    max_documents: int | None = None,
) -> Sequence[str]:
    """`load_documents` without reading them: a `DocumentView` of a `datasets` source (the jobs read only the
    documents their `max_train_blocks` / `max_eval_blocks` need), the list of the embedded corpus."""
    if source == "pydoc":
        documents: Sequence[str] = pydoc_documents()
    else:
        if is_local_source(source):
            dataset = _load_local(os.path.expanduser(source), split)
        else:
            from datasets import load_dataset

            dataset = load_dataset(source, dataset_config_name, split=split)
        if text_column not in dataset.column_names:
            raise ValueError(
                f"config key `data.text_column`: column {text_column!r} not in {source!r} "
                f"(columns: {dataset.column_names})."
            )
        documents = text_documents(dataset, text_column)
    return documents[:max_documents] if max_documents else documents


def open_stream(
    source: str = "pydoc", text_column: str = "text", dataset_config_name: str | None = None, split: str = "train"
) -> Any:
    """The source of `open_documents` as a `datasets.IterableDataset` read lazily (`data.streaming`): local files
    and Hub datasets through `load_dataset(..., streaming=True)`, a `save_to_disk` folder or the embedded corpus
    through `to_iterable_dataset`. Its first row is read here, so a missing `text_column` fails now."""
    from datasets import Dataset, load_dataset

    if source == "pydoc":
        stream = Dataset.from_dict({text_column: pydoc_documents()}).to_iterable_dataset()
    elif is_local_source(source):
        path = os.path.expanduser(source)
        saved = os.path.isdir(path) and any(
            os.path.exists(os.path.join(path, name)) for name in ("dataset_info.json", "dataset_dict.json")
        )
        if saved or not os.path.exists(path):
            stream = _load_local(path, split).to_iterable_dataset()
        elif os.path.isdir(path):
            stream = load_dataset(path, split=split, streaming=True)
        else:
            builder = TEXT_FILE_BUILDERS.get(os.path.splitext(path)[1].lower())
            if builder is None:
                _load_local(path, split)  # raises the error naming the file types
            extra = {"sample_by": "paragraph"} if builder == "text" else {}
            stream = load_dataset(builder, data_files=path, split="train", streaming=True, **extra)
    else:
        stream = load_dataset(source, dataset_config_name, split=split, streaming=True)
    with _datasets_quiet():
        first = next(iter(stream.take(1)), None)
    if first is not None and text_column not in first:
        raise ValueError(
            f"config key `data.text_column`: column {text_column!r} not in {source!r} (columns: {sorted(first)})."
        )
    return stream


@contextlib.contextmanager
def _datasets_quiet() -> Iterator[None]:
    """datasets' progress bars and its ERROR log line off while a local file is read: on a file it cannot parse
    they would come before the job's one-line error, which carries the parser's reason."""
    import datasets
    from datasets.utils import logging as datasets_logging

    verbosity, bars = datasets_logging.get_verbosity(), datasets.is_progress_bar_enabled()
    datasets_logging.set_verbosity(datasets_logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets_logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def _load_local(path: str, split: str) -> Any:
    with _datasets_quiet():
        return _read_local(path, split)


def _read_local(path: str, split: str) -> Any:
    from datasets import DatasetDict, load_dataset, load_from_disk

    if not os.path.exists(path):
        raise FileNotFoundError(f"config key `data.text_source`: no such file {path!r}.")
    if os.path.isdir(path):
        saved = ("dataset_info.json", "dataset_dict.json")
        if not any(os.path.exists(os.path.join(path, name)) for name in saved):
            return load_dataset(path, split=split)  # a folder of data files
        dataset = load_from_disk(path)
        if isinstance(dataset, DatasetDict):
            if split not in dataset:
                raise ValueError(f"config key `data.dataset_split`: {split!r} not in {path!r} ({list(dataset)}).")
            dataset = dataset[split]
        return dataset
    builder = TEXT_FILE_BUILDERS.get(os.path.splitext(path)[1].lower())
    if builder is None:
        raise ValueError(
            f"config key `data.text_source`: cannot read {path!r}; expected a folder, one of "
            f"{sorted(TEXT_FILE_BUILDERS)}, or 'pydoc'."
        )
    extra = {"sample_by": "paragraph"} if builder == "text" else {}
    return load_dataset(builder, data_files=path, split="train", **extra)


def pack_documents(
    documents: Sequence[str], seq_len: int, max_blocks: int | None = None, tokenizer: Any = None
) -> list[list[int]]:
    """`<s> doc </s> <s> doc </s> ...` cut into full blocks of `seq_len` tokens (the tail is dropped). With a
    `tokenizer` (`PreTrainedTokenizerBase`; None: the byte ids), documents are tokenized in batches and written
    between its markers (`zpx_hf_train.tokenizer.document_markers`).

    Linear time: each token is copied once into the pending stream and once into its block (cutting the
    stream's head off after every block re-copied the rest: quadratic in a long document)."""
    if tokenizer is None:
        start, end = [BOS_ID], [EOS_ID]
        batches: Iterator[list[list[int]]] = ([text_to_ids(doc)] for doc in documents)
    else:
        from zpx_hf_train.tokenizer import ENCODE_BATCH, document_markers, encode_texts

        start, end = document_markers(tokenizer)
        texts = iter(documents)
        chunks = iter(lambda: list(itertools.islice(texts, ENCODE_BATCH)), [])
        batches = (encode_texts(tokenizer, chunk) for chunk in chunks)
    blocks: list[list[int]] = []
    stream: list[int] = []
    for batch in batches:
        for ids in batch:
            stream += [*start, *ids, *end]
            full = len(stream) // seq_len
            if max_blocks is not None:
                full = min(full, max_blocks - len(blocks))
            blocks += [stream[i * seq_len : (i + 1) * seq_len] for i in range(full)]
            del stream[: full * seq_len]  # what is left is shorter than a block (or the cap is reached)
            if max_blocks is not None and len(blocks) >= max_blocks:
                return blocks
    return blocks


def text_dataset(documents: Sequence[str], seq_len: int, max_blocks: int | None = None, tokenizer: Any = None) -> Any:
    """`datasets.Dataset` of packed LM blocks (labels = input_ids)."""
    from datasets import Dataset

    blocks = pack_documents(documents, seq_len, max_blocks, tokenizer)
    if not blocks:
        raise ValueError(f"the text corpus is shorter than one block of seq_len={seq_len} tokens.")
    return Dataset.from_dict(
        {"input_ids": blocks, "attention_mask": [[1] * seq_len for _ in blocks], "labels": [list(b) for b in blocks]}
    )


__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "is_local_source",
    "DocumentView",
    "load_documents",
    "mqar_examples",
    "open_documents",
    "open_stream",
    "pack_documents",
    "passkey_examples",
    "pydoc_documents",
    "selective_copy_examples",
    "split_documents",
    "task_dataset",
    "task_examples",
    "text_dataset",
    "text_documents",
]
