"""The text corpus as training rows through Arrow files: a corpus of any size in bounded memory.

- `tokenize_documents` (the one function that calls the tokenizer): `[bos] + tokenizer(text)["input_ids"] + [eos]`
  per document with a batched `datasets.map` (`data.num_proc` processes), written as Arrow files named by a
  fingerprint of the source (its data files' names, sizes and modification times, or an in-memory corpus's text),
  the selected documents, the tokenizer (its `tokenizer.json`, else its pickled state) and `FORMAT_VERSION`. A
  second run with the same corpus and tokenizer reuses the file and prints so; a changed corpus, selection or
  tokenizer gets a new file. Files live in `data.cache_dir` (default `$HF_DATASETS_CACHE/zpx_hf_train`).
  Ranges of `TOKENIZE_RANGE` documents are mapped in turn, each over a fresh memory map of the corpus.
- `group_blocks`: the token stream of the documents, in order, cut into full blocks of `seq_len` (the tail is
  dropped): `pack_documents`' blocks, from the token file read record batch by record batch (`file_batches`).
- `pack_rows` (`data.packing`): rows' documents placed whole, in order, into rows of `seq_len` (next fit) with
  `position_ids` restarting at each; document lengths are found and rows filled with numpy, the rows read
  forward through the files (`_Rows`).
- Peak RSS: no pass reads a whole file through a memory map (its pages would stay resident, and count in
  `ru_maxrss`, until the map is closed): one range, one record batch at a time.
- `TextStream` (`data.streaming`): documents read lazily from the source, this process's shard
  (`split_dataset_by_node`), held-out documents dropped by hash, tokenized, cut into blocks of one continuous
  stream and drawn through a seeded shuffle buffer; `state_dict()` (source position, the pending tokens, the
  buffer, the generator) is saved with every checkpoint, so a resumed run continues the stream exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

IGNORE_INDEX = -100
FORMAT_VERSION = "2"  # part of every cache fingerprint: bump when the layout of the cached files changes
TOKENIZE_BATCH = 256  # documents per `map` batch: one batch's Python lists stay a few MB
TOKENIZE_RANGE = 8192  # documents per fresh memory map of the corpus (`tokenize_documents`): ~100 MB of text
ROW_BATCH = 512  # blocks or packed rows per `map` batch
FIRST_RANGE = 256  # documents tokenized first under a block cap; each further range is twice the last
STREAM_STATE = "data_stream_state-rank{rank}.json"  # a streaming run's position, per process, in each checkpoint


def cache_folder(cache_dir: str | None = None) -> Path:
    """Where tokenized corpora are cached: `cache_dir`, else `$HF_DATASETS_CACHE/zpx_hf_train`."""
    import datasets

    return Path(os.path.expanduser(cache_dir)) if cache_dir else Path(datasets.config.HF_DATASETS_CACHE, "zpx_hf_train")


def special_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """`(start, end)` token ids the tokenizer wraps every document in (`tokenizer.document_markers`: `[bos]`,
    `[eos]`, none twice when BOS is EOS)."""
    from .tokenizer import document_markers

    start, end = document_markers(tokenizer)
    return [int(i) for i in start], [int(i) for i in end]


def document_boundary(tokenizer: Any) -> tuple[int | None, int | None]:
    """`(start id, None)` when documents open with a marker (a document begins at it), else `(None, end id)` (a
    document begins right after the end marker): where `pack_rows` restarts positions."""
    start, end = special_ids(tokenizer)
    return (start[0], None) if start else (None, end[0])


def token_dtype(tokenizer: Any) -> str:
    """The narrowest Arrow type of the tokenizer's ids (a byte or 50k-token vocabulary fits uint16)."""
    return "uint16" if len(tokenizer) <= 1 << 16 else "int32"


def row_features(tokenizer: Any, position_ids: bool = False) -> Any:
    """Features of training rows: ids in `token_dtype`, labels int32 (they hold -100), masks int8."""
    from datasets import Features, List, Value

    columns = {
        "input_ids": List(Value(token_dtype(tokenizer))),
        "attention_mask": List(Value("int8")),
        "labels": List(Value("int32")),
    }
    if position_ids:
        columns["position_ids"] = List(Value("int32"))
    return Features(columns)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A digest of everything that decides the ids: the class, `tokenizer.json` (fast) or the pickled tokenizer
    (slow), the BOS / EOS ids."""
    digest = hashlib.sha256(type(tokenizer).__qualname__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
    else:
        from datasets.fingerprint import Hasher

        digest.update(Hasher.hash(tokenizer).encode())
    digest.update(json.dumps(special_ids(tokenizer)).encode())
    return digest.hexdigest()


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps([FORMAT_VERSION, *parts]).encode()).hexdigest()[:24]


def source_fingerprint(documents: Any) -> str:
    """A digest of a `DocumentView`'s rows: the dataset's Arrow files (name, size, mtime: datasets names the cache
    of a data file by the file's own size and mtime), else the text of an in-memory dataset; the column; the
    selected row indices."""
    digest = hashlib.sha256(documents.column.encode())
    files = documents.dataset.cache_files
    for entry in files:
        stat = os.stat(entry["filename"])
        digest.update(f"{entry['filename']}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    if not files:  # an in-memory corpus (the embedded one): hash its text
        for batch in documents.dataset.iter(batch_size=1024):
            for text in batch[documents.column]:
                digest.update(f"{len(text or '')}\0{text or ''}".encode())
    digest.update(np.asarray(documents.indices, dtype=np.int64).tobytes())
    return digest.hexdigest()


class _Tokenize:
    """The batched map function of `tokenize_documents` (a class, so `num_proc` workers can pickle it)."""

    def __init__(self, tokenizer: Any, column: str) -> None:
        self.tokenizer, self.column = tokenizer, column
        self.bos, self.eos = special_ids(tokenizer)

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        from .tokenizer import encode_texts  # a literal "<s>" in the text is text, never a document boundary

        ids = encode_texts(self.tokenizer, batch[self.column])
        return {"input_ids": [self.bos + doc + self.eos for doc in ids]}


def tokenize_documents(
    documents: Any, tokenizer: Any, num_proc: int | None = None, cache_dir: str | None = None
) -> tuple[Any, bool]:
    """`(dataset, reused)`: the documents of a `DocumentView` tokenized into Arrow files (`input_ids`: BOS, the
    tokenizer's ids, EOS), and whether the files came from the cache of an earlier run. Ranges of `TOKENIZE_RANGE`
    documents are mapped in turn, each over a fresh memory map of the corpus's files, dropped after it: the pages
    of the corpus a range read leave the resident set with it, so the peak RSS does not grow with the corpus."""
    from datasets import Dataset, Features, List, Value, concatenate_datasets

    key = _digest(source_fingerprint(documents), tokenizer_fingerprint(tokenizer))
    folder = cache_folder(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    before = {str(p) for p in folder.glob(f"tokens-{key}*.arrow")}
    indices = np.asarray(documents.indices, dtype=np.int64)
    blocks = table_blocks(documents.dataset) or []  # else a view: datasets' own reads; in memory: no page to drop
    mapped = bool(blocks) and all(whole_file(block, [documents.column]) for block in blocks)
    parts = []
    for number, start in enumerate(range(0, max(len(indices), 1), TOKENIZE_RANGE)):
        source = documents.dataset
        if mapped:
            files = [Dataset.from_file(block.path) for block in blocks]
            source = concatenate_datasets(files).select_columns([documents.column])
        selected = source.select(indices[start : start + TOKENIZE_RANGE])
        parts.append(
            selected.map(
                _Tokenize(tokenizer, documents.column),
                batched=True,
                batch_size=TOKENIZE_BATCH,
                remove_columns=selected.column_names,
                features=Features({"input_ids": List(Value(token_dtype(tokenizer)))}),
                num_proc=num_proc if num_proc and num_proc > 1 and len(selected) > 1 else None,
                cache_file_name=str(folder / f"tokens-{key}-{number:05d}.arrow"),
                new_fingerprint=f"{key}-{number:05d}",
                desc="Tokenizing documents",
            )
        )
        del source, selected  # the range's memory map is closed with its last reference
    tokens = concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    reused = bool(before) and all(entry["filename"] in before for entry in tokens.cache_files)
    return tokens, reused


def token_count(tokens: Any) -> int:
    """Tokens of a tokenized dataset, from its list offsets (no token is read)."""
    import pyarrow.compute as pc

    column = tokens.data.column("input_ids")
    return int(pc.sum(pc.list_value_length(column)).as_py() or 0) if len(column) else 0


def tokenize_for_blocks(
    documents: Any, tokenizer: Any, seq_len: int, max_blocks: int | None, num_proc: int | None, cache_dir: str | None
) -> tuple[Any, bool]:
    """`tokenize_documents` of every document, or under a block cap of the first ranges of documents (256, 512,
    1024, ... documents) until they hold `max_blocks` blocks: a capped run tokenizes about what it uses."""
    from datasets import concatenate_datasets

    if max_blocks is None:
        return tokenize_documents(documents, tokenizer, num_proc, cache_dir)
    parts, reused, start, size, total = [], True, 0, FIRST_RANGE, 0
    while start < len(documents) and total < max_blocks * seq_len:
        stop = min(start + size, len(documents))
        part, hit = tokenize_documents(documents.subset(range(start, stop)), tokenizer, num_proc, cache_dir)
        parts.append(part)
        reused, total, start, size = reused and hit, total + token_count(part), stop, size * 2
    return concatenate_datasets(parts), reused


def table_blocks(dataset: Any) -> list[Any] | None:
    """The tables whose rows, in order, are exactly the dataset's (`datasets.table` blocks: memory-mapped files or
    slices of them, `whole_file` tells; in-memory tables; several after `concatenate_datasets`); `None` when the
    dataset reads its table through an indices mapping or joins columns."""
    from datasets.table import ConcatenationTable

    table = dataset.data
    rows = table.blocks if isinstance(table, ConcatenationTable) else [[table]]
    if len(dataset) != table.num_rows or any(len(row) != 1 for row in rows):
        return None
    return [row[0] for row in rows]


def whole_file(block: Any, columns: list[str]) -> bool:
    """Whether a memory-mapped block holds all its file's rows and `columns` as the file stores them (not sliced,
    filtered, renamed or cast)."""
    import pyarrow as pa
    from datasets.table import MemoryMappedTable

    if not isinstance(block, MemoryMappedTable) or not set(columns) <= set(block.column_names):
        return False
    with pa.memory_map(block.path) as source:  # the stream's message headers only: no column page is touched
        reader = pa.ipc.open_stream(source)
        stored = {field.name: field.type for field in reader.schema}
        if any(stored.get(name) != block.schema.field(name).type for name in columns):
            return False
        return sum(batch.num_rows for batch in reader) == block.num_rows


def file_batches(dataset: Any, columns: list[str]) -> Iterator[Any] | None:
    """`columns` of a dataset one Arrow record batch at a time: a memory-mapped file's read from the file into
    memory and freed after use (`pa.OSFile`, no memory map: a pass over a memory-mapped file keeps every page it
    touched in the process's resident set, so its peak RSS would grow with the corpus), an in-memory table's as
    they are (the task examples `build_datasets` appends to the text blocks); `None` when the dataset is not
    exactly its tables' rows (`table_blocks`), holds no whole file (`whole_file`), or lacks a column."""
    import pyarrow as pa
    from datasets.table import InMemoryTable

    blocks = table_blocks(dataset)
    if not blocks or any(not set(columns) <= set(block.column_names) for block in blocks):
        return None
    in_memory = [isinstance(block, InMemoryTable) for block in blocks]
    if all(in_memory) or not all(keep or whole_file(block, columns) for block, keep in zip(blocks, in_memory)):
        return None

    def batches() -> Iterator[Any]:
        for block, keep in zip(blocks, in_memory):
            if keep:
                yield from (batch.select(columns) for batch in block.table.to_batches())
                continue
            with pa.OSFile(block.path) as source:
                for batch in pa.ipc.open_stream(source):
                    yield batch.select(columns)

    return batches()


def _block_batches(tokens: Any, seq_len: int, num_blocks: int) -> Iterator[np.ndarray]:
    """The first `num_blocks` blocks of the token stream, `ROW_BATCH * 8` at a time (the record batches of the
    blocks file: each one's header is a page touched through the memory map that reads it), read batch by batch."""
    batches = file_batches(tokens, ["input_ids"])
    if batches is None:  # in memory: no mapped page to keep
        batches = tokens.data.select(["input_ids"]).to_batches()
    pending, done = np.zeros(0, dtype=np.int64), 0
    for batch in batches:
        flat = batch.column(0).flatten().to_numpy()
        pending = np.concatenate([pending, flat]) if len(pending) else flat
        full = min(len(pending) // seq_len, num_blocks - done)
        for first in range(0, full, ROW_BATCH * 8):
            count = min(ROW_BATCH * 8, full - first)
            yield pending[first * seq_len : (first + count) * seq_len].reshape(count, seq_len)
        pending, done = pending[full * seq_len :].copy(), done + full
        if done == num_blocks:
            return


def write_rows(path: Path, features: Any, batches: Iterator[dict[str, np.ndarray]]) -> Any:
    """An Arrow file of 2-D arrays' rows (`features`: list columns), written beside `path` and renamed into it
    (a killed run leaves no partial file under the cache name); the dataset memory-mapped from it."""
    import pyarrow as pa
    from datasets import Dataset
    from datasets.arrow_writer import ArrowWriter

    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    schema = features.arrow_schema
    with ArrowWriter(features=features, path=str(partial)) as writer:
        for batch in batches:
            columns = []
            for name in schema.names:
                values = batch[name]
                offsets = np.arange(0, values.size + 1, values.shape[1], dtype=np.int32)
                flat = pa.array(values.reshape(-1), type=schema.field(name).type.value_type)
                columns.append(pa.ListArray.from_arrays(pa.array(offsets), flat))
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
        writer.finalize()
    os.replace(partial, path)
    return Dataset.from_file(str(path))


def group_blocks(
    tokens: Any, tokenizer: Any, seq_len: int, max_blocks: int | None = None, cache_dir: str | None = None
) -> Any:
    """The documents' token stream cut into full blocks of `seq_len` (at most `max_blocks`; the tail dropped), as
    an Arrow dataset (`input_ids`, `attention_mask`, `labels` = `input_ids`); `ValueError` when not one block fits.
    The token file is read batch by batch (`file_batches`), the blocks written as they are cut."""
    num_blocks = token_count(tokens) // seq_len
    if max_blocks is not None:
        num_blocks = min(num_blocks, max_blocks)
    if num_blocks < 1:
        raise ValueError(f"the text corpus is shorter than one block of seq_len={seq_len} tokens.")
    key = _digest([entry["filename"] for entry in tokens.cache_files], seq_len, num_blocks, "blocks")
    folder = cache_folder(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"blocks-{key}.arrow"
    if path.is_file():
        from datasets import Dataset

        return Dataset.from_file(str(path))
    rows = (
        {"input_ids": ids, "attention_mask": np.ones_like(ids, dtype=np.int8), "labels": ids.astype(np.int32)}
        for ids in _block_batches(tokens, seq_len, num_blocks)
    )
    return write_rows(path, row_features(tokenizer), rows)


class _Rows:
    """Rows `[a, b)` of a dataset asked for with `a` never decreasing: its files (and in-memory tables, such as the
    task examples after the text blocks) read forward once, a record batch at a time (`file_batches`: no
    memory-mapped page stays resident), else slices of its table (all in memory, or a view of files)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset, self.start, self.end = dataset, 0, 0
        self.reader: Iterator[Any] | bool | None = None  # False: no file reader, read the in-memory table
        self.held: list[Any] = []

    def take(self, a: int, b: int) -> Any:
        import pyarrow as pa

        b = min(b, len(self.dataset))
        if self.reader is None:  # opened at the first call: `map` hashes this object before it
            self.reader = file_batches(self.dataset, ["input_ids", "labels", "attention_mask"]) or False
        if self.reader is False:
            return self.dataset.data.slice(a, b - a)
        if a < self.start:
            raise RuntimeError(f"rows {a}..{b} asked for after row {self.start}: `_Rows` reads forward only.")
        assert not isinstance(self.reader, bool)  # opened above: an iterator of record batches
        while self.end < b:
            batch = next(self.reader)
            self.held.append(batch)
            self.end += batch.num_rows
        while self.held and self.start + self.held[0].num_rows <= a:  # batches wholly before `a` are freed
            self.start += self.held.pop(0).num_rows
        return pa.Table.from_batches(self.held).slice(a - self.start, b - a)


def _real_tokens(
    table: Any, boundary: tuple[int | None, int | None]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(ids, labels, starts, per_row)` of the real tokens (attention mask 1) of an Arrow batch of rows, in order:
    `starts` marks a document's first token (a row's first real token, a later start marker, or the token after
    an end marker in the same row: `document_boundary`); `per_row` counts them."""
    ids = np.concatenate([c.flatten().to_numpy() for c in table.column("input_ids").chunks])
    labels = np.concatenate([c.flatten().to_numpy() for c in table.column("labels").chunks])
    mask = np.concatenate([c.flatten().to_numpy() for c in table.column("attention_mask").chunks]).astype(bool)
    import pyarrow.compute as pc

    lengths = pc.list_value_length(table.column("input_ids")).to_numpy()
    row = np.repeat(np.arange(len(lengths)), lengths)[mask]
    ids, labels = ids[mask].astype(np.int64), labels[mask].astype(np.int64)
    first = np.ones(len(row), dtype=bool)
    first[1:] = row[1:] != row[:-1]
    per_row = np.bincount(row, minlength=len(lengths))
    start_id, end_id = boundary
    if start_id is not None:
        marks = ids == start_id
    else:
        marks = np.zeros(len(ids), dtype=bool)
        marks[1:] = (ids[:-1] == end_id) & ~first[1:]
    return ids, labels, first | marks, per_row


class _Packed:
    """The batched map function of `pack_rows`: packed rows `row` filled from the real tokens of the input rows."""

    def __init__(
        self,
        train: Any,
        seq_len: int,
        boundary: tuple[int | None, int | None],
        pad_id: int,
        row_tokens: np.ndarray,
        real: np.ndarray,
    ):
        self.rows, self.seq_len, self.boundary, self.pad_id = _Rows(train), seq_len, boundary, pad_id
        self.row_tokens, self.real = row_tokens, real  # token offsets of the packed rows, of the input rows

    def __call__(self, batch: dict[str, list]) -> dict[str, np.ndarray]:
        first, count = batch["row"][0], len(batch["row"])
        begin, end = int(self.row_tokens[first]), int(self.row_tokens[first + count])
        a = int(np.searchsorted(self.real, begin, side="right")) - 1  # input rows holding tokens [begin, end)
        b = int(np.searchsorted(self.real, end, side="left"))
        ids, labels, starts, _ = _real_tokens(self.rows.take(a, b), self.boundary)
        cut = slice(begin - int(self.real[a]), end - int(self.real[a]))
        ids, labels, starts = ids[cut], labels[cut], starts[cut]
        index = np.arange(len(ids))
        positions = index - np.maximum.accumulate(np.where(starts, index, 0))  # restart at every document
        labels[starts] = IGNORE_INDEX  # nothing predicts across a boundary
        lengths = np.diff(self.row_tokens[first : first + count + 1])
        column = np.arange(self.seq_len)
        used = column[None, :] < lengths[:, None]  # row-major: the tokens fill each row's head in order
        out_ids = np.full((count, self.seq_len), self.pad_id, dtype=np.int64)
        out_labels = np.full((count, self.seq_len), IGNORE_INDEX, dtype=np.int64)
        out_positions = column[None, :] - lengths[:, None]  # the tail: one more document of padding
        out_ids[used], out_labels[used], out_positions[used] = ids, labels, positions
        return {
            "input_ids": out_ids,
            "attention_mask": np.ones((count, self.seq_len), dtype=np.int8),
            "labels": out_labels,
            "position_ids": out_positions,
        }


def next_fit(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """Index of the first document of each packed row: documents in order, a new row whenever the next one does
    not fit (one pass over document lengths, never over tokens)."""
    starts, used = [0] if len(lengths) else [], 0
    for index, length in enumerate(lengths.tolist()):
        if used + length > seq_len:
            starts.append(index)
            used = 0
        used += length
    return np.asarray(starts, dtype=np.int64)


def pack_rows(train: Any, seq_len: int, tokenizer: Any, cache_dir: str | None = None, key: str | None = None) -> Any:
    """Training rows repacked (`data.packing`): each row's documents (real tokens split where a document begins:
    `document_boundary`) placed whole,
    in order, into rows of `seq_len` tokens with `position_ids` restarting at each. A document's first label is
    ignored (nothing predicts across a boundary); a row's unused tail is one more document of padding with ignored
    labels, so rows need no padding mask. `key` (a fingerprint of `train`) caches the packed rows on disk."""
    from datasets import Dataset

    from .tokenizer import pad_id as padding_id

    boundary, pad_id = document_boundary(tokenizer), padding_id(tokenizer)
    documents, per_row, rows = [], [], _Rows(train)
    for start in range(0, len(train), ROW_BATCH * 8):  # pass 1: document lengths, batch by batch
        _, _, starts, counts = _real_tokens(rows.take(start, start + ROW_BATCH * 8), boundary)
        documents.append(np.diff(np.append(np.flatnonzero(starts), len(starts))))
        per_row.append(counts)
    lengths = np.concatenate(documents) if documents else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    real = np.concatenate([[0], np.cumsum(np.concatenate(per_row) if per_row else [])]).astype(np.int64)
    row_tokens = np.append(offsets[next_fit(lengths, seq_len)], offsets[-1]).astype(np.int64)
    extra: dict[str, Any] = {}
    if key is not None:
        folder = cache_folder(cache_dir)
        folder.mkdir(parents=True, exist_ok=True)
        key = _digest(key, seq_len, boundary, pad_id, "packed")
        extra = {"cache_file_name": str(folder / f"packed-{key}.arrow"), "new_fingerprint": key}
    return Dataset.from_dict({"row": np.arange(len(row_tokens) - 1)}).map(
        _Packed(train, seq_len, boundary, pad_id, row_tokens, real),
        batched=True,
        batch_size=ROW_BATCH,
        remove_columns=["row"],
        features=row_features(tokenizer, position_ids=True),
        desc="Packing rows",
        **extra,
    )


# ---- streaming ---------------------------------------------------------------------------------------------


def is_heldout(text: str, fraction: float, seed: int) -> bool:
    """The streaming split: a document is held out when the first 8 bytes of blake2b(f"{seed}\\0{text}"), read
    big-endian, are below `fraction * 2**64` (deterministic, without counting documents; equal texts side alike)."""
    digest = hashlib.blake2b(f"{seed}\0{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


class _KeepSplit:
    """Filter of the document stream: the training side (`heldout=False`) or the held-out side of `is_heldout`."""

    def __init__(self, fraction: float, seed: int, heldout: bool) -> None:
        self.fraction, self.seed, self.heldout = fraction, seed, heldout

    def __call__(self, text: str) -> bool:
        return is_heldout(text, self.fraction, self.seed) == self.heldout


def _has_text(text: Any) -> bool:
    return isinstance(text, str) and bool(text.strip())


def stream_documents(source: Any, column: str, max_documents: int | None = None) -> Any:
    """The non-blank documents of an `IterableDataset` (only `column`), at most `max_documents`."""
    stream = source.select_columns([column]).filter(_has_text, input_columns=[column])
    return stream.take(max_documents) if max_documents else stream


class TextStream(torch.utils.data.IterableDataset):
    """The training blocks of a streamed corpus for one process, endless (epoch after epoch): blocks of `seq_len`
    cut from one continuous token stream of this process's documents (BOS, ids, EOS each), drawn through a shuffle
    buffer of `buffer_size` blocks (numpy PCG64 seeded with `seed`)."""

    def __init__(
        self, documents: Any, tokenizer: Any, column: str, seq_len: int, buffer_size: int, seed: int, rank: int = 0
    ) -> None:
        super().__init__()
        self.documents, self.tokenize = documents, _Tokenize(tokenizer, column)
        self.seq_len, self.buffer_size, self.rank = seq_len, buffer_size, rank
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.epoch, self.pending = 0, np.zeros(0, dtype=np.int64)
        self.buffer: list[np.ndarray] = []
        self.epoch_blocks = 0  # blocks cut in the current epoch (an epoch without one cannot go on)

    def _blocks(self) -> Iterator[np.ndarray]:
        """Blocks in stream order, across epochs; `self` holds the position after each yielded one."""
        while True:
            self.documents.set_epoch(self.epoch)
            for example in self.documents:  # tokenized here, one at a time: the source's position stays exact
                ids = self.tokenize({self.tokenize.column: [example[self.tokenize.column]]})["input_ids"][0]
                self.pending = np.concatenate([self.pending, np.asarray(ids, dtype=np.int64)])
                while len(self.pending) >= self.seq_len:  # `pending` keeps every token not yet yielded (a view)
                    block, self.pending = self.pending[: self.seq_len], self.pending[self.seq_len :]
                    self.epoch_blocks += 1
                    yield block
            if not self.epoch_blocks:
                raise ValueError(f"the streamed corpus is shorter than one block of seq_len={self.seq_len} tokens.")
            self.epoch, self.epoch_blocks = self.epoch + 1, 0

    def __iter__(self) -> Iterator[dict[str, list[int]]]:
        for block in self._blocks():
            if len(self.buffer) < self.buffer_size:
                self.buffer.append(block)
                continue
            index = int(self.rng.integers(len(self.buffer)))
            drawn, self.buffer[index] = self.buffer[index], block
            ids = drawn.tolist()
            yield {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": ids}

    def state_dict(self) -> dict[str, Any]:
        """The position after the last block drawn: source, pending tokens, buffer, generator, epoch."""
        return {
            "epoch": self.epoch,
            "epoch_blocks": self.epoch_blocks,
            "source": self.documents.state_dict(),
            "pending": self.pending.tolist(),
            "buffer": [block.tolist() for block in self.buffer],
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.epoch_blocks = state["epoch"], state["epoch_blocks"]
        self.documents.set_epoch(self.epoch)
        self.documents.load_state_dict(state["source"])
        self.pending = np.asarray(state["pending"], dtype=np.int64)
        self.buffer = [np.asarray(block, dtype=np.int64) for block in state["buffer"]]
        self.rng.bit_generator.state = state["rng"]

    def save(self, checkpoint: str | os.PathLike) -> None:
        """Write this process's position into a checkpoint folder (before its manifest is written)."""
        from .run_folder import atomic_write_json

        atomic_write_json(Path(checkpoint, STREAM_STATE.format(rank=self.rank)), self.state_dict())

    def restore(self, checkpoint: str | os.PathLike) -> None:
        """Continue from the position a checkpoint saved for this process; `ValueError` when it holds none."""
        path = Path(checkpoint, STREAM_STATE.format(rank=self.rank))
        if not path.is_file():
            raise ValueError(
                f"{checkpoint} holds no {path.name}: it was not saved by a streaming run with this number of "
                "processes; resume it as it was launched, or train into a new --output_dir."
            )
        self.load_state_dict(json.loads(path.read_text()))


def split_side(
    source: Any, column: str, heldout_fraction: float, split_seed: int, heldout: bool, max_documents: int | None = None
) -> Any:
    """The non-blank documents of a stream (the first `max_documents`) on one side of `is_heldout`."""
    documents = stream_documents(source, column, max_documents)
    return documents.filter(_KeepSplit(heldout_fraction, split_seed, heldout), input_columns=[column])


def stream_blocks(
    train: Any, tokenizer: Any, column: str, seq_len: int, buffer_size: int, seed: int, rank: int, world_size: int
) -> TextStream:
    """The `TextStream` of process `rank` of `world_size` over its shard (`split_dataset_by_node`) of the training
    documents `train` (`split_side(..., heldout=False)`)."""
    from datasets.distributed import split_dataset_by_node

    # one data file (or a count of files that is no multiple of world_size): the process keeps every
    # world_size-th training document; else whole files are assigned to it (datasets' "auto" strategy)
    mine = split_dataset_by_node(train, rank, world_size)
    return TextStream(mine, tokenizer, column, seq_len, buffer_size, seed, rank)


def heldout_stream_blocks(held: Any, tokenizer: Any, column: str, seq_len: int, max_blocks: int) -> Any:
    """The first `max_blocks` blocks of the held-out documents `held` (`split_side(..., heldout=True)`; every
    process reads the same ones), as an in-memory `Dataset`; `ValueError` when not one block fits."""
    from datasets import Dataset

    tokens = held.map(_Tokenize(tokenizer, column), batched=True, batch_size=TOKENIZE_BATCH, remove_columns=[column])
    pending = np.zeros(0, dtype=np.int64)
    blocks: list[np.ndarray] = []
    for example in tokens:
        pending = np.concatenate([pending, np.asarray(example["input_ids"], dtype=np.int64)])
        full = min(len(pending) // seq_len, max_blocks - len(blocks))
        blocks.extend(pending[: full * seq_len].reshape(full, seq_len))
        pending = pending[full * seq_len :]
        if len(blocks) >= max_blocks:
            break
    if not blocks:
        raise ValueError(f"the held-out text is shorter than one block of seq_len={seq_len} tokens.")
    ids = np.stack(blocks)
    return Dataset.from_dict(
        {"input_ids": ids, "attention_mask": np.ones_like(ids, dtype=np.int8), "labels": ids.astype(np.int32)},
        features=row_features(tokenizer),
    )
