"""The `data:` section: text corpus and synthetic tasks, checked up front and built into datasets.

All task knowledge of the training jobs lives in `TASK_SPECS`: which `DataArguments` fields feed each
task generator of `zpx_hf_train.data_tasks`, how many tokens an example needs, and which key to change when
it does not fit. Local text files are checked before any model is built (empty, not UTF-8, a CSV with a
header only, a folder mixing file types), so a bad corpus fails with one line naming the file and the fix.
"""

from __future__ import annotations

import codecs
import csv
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import ConfigError, check_regular_file

COLUMNS = ["input_ids", "attention_mask", "labels"]


@dataclass
class DataArguments:
    """The `data:` section: embedded text corpus or a local/cached dataset, plus synthetic tasks."""

    text_source: str = field(
        default="pydoc",
        metadata={
            "help": "'pydoc' (CPython's embedded docs), 'none' (tasks only), a local .txt/.md/.json/.jsonl/.csv/"
            ".parquet file, a local folder (save_to_disk output or data files), or a dataset id that `datasets` "
            "can load (offline: from the cache)."
        },
    )
    text_column: str = field(default="text", metadata={"help": "Text column of json/csv/parquet/Hub data."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Config name of a Hub dataset."})
    dataset_split: str = field(default="train", metadata={"help": "Split of a Hub dataset to read."})
    max_documents: int | None = field(default=None, metadata={"help": "Read at most this many documents."})
    tokenizer: dict[str, Any] | str | None = field(
        default="bytes",
        metadata={
            "help": "'bytes' (the 260-token byte tokenizer), a local tokenizer folder or a Hub id in the local cache "
            "(AutoTokenizer, offline), or a model trained on the training split: {train: bpe|unigram, vocab_size: N"
            "[, min_frequency: M]} (a JSON mapping on the command line). The model's vocab_size follows it."
        },
    )
    seq_len: int = field(default=128, metadata={"help": "Tokens per training example."})
    heldout_fraction: float = field(default=0.1, metadata={"help": "Fraction of documents held out for perplexity."})
    split_seed: int = field(default=0, metadata={"help": "Seed of the train/held-out document split."})
    max_train_blocks: int | None = field(default=None, metadata={"help": "Cap on training text blocks."})
    max_eval_blocks: int | None = field(default=256, metadata={"help": "Cap on held-out text blocks."})
    tasks: list[str] = field(
        default_factory=lambda: ["mqar", "passkey", "selective_copy"],
        metadata={"help": "Synthetic tasks mixed into training and evaluated: mqar, passkey, selective_copy."},
    )
    train_examples_per_task: int = field(default=2000, metadata={"help": "Training examples per task."})
    task_train_examples: list[int] | None = field(
        default=None,
        metadata={
            "help": "Training examples of each task, in the order of `tasks` (default: train_examples_per_task "
            "each): the recall/text mix, e.g. many short MQAR examples and few long pass-key ones."
        },
    )
    eval_examples_per_task: int = field(default=200, metadata={"help": "Held-out examples per task."})
    task_seed: int = field(default=0, metadata={"help": "Seed of the training tasks (evaluation uses task_seed+1)."})
    mqar_num_pairs: int = field(default=8, metadata={"help": "Key-value pairs per MQAR example (<= 26)."})
    mqar_num_queries: int | None = field(default=None, metadata={"help": "Queries per MQAR example (default all)."})
    mqar_query_replacement: bool = field(
        default=False,
        metadata={
            "help": "Draw MQAR queries with replacement: no 'answer a value not yet asked' shortcut, and "
            "mqar_num_queries may exceed mqar_num_pairs."
        },
    )
    passkey_length: int | None = field(default=None, metadata={"help": "Pass-key example length (default seq_len)."})
    passkey_digits: int = field(default=5, metadata={"help": "Digits of the pass key."})
    selective_copy_num_tokens: int = field(default=8, metadata={"help": "Tokens to copy."})
    selective_copy_num_positions: int = field(default=32, metadata={"help": "Noise slots holding the tokens."})
    packing: bool = field(
        default=False,
        metadata={
            "help": "Pack training rows: whole documents and task examples share rows of seq_len tokens with "
            "position_ids restarting at each one, so no token attends to another document (no padding)."
        },
    )
    num_proc: int | None = field(
        default=None, metadata={"help": "Processes tokenizing the corpus (`datasets.map` num_proc; null: one)."}
    )
    cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder of the tokenized corpus's Arrow files, reused by runs with the same corpus and "
            "tokenizer (default: $HF_DATASETS_CACHE/zpx_hf_train)."
        },
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Stream the corpus (for corpora larger than memory or disk): each process reads its own shard, "
            "blocks go through a shuffle buffer, a resumed run continues the stream; needs training.max_steps."
        },
    )
    shuffle_buffer: int = field(
        default=1000, metadata={"help": "Blocks in the shuffle buffer of a streamed corpus (data.streaming)."}
    )


@dataclass(frozen=True)
class TaskSpec:
    """How one synthetic task reads `DataArguments`: generator parameters, tokens needed, the key to change."""

    params: Callable[[DataArguments], dict[str, Any]]
    length: Callable[[DataArguments], int]
    length_key: str
    keys: dict[str, str]  # generator parameter -> the `data:` key that sets it (named in error messages)


TASK_SPECS: dict[str, TaskSpec] = {
    "mqar": TaskSpec(
        params=lambda d: {
            "num_pairs": d.mqar_num_pairs,
            "num_queries": d.mqar_num_queries,
            "query_replacement": d.mqar_query_replacement,
        },
        length=lambda d: 2 + 2 * d.mqar_num_pairs + 2 * (d.mqar_num_queries or d.mqar_num_pairs),  # BOS, |, pairs
        length_key="mqar_num_pairs",
        keys={"num_queries": "mqar_num_queries", "num_pairs": "mqar_num_pairs"},  # the first named in an error wins
    ),
    "passkey": TaskSpec(
        params=lambda d: {"length": d.passkey_length or d.seq_len, "num_digits": d.passkey_digits},
        length=lambda d: d.passkey_length or d.seq_len,
        length_key="passkey_length",
        keys={"length": "passkey_length", "seq_len": "passkey_length", "num_digits": "passkey_digits"},
    ),
    "selective_copy": TaskSpec(
        params=lambda d: {"num_tokens": d.selective_copy_num_tokens, "num_positions": d.selective_copy_num_positions},
        length=lambda d: 2 + d.selective_copy_num_positions + d.selective_copy_num_tokens,  # BOS, slots, |, copy
        length_key="selective_copy_num_positions",
        keys={"num_tokens": "selective_copy_num_tokens", "num_positions": "selective_copy_num_positions"},
    ),
}

MINIMUMS = {
    "seq_len": 16,
    "train_examples_per_task": 0,
    "eval_examples_per_task": 1,
    "passkey_digits": 1,
    "mqar_num_pairs": 1,
    "selective_copy_num_tokens": 1,
    "selective_copy_num_positions": 1,
    "max_documents": 1,  # these three may be null (no cap); 0 would silently mean "no cap" or one block
    "max_train_blocks": 1,
    "max_eval_blocks": 1,
    "num_proc": 1,
    "shuffle_buffer": 1,
}


def validate_data_args(path: str, data: DataArguments) -> None:
    """Range, feasibility and local-file checks of the `data:` section (before any data is built)."""
    from zpx_hf_train.data_tasks import TASKS, is_local_source, task_examples
    from zpx_hf_train.tokenizer import parse_tokenizer_spec

    if set(TASK_SPECS) != set(TASKS):
        raise RuntimeError(
            f"zpx_hf_train.data.TASK_SPECS {sorted(TASK_SPECS)} != zpx_hf_train.data_tasks.TASKS {sorted(TASKS)}"
        )
    if data.text_source not in ("pydoc", "none") and is_local_source(data.text_source):
        check_local_source(path, data.text_source, data.text_column)
    for task in data.tasks:
        if task not in TASK_SPECS:
            raise ConfigError(f"{path}: key `data.tasks`: unknown task {task!r}; expected some of {sorted(TASKS)}.")
    if parse_tokenizer_spec(path, data.tokenizer).kind == "train" and data.text_source == "none":
        raise ConfigError(
            f"{path}: key `data.tokenizer` trains on the text corpus but `data.text_source` is 'none'; give a corpus "
            "or a tokenizer folder."
        )
    if data.text_source == "none" and not data.tasks:
        raise ConfigError(f"{path}: key `data.tasks` is empty and `data.text_source` is 'none': nothing to train on.")
    if data.text_source == "none" and not any(train_example_counts(data).values()):
        raise ConfigError(
            f"{path}: key `data.train_examples_per_task` is 0 and `data.text_source` is 'none': nothing to train on."
        )
    counts = data.task_train_examples
    if counts is not None and (len(counts) != len(data.tasks) or min(counts, default=0) < 0):
        raise ConfigError(
            f"{path}: key `data.task_train_examples` = {counts} must give one count >= 0 "
            f"per task of `data.tasks` {data.tasks}, in that order (or be null: train_examples_per_task each)."
        )
    for key, minimum in MINIMUMS.items():
        value = getattr(data, key)
        if value is not None and value < minimum:
            raise ConfigError(f"{path}: key `data.{key}` = {value} must be >= {minimum}.")
    if data.streaming:
        check_streaming(path, data)
    if not 0 < data.heldout_fraction < 1:
        raise ConfigError(f"{path}: key `data.heldout_fraction` = {data.heldout_fraction} must be in (0, 1).")
    for task in data.tasks:
        spec = TASK_SPECS[task]
        if spec.length(data) > data.seq_len:
            raise ConfigError(
                f"{path}: key `data.{spec.length_key}`: task {task} needs {spec.length(data)} tokens but "
                f"`data.seq_len` is {data.seq_len}."
            )
        try:  # the generator's own checks (key alphabet, digits, ...), on one example
            task_examples(task, 1, data.task_seed, data.seq_len, **spec.params(data))
        except ValueError as error:
            named = [key for param, key in spec.keys.items() if f"{param}=" in str(error)]
            raise ConfigError(f"{path}: key `data.{(named or [spec.length_key])[0]}`: {error}") from None


def check_streaming(path: str, data: DataArguments) -> None:
    """What `data.streaming` cannot do, refused by key: packing, task examples in training, an uncapped held-out,
    a tokenizer trained on the corpus."""
    if data.packing:
        raise ConfigError(f"{path}: key `data.packing` cannot pack a streamed corpus; set it false or streaming false.")
    if data.text_source == "none":
        raise ConfigError(f"{path}: key `data.streaming` needs a text corpus, and `data.text_source` is 'none'.")
    if any(train_example_counts(data).values()):
        raise ConfigError(
            f"{path}: key `data.train_examples_per_task`: a streamed corpus trains on text only; set it (or "
            "`data.task_train_examples`) to 0, the tasks are still evaluated."
        )
    if data.max_eval_blocks is None:
        raise ConfigError(
            f"{path}: key `data.max_eval_blocks` must be set with `data.streaming` (a stream has no end)."
        )
    from zpx_hf_train.tokenizer import parse_tokenizer_spec

    if parse_tokenizer_spec(path, data.tokenizer).kind == "train":  # a mapping, or its JSON from the command line
        raise ConfigError(
            f"{path}: key `data.tokenizer` trains a tokenizer on the corpus, which a stream cannot give whole; train "
            "it in a non-streaming run (or with the `tokenizers` library) and give its folder."
        )


def check_streaming_training(path: str, data: DataArguments, training_args: Any) -> None:
    """`data.streaming` needs `training.max_steps` (a stream has no length) and no DataLoader workers (the stream's
    position, saved with each checkpoint, lives in the training process)."""
    if not data.streaming:
        return
    if training_args.max_steps is None or training_args.max_steps <= 0:
        raise ConfigError(
            f"{path}: key `training.max_steps` must be > 0 with `data.streaming` (a stream has no length)."
        )
    if training_args.dataloader_num_workers:
        raise ConfigError(
            f"{path}: key `training.dataloader_num_workers` must be 0 with `data.streaming` (the stream's position, "
            "saved with each checkpoint, is kept in the training process)."
        )


def train_example_counts(data: DataArguments) -> dict[str, int]:
    """Training examples of each task: `task_train_examples` in the order of `tasks`, else the common count."""
    counts = data.task_train_examples or [data.train_examples_per_task] * len(data.tasks)
    return dict(zip(data.tasks, counts))


def _data_files(folder: Path) -> list[Path]:
    """Every entry but folders and hidden names: a FIFO or device among them is refused, never skipped."""
    entries = (p for p in folder.rglob("*") if not p.is_dir())
    return sorted(p for p in entries if not any(part.startswith(".") for part in p.relative_to(folder).parts))


def check_local_source(path: str, source: str, text_column: str) -> None:
    """A local corpus file or folder exists, is readable text and has rows; `ConfigError` naming the file if not."""
    from zpx_hf_train.data_tasks import TEXT_FILE_BUILDERS

    where = f"{path}: key `data.text_source`"
    target = Path(os.path.expanduser(source))
    if not target.exists():
        raise ConfigError(
            f"{where}: no such file {source!r}; give an existing local file, 'pydoc' (embedded corpus), "
            "'none' (tasks only) or a dataset id."
        )
    if target.is_dir():
        if (target / "dataset_info.json").exists() or (target / "dataset_dict.json").exists():
            return  # `save_to_disk` output: `datasets` checks its own format
        files = _data_files(target)
        kinds = {TEXT_FILE_BUILDERS.get(p.suffix.lower()) for p in files}
        if not files or None in kinds:
            unknown = sorted({p.suffix or p.name for p in files if p.suffix.lower() not in TEXT_FILE_BUILDERS})
            found = f"unsupported files {unknown}" if files else "no files"
            raise ConfigError(
                f"{where}: folder {source!r} holds {found}; keep only data files of one type "
                f"{sorted(TEXT_FILE_BUILDERS)}."
            )
        if len(kinds) > 1:
            suffixes = sorted({p.suffix.lower() for p in files})
            raise ConfigError(
                f"{where}: folder {source!r} mixes file types {suffixes}; keep one type per folder "
                "(`datasets` reads a folder with one builder)."
            )
        for file in files:
            _check_file(where, file, text_column)
        return
    if target.suffix.lower() not in TEXT_FILE_BUILDERS:
        raise ConfigError(
            f"{where}: cannot read {source!r}; expected a folder, one of {sorted(TEXT_FILE_BUILDERS)}, or 'pydoc'."
        )
    _check_file(where, target, text_column)


PROBE_BYTES = 1 << 20  # what the check of a text file reads (more only while it finds nothing but whitespace)
CSV_FIELD_LIMIT = 2**31 - 1  # Python's csv refuses a cell over 131,072 characters by default; datasets reads any


def _text_chunks(file: Path) -> Iterator[tuple[int, str]]:
    """`(offset, text)` of `file` read `PROBE_BYTES` at a time (a character cut at a chunk's end goes to the next);
    `ConfigError` at the first byte that is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    offset = 0
    with open(file, "rb") as f:
        while True:
            chunk = f.read(PROBE_BYTES)
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                pending = len(error.object) - len(chunk)  # bytes of a character the last chunk cut
                at = offset - pending + error.start
                raise ConfigError(
                    f"{file} is not valid UTF-8 (byte 0x{error.object[error.start]:02x} at offset {at}); "
                    "re-save it as UTF-8."
                ) from None
            yield offset, text
            if not chunk:
                return
            offset += len(chunk)


def _check_file(where: str, file: Path, text_column: str) -> None:
    """Empty, not UTF-8, a CSV without the column or rows: checked on the file's first `PROBE_BYTES` (and, for a
    CSV, its header and first row), never by reading a large corpus whole; the loader reports a bad byte later on."""
    suffix = file.suffix.lower()
    size = check_regular_file(file, where).st_size
    if suffix == ".parquet":
        if size == 0:
            raise ConfigError(f"{where}: {file} is empty; give a parquet file with a `{text_column}` column.")
        return
    try:
        if not any(text.strip() for _, text in _text_chunks(file)):  # stops at the first chunk with text
            raise ConfigError(f"{file} is empty; give a file with text in it.")
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    if suffix == ".csv":
        _check_csv(where, file, text_column)


def _check_csv(where: str, file: Path, text_column: str) -> None:
    """The header names `text_column` and some row after it has text; reads rows only until it finds one."""
    limit = csv.field_size_limit(CSV_FIELD_LIMIT)
    try:
        with open(file, encoding="utf-8-sig", newline="") as f:
            rows = csv.reader(f)
            header = next(rows, [])
            if text_column not in header:
                raise ConfigError(
                    f"{where}: {file} has no column {text_column!r} (header: {header[:20]}); set `data.text_column`."
                )
            if not any(any(cell.strip() for cell in row) for row in rows):
                raise ConfigError(f"{where}: {file} has a header but no rows; add rows of text.")
    except (csv.Error, UnicodeDecodeError) as error:
        raise ConfigError(f"{where}: {file} is not a readable CSV file ({error}); re-save it as UTF-8 CSV.") from None
    finally:
        csv.field_size_limit(limit)


def _reading(data: DataArguments, read: Callable[[], Any]) -> Any:
    """`read()`, with a source that `datasets` cannot read turned into one `ConfigError` line."""
    from datasets.exceptions import DatasetsError

    try:
        return read()
    except (ValueError, FileNotFoundError, RuntimeError, OSError, KeyError) as error:
        if isinstance(error, ValueError) and "shorter than one block" in str(error):
            raise
        shown = str(error).strip() if not isinstance(error, KeyError) else f"no column {error}; set `data.text_column`"
        first = shown.splitlines()[0] if shown else type(error).__name__
        raise ConfigError(f"key `data.text_source` = {data.text_source!r}: {first}") from error
    except DatasetsError as error:  # a builder that cannot parse the file (DatasetGenerationError), cause inside
        cause = error.__cause__ or error
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise ConfigError(
            f"key `data.text_source` = {data.text_source!r}: `datasets` cannot read it ({first}); "
            "give a UTF-8 text, json, csv or parquet file."
        ) from error


def load_text_documents(data: DataArguments) -> Sequence[str]:
    """The corpus documents (a `DocumentView` of a `datasets` source: read when used); a source that `datasets`
    cannot read becomes one `ConfigError` line."""
    from zpx_hf_train.data_tasks import open_documents

    documents = _reading(  # read lazily: `build_datasets` tokenizes only the documents its block caps need
        data,
        lambda: open_documents(
            data.text_source, data.text_column, data.dataset_config_name, data.dataset_split, data.max_documents
        ),
    )
    if not documents:
        raise ConfigError(
            f"key `data.text_source` = {data.text_source!r} holds no text documents; give non-empty text."
        )
    return documents


def source_name(source: str) -> str:
    """How a text source is named in cards and reports: never an absolute local path."""
    if source == "pydoc":
        return "CPython `pydoc_data.topics` (embedded)"
    from zpx_hf_train.data_tasks import is_local_source

    return f"local `{Path(source).name}`" if is_local_source(source) else f"`{source}`"


def build_datasets(data: DataArguments, tokenizer: Any = None) -> dict[str, Any]:
    """`train` (text blocks + task examples; a `TextStream` with `data.streaming`), `text_train` (its text blocks
    alone, or None), `heldout` (text blocks or None), `tasks` (eval sets by name), `eval` (what `Trainer`
    evaluates: held-out text, else the task sets), `description` (card lines), `packing` (the report line saying
    whether the training rows were packed), `tokenizer` (the given one, else `corpus_tokenizer(data)`) and
    `heldout_bytes` (UTF-8 bytes of the held-out blocks' scored tokens; None for the byte tokenizer). The corpus
    is tokenized through cached Arrow files (`zpx_hf_train.data_pipeline`)."""
    from datasets import concatenate_datasets

    from zpx_hf_train.data_pipeline import row_features
    from zpx_hf_train.data_tasks import task_dataset
    from zpx_hf_train.tokenizer import describe_tokenizer, is_byte_tokenizer

    if tokenizer is None:
        tokenizer = corpus_tokenizer(data)
    parts, heldout, heldout_bytes, descriptions, stream = [], None, None, [], None
    if data.text_source != "none":
        if data.streaming:
            stream, heldout, line = streamed_text(data, tokenizer)
        else:
            blocks, heldout, line = arrow_text(data, tokenizer)
            parts.append(blocks)
        descriptions.append(line)
    byte_level = is_byte_tokenizer(tokenizer)
    if heldout is not None and not byte_level:
        heldout_bytes = scored_bytes(heldout, tokenizer)
    task_tokenizer = None if byte_level else tokenizer  # None: the tasks' exact byte ids, without a tokenizer call
    tasks = {}
    for task, count in train_example_counts(data).items():
        params = TASK_SPECS[task].params(data)
        params_with = {**params, "tokenizer": task_tokenizer}
        try:
            if count:
                part = task_dataset(task, count, data.task_seed, data.seq_len, **params_with)
                parts.append(part.select_columns(COLUMNS).cast(row_features(tokenizer)))
            seed = data.task_seed + 1
            tasks[task] = task_dataset(task, data.eval_examples_per_task, seed, data.seq_len, **params_with)
        except ValueError as error:  # the same example is longer in this tokenizer's tokens
            raise ConfigError(f"key `data.{TASK_SPECS[task].length_key}` with `data.tokenizer`: {error}") from None
        shown = ", ".join(f"{k}={v}" for k, v in params.items() if v is not None)
        descriptions.append(
            f"synthetic `{task}` ({shown}): {count} train / {data.eval_examples_per_task} eval examples"
        )
    descriptions.append(f"tokenizer: {describe_tokenizer(data, tokenizer)}")
    packing = f"no: one block or example per row of {data.seq_len} tokens, padded (data.packing: false)"
    if stream is not None:
        train: Any = stream
        packing = f"no: streamed blocks of {data.seq_len} tokens (data.streaming: true)"
    else:
        train = concatenate_datasets(parts)
    if data.packing:
        from zpx_hf_train.data_pipeline import pack_rows as pack

        examples = len(train)
        key = json.dumps([[f["filename"] for f in train.cache_files], asdict(data)], sort_keys=True)
        train = pack(train, data.seq_len, tokenizer, data.cache_dir, key)
        descriptions.append(
            f"packed: {examples} training rows repacked into {len(train)} rows of {data.seq_len} tokens, position_ids "
            "restarting at every document and example (no attention across them)"
        )
        packing = f"yes: {examples} training rows packed into {len(train)} rows of {data.seq_len} tokens"
    if heldout is not None:
        eval_sets: Any = heldout
    else:
        eval_sets = {name: dataset.select_columns(COLUMNS) for name, dataset in tasks.items()} or None
    return {
        "train": train,
        "text_train": parts[0] if data.text_source != "none" and stream is None else None,
        "heldout": heldout,
        "tasks": tasks,
        "eval": eval_sets,
        "description": descriptions,
        "packing": packing,
        "tokenizer": tokenizer,
        "heldout_bytes": heldout_bytes,
    }


def corpus_tokenizer(data: DataArguments) -> Any:
    """The run's tokenizer (`tokenizer.training_tokenizer` of `data.tokenizer`): a trained one is trained on the
    training split's documents (`split_text`); under several processes it is process 0's, so every process calls
    this, outside `main_process_first` (the tokenizer is shared by a collective)."""
    from zpx_hf_train.tokenizer import parse_tokenizer_spec, training_tokenizer

    if parse_tokenizer_spec("config", data.tokenizer).kind != "train":
        return training_tokenizer(data, ())
    if data.text_source == "none" or data.streaming:  # refused when the config is read; a caller may skip that
        raise ConfigError(
            "key `data.tokenizer`: a tokenizer trained on the corpus needs a non-streamed `data.text_source`; train "
            "it in a non-streaming run and give its folder."
        )
    train_view, _ = split_text(data)
    return training_tokenizer(data, train_view)


def scored_bytes(blocks: Any, tokenizer: Any) -> int:
    """UTF-8 bytes of the tokens that held-out perplexity scores (every block's tokens after its first), decoded
    block by block without special tokens; a character cut at a block's edge counts as U+FFFD (3 bytes)."""
    total = 0
    for start in range(0, len(blocks), 256):
        ids = [row[1:] for row in blocks[start : start + 256]["input_ids"]]
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        total += sum(len(text.encode("utf-8")) for text in texts)
    return total


def split_text(data: DataArguments) -> tuple[Any, Any]:
    """`(train, held-out)` `DocumentView`s of the corpus (`split_documents`: the same split as a list; a corpus of
    one document is split by characters into a train part and a held-out part)."""
    from zpx_hf_train.data_tasks import DocumentView, split_documents

    documents = load_text_documents(data)
    single = len(documents) < 2
    if single or not isinstance(documents, DocumentView):  # or the embedded corpus: an in-memory dataset
        from datasets import Dataset

        texts = list(documents)
        if single:
            texts = [text for part in split_documents(texts, data.heldout_fraction, data.split_seed) for text in part]
        documents = DocumentView(Dataset.from_dict({"text": texts}), "text", range(len(texts)))
    if single:
        return documents.subset([0]), documents.subset([1])
    return split_documents(documents, data.heldout_fraction, data.split_seed)


def arrow_text(data: DataArguments, tokenizer: Any) -> tuple[Any, Any, str]:
    """`(train blocks, held-out blocks or None, card line)` of the corpus through cached Arrow files: documents
    split (`split_text`), tokenized (`tokenize_for_blocks`), cut into blocks."""
    from zpx_hf_train.data_pipeline import cache_folder, group_blocks, tokenize_for_blocks
    from zpx_hf_train.tokenizer import is_byte_tokenizer

    train_view, heldout_view = split_text(data)
    work = (tokenizer, data.seq_len)
    train_tokens, reused = tokenize_for_blocks(train_view, *work, data.max_train_blocks, data.num_proc, data.cache_dir)
    try:
        train = group_blocks(train_tokens, tokenizer, data.seq_len, data.max_train_blocks, data.cache_dir)
    except ValueError as error:
        raise ConfigError(f"key `data.text_source` = {data.text_source!r}: {error} Lower `data.seq_len`.") from error
    heldout_tokens, heldout_reused = tokenize_for_blocks(
        heldout_view, *work, data.max_eval_blocks, data.num_proc, data.cache_dir
    )
    try:
        heldout = group_blocks(heldout_tokens, tokenizer, data.seq_len, data.max_eval_blocks, data.cache_dir)
    except ValueError:
        heldout = None  # held-out text shorter than one block: perplexity is skipped
    folder = cache_folder(data.cache_dir)
    if reused and heldout_reused:
        print(f"data: reusing the tokenized corpus cached in {folder} (same documents and tokenizer)", flush=True)
    else:
        print(
            f"data: tokenized the corpus into {folder} (the next run with this corpus and tokenizer reuses it)",
            flush=True,
        )
    unit = "bytes" if is_byte_tokenizer(tokenizer) else "tokens"
    held = f"{len(heldout)} held-out blocks" if heldout is not None else "no held-out block"
    line = (
        f"text: {source_name(data.text_source)}, {len(train_view)} train / {len(heldout_view)} held-out "
        f"documents, {len(train)} train blocks / {held} of {data.seq_len} {unit}"
    )
    return train, heldout, line


def process_position() -> tuple[int, int]:
    """`(rank, world size)` of this process under accelerate / torch.distributed; `(0, 1)` alone."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def streamed_text(data: DataArguments, tokenizer: Any) -> tuple[Any, Any, str]:
    """`(TextStream, held-out blocks, card line)` of a streamed corpus: this process's shard of the training
    documents and the first `max_eval_blocks` held-out blocks (the split: `data_pipeline.is_heldout`)."""
    from zpx_hf_train.data_pipeline import heldout_stream_blocks, split_side, stream_blocks
    from zpx_hf_train.data_tasks import open_stream

    column = data.text_column if data.text_source != "pydoc" else "text"
    source = _reading(data, lambda: open_stream(data.text_source, column, data.dataset_config_name, data.dataset_split))
    rank, world_size = process_position()
    split = (column, data.heldout_fraction, data.split_seed)
    train = split_side(source, *split, heldout=False, max_documents=data.max_documents)
    stream = stream_blocks(
        train, tokenizer, column, data.seq_len, data.shuffle_buffer, data.split_seed, rank, world_size
    )
    held = split_side(source, *split, heldout=True, max_documents=data.max_documents)
    max_blocks = data.max_eval_blocks
    if max_blocks is None:  # (refused when the config is read)
        raise ConfigError("key `data.max_eval_blocks` must be set with `data.streaming` (a stream has no end).")
    try:
        heldout = _reading(data, lambda: heldout_stream_blocks(held, tokenizer, column, data.seq_len, max_blocks))
    except ValueError:
        heldout = None
    line = (
        f"text: {source_name(data.text_source)}, streamed (shuffle buffer of {data.shuffle_buffer} blocks, "
        f"process {rank} of {world_size} reading its shard), blocks of {data.seq_len} tokens; held out: documents "
        f"whose hash falls under {data.heldout_fraction} ({len(heldout) if heldout is not None else 0} blocks)"
    )
    return stream, heldout, line


def dataset_tags(data: DataArguments) -> list[str]:
    """Model-card `datasets` entries: the corpus (file name, never a path) and one per synthetic task."""
    tags = []
    if data.text_source == "pydoc":
        tags.append("cpython-pydoc-topics")
    elif data.text_source != "none":
        from zpx_hf_train.data_tasks import is_local_source

        tags.append(Path(data.text_source).name if is_local_source(data.text_source) else data.text_source)
    return tags + [f"synthetic-{task.replace('_', '-')}" for task in data.tasks]


__all__ = [
    "COLUMNS",
    "DataArguments",
    "TASK_SPECS",
    "TaskSpec",
    "build_datasets",
    "check_streaming_training",
    "check_local_source",
    "dataset_tags",
    "load_text_documents",
    "scored_bytes",
    "source_name",
    "train_example_counts",
    "validate_data_args",
]
