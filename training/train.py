#!/usr/bin/env python
"""Train, evaluate and save any zpx-hf family from a YAML config with the HF `Trainer`.

    python training/train.py configs/zpx-tiny.yaml [--max_steps 100 --output_dir runs/x ...]
    accelerate launch --config_file configs/accelerate/ddp_cpu.yaml training/train.py configs/zpx-tiny.yaml
    python training/train.py configs/zpx-tiny.yaml --push_to_hub --hub_model_id you/zpx-tiny

YAML layout: top-level `ModelArguments` fields (`model_type`, `attn_implementation`), `model:` (keyword
arguments of the family's config class), `data:` (`DataArguments`) and `training:`
(`transformers.TrainingArguments`). Command-line flags override any `data`/`training`/top-level field.
Unknown keys, wrong types and missing data paths raise `ConfigError` naming the key before any
model is built. The output folder is a self-contained remote-code checkpoint (safetensors, code,
byte tokenizer, filled model card) plus `metrics.json`, `report.md` and `loss_curve.png`.
"""

from __future__ import annotations

import difflib
import enum
import inspect
import os
import re
import sys
import time
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_CARD_DIR = REPO_ROOT / "model_cards"
TOKENIZER_VOCAB = 260


class ConfigError(ValueError):
    """A config file or command-line value is invalid; the message names the key and the fix."""


@dataclass
class ModelArguments:
    """Top-level YAML keys; the `model:` mapping holds the family config's keyword arguments."""

    model_type: str | None = field(
        default=None, metadata={"help": "AutoConfig model type of the family to train (zpx, pct, versor, ...)."}
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "Attention implementation passed to from_config (e.g. sdpa, eager)."}
    )


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
    seq_len: int = field(default=128, metadata={"help": "Tokens (bytes) per training example."})
    heldout_fraction: float = field(default=0.1, metadata={"help": "Fraction of documents held out for perplexity."})
    split_seed: int = field(default=0, metadata={"help": "Seed of the train/held-out document split."})
    max_train_blocks: int | None = field(default=None, metadata={"help": "Cap on training text blocks."})
    max_eval_blocks: int | None = field(default=256, metadata={"help": "Cap on held-out text blocks."})
    tasks: list[str] = field(
        default_factory=lambda: ["mqar", "passkey", "selective_copy"],
        metadata={"help": "Synthetic tasks mixed into training and evaluated: mqar, passkey, selective_copy."},
    )
    train_examples_per_task: int = field(default=2000, metadata={"help": "Training examples per task."})
    eval_examples_per_task: int = field(default=200, metadata={"help": "Held-out examples per task."})
    task_seed: int = field(default=0, metadata={"help": "Seed of the training tasks (evaluation uses task_seed+1)."})
    mqar_num_pairs: int = field(default=8, metadata={"help": "Key-value pairs per MQAR example (<= 26)."})
    mqar_num_queries: int | None = field(default=None, metadata={"help": "Queries per MQAR example (default all)."})
    passkey_length: int | None = field(default=None, metadata={"help": "Pass-key example length (default seq_len)."})
    passkey_digits: int = field(default=5, metadata={"help": "Digits of the pass key."})
    selective_copy_num_tokens: int = field(default=8, metadata={"help": "Tokens to copy."})
    selective_copy_num_positions: int = field(default=32, metadata={"help": "Noise slots holding the tokens."})

    def task_params(self, task: str) -> dict[str, Any]:
        if task == "mqar":
            return {"num_pairs": self.mqar_num_pairs, "num_queries": self.mqar_num_queries}
        if task == "passkey":
            return {"length": self.passkey_length or self.seq_len, "num_digits": self.passkey_digits}
        if task == "selective_copy":
            return {"num_tokens": self.selective_copy_num_tokens, "num_positions": self.selective_copy_num_positions}
        return {}


@dataclass
class RunConfig:
    """A parsed and validated config: the dataclass instances plus the built model config."""

    path: str
    args: dict[type, Any]
    mappings: dict[str, dict[str, Any]]
    model_config: Any = None

    def __getitem__(self, cls: type) -> Any:
        return self.args[cls]


# ---- YAML parsing and validation -------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads `3e-4` (no dot) as a float, as YAML 1.2 does."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if origin is Literal:
        return value in typing.get_args(tp)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return isinstance(value, (str, tp))
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        args = typing.get_args(tp)
        return isinstance(value, list) and (not args or all(_matches(v, args[0]) for v in value))
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    return True  # a type this checker does not know: left to the dataclass itself


def _unknown_key(path: str, where: str, key: str, valid: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=3)
    hint = f" Did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
    return ConfigError(f"{path}: unknown key `{where}{key}`.{hint} Valid keys: {', '.join(sorted(valid))}.")


def _check_section(path: str, prefix: str, values: dict[str, Any], cls: type) -> None:
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in fields(cls) if f.init]
    for key, value in values.items():
        if key not in valid:
            raise _unknown_key(path, prefix, key, valid)
        if not _matches(value, hints[key]):
            raise ConfigError(
                f"{path}: key `{prefix}{key}` = {value!r} has the wrong type: expected {_type_name(hints[key])}."
            )


def config_init_keys(config_class: type) -> set[str]:
    """Keyword arguments accepted by a config class and its `PretrainedConfig` bases."""
    from transformers import PretrainedConfig

    keys: set[str] = set()
    for cls in config_class.__mro__:
        if isinstance(cls, type) and issubclass(cls, PretrainedConfig) and "__init__" in cls.__dict__:
            for name, param in inspect.signature(cls.__init__).parameters.items():
                if name != "self" and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                    keys.add(name)
    return keys


def read_yaml(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist.")
    with open(path, encoding="utf-8") as f:
        try:
            raw = yaml.load(f, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(raw).__name__}.")
    return raw


def parse_config_file(
    path: str,
    cli_args: Sequence[str] = (),
    top: type = ModelArguments,
    sections: dict[str, type] | None = None,
    mappings: Sequence[str] = ("model",),
) -> RunConfig:
    """Read a YAML config into dataclasses through `HfArgumentParser`; `cli_args` override its values.

    `top`'s fields are top-level keys, each `sections[name]` is a mapping read into that dataclass,
    and each name in `mappings` is a free mapping returned as a dict (validated by the caller).
    """
    from transformers import HfArgumentParser, TrainingArguments

    sections = dict(sections or {"data": DataArguments, "training": TrainingArguments})
    raw = read_yaml(path)
    top_fields = {f.name for f in fields(top) if f.init}
    valid_top = sorted(top_fields | set(sections) | set(mappings))
    top_values: dict[str, Any] = {}
    for key in raw:
        if key not in valid_top:
            raise _unknown_key(path, "", key, valid_top)
        if key in top_fields:
            top_values[key] = raw[key]
    _check_section(path, "", top_values, top)
    flat = dict(top_values)
    for name, cls in sections.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: key `{name}` must be a mapping of {cls.__name__} fields, got {values!r}.")
        _check_section(path, f"{name}.", values, cls)
        flat.update(values)
    found_mappings: dict[str, dict[str, Any]] = {}
    for name in mappings:
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: key `{name}` must be a mapping, got {values!r}.")
        found_mappings[name] = values

    use_cpu_for_multi_process()
    parser = HfArgumentParser([top, *sections.values()])
    parser.set_defaults(**flat)
    try:
        parsed = parser.parse_args_into_dataclasses(args=list(cli_args))
    except ValueError as error:  # TrainingArguments.__post_init__ and unused command-line flags
        raise ConfigError(f"{path}: {error}") from error
    return RunConfig(path=path, args={type(obj): obj for obj in parsed}, mappings=found_mappings)


def use_cpu_for_multi_process() -> None:
    """Under a torchrun-style launcher (`LOCAL_RANK` set) on a machine without CUDA, select CPU DDP with gloo.

    `accelerate launch` runs several CPU processes only through its multi-GPU (torchrun) launcher (its
    MULTI_CPU mode needs MPI), and there accelerate would otherwise give each process a world of one.
    """
    import torch

    if os.environ.get("LOCAL_RANK") is not None and not torch.cuda.is_available():
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")


def validate_data_args(path: str, data: DataArguments) -> None:
    """Range and feasibility checks of the `data:` section (before any data is built)."""
    from zpx_hf.data_tasks import TASKS, is_local_source

    if data.text_source not in ("pydoc", "none") and is_local_source(data.text_source):
        if not os.path.exists(os.path.expanduser(data.text_source)):
            raise ConfigError(
                f"{path}: key `data.text_source`: no such file {data.text_source!r}; give an existing local file, "
                "'pydoc' (embedded corpus), 'none' (tasks only) or a dataset id."
            )
    for task in data.tasks:
        if task not in TASKS:
            raise ConfigError(f"{path}: key `data.tasks`: unknown task {task!r}; expected some of {sorted(TASKS)}.")
    if data.text_source == "none" and not data.tasks:
        raise ConfigError(f"{path}: key `data.tasks` is empty and `data.text_source` is 'none': nothing to train on.")
    minimums = {"seq_len": 16, "train_examples_per_task": 0, "eval_examples_per_task": 1, "passkey_digits": 1}
    minimums.update({"mqar_num_pairs": 1, "selective_copy_num_tokens": 1, "selective_copy_num_positions": 1})
    for key, minimum in minimums.items():
        if getattr(data, key) < minimum:
            raise ConfigError(f"{path}: key `data.{key}` = {getattr(data, key)} must be >= {minimum}.")
    if not 0 < data.heldout_fraction < 1:
        raise ConfigError(f"{path}: key `data.heldout_fraction` = {data.heldout_fraction} must be in (0, 1).")
    needs = {
        "mqar": ("mqar_num_pairs", 2 + 2 * data.mqar_num_pairs + 2 * (data.mqar_num_queries or data.mqar_num_pairs)),
        "passkey": ("passkey_length", data.passkey_length or data.seq_len),
        "selective_copy": (
            "selective_copy_num_positions",
            2 + data.selective_copy_num_positions + data.selective_copy_num_tokens,
        ),
    }
    for task in data.tasks:
        key, length = needs[task]
        if length > data.seq_len:
            raise ConfigError(
                f"{path}: key `data.{key}`: task {task} needs {length} tokens but `data.seq_len` is {data.seq_len}."
            )
    if "passkey" in data.tasks:
        from zpx_hf.data_tasks import passkey_examples

        try:
            passkey_examples(1, 0, seq_len=data.passkey_length or data.seq_len, num_digits=data.passkey_digits)
        except ValueError as error:
            raise ConfigError(f"{path}: key `data.passkey_length`: {error}") from error


def build_model_config(path: str, model_type: str | None, kwargs: dict[str, Any], seq_len: int | None = None) -> Any:
    """The family config from `model_type` + the `model:` mapping, with every error naming its key."""
    from transformers import CONFIG_MAPPING

    import zpx_hf

    if model_type is None:
        raise ConfigError(f"{path}: key `model_type` is missing; one of {sorted(zpx_hf.FAMILIES)}.")
    if model_type not in CONFIG_MAPPING:
        raise ConfigError(
            f"{path}: key `model_type` = {model_type!r} is not a registered model type; "
            f"zpx-hf families: {sorted(zpx_hf.FAMILIES)}."
        )
    config_class = CONFIG_MAPPING[model_type]
    valid = sorted(config_init_keys(config_class))
    for key in kwargs:
        if key not in valid:
            raise _unknown_key(path, "model.", key, valid)
    try:
        config = config_class(**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{path}: section `model`: {error}") from error
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab < TOKENIZER_VOCAB:
        raise ConfigError(
            f"{path}: key `model.vocab_size` = {vocab} is smaller than the byte tokenizer's {TOKENIZER_VOCAB} tokens."
        )
    max_positions = getattr(config, "max_position_embeddings", None)
    if seq_len and isinstance(max_positions, int) and seq_len > max_positions:
        if not getattr(config, "allow_longer_positions", False):
            raise ConfigError(
                f"{path}: key `data.seq_len` = {seq_len} exceeds `model.max_position_embeddings` = {max_positions}."
            )
    return config


def load_run_config(path: str, cli_args: Sequence[str] = ()) -> RunConfig:
    """Parse and fully validate a training config; raises `ConfigError` before anything is built."""
    run = parse_config_file(path, cli_args)
    data = run[DataArguments]
    validate_data_args(path, data)
    run.model_config = build_model_config(path, run[ModelArguments].model_type, run.mappings["model"], data.seq_len)
    return run


# ---- data ------------------------------------------------------------------------------------


def build_datasets(data: DataArguments) -> dict[str, Any]:
    """`train` (text blocks + task examples), `heldout` (text blocks or None), `tasks` (eval sets by name)."""
    from datasets import concatenate_datasets

    from zpx_hf.data_tasks import load_documents, split_documents, task_dataset, text_dataset

    columns = ["input_ids", "attention_mask", "labels"]
    parts, heldout, descriptions = [], None, []
    if data.text_source != "none":
        documents = load_documents(
            data.text_source, data.text_column, data.dataset_config_name, data.dataset_split, data.max_documents
        )
        train_docs, heldout_docs = split_documents(documents, data.heldout_fraction, data.split_seed)
        parts.append(text_dataset(train_docs, data.seq_len, data.max_train_blocks))
        try:
            heldout = text_dataset(heldout_docs, data.seq_len, data.max_eval_blocks)
        except ValueError:
            heldout = None  # held-out text shorter than one block: perplexity is skipped
        source = "CPython `pydoc_data.topics` (embedded)" if data.text_source == "pydoc" else f"`{data.text_source}`"
        descriptions.append(
            f"text: {source}, {len(train_docs)} train / {len(heldout_docs)} held-out documents, "
            f"{len(parts[0])} train blocks of {data.seq_len} bytes"
        )
    tasks = {}
    for task in data.tasks:
        params = data.task_params(task)
        if data.train_examples_per_task:
            parts.append(task_dataset(task, data.train_examples_per_task, data.task_seed, data.seq_len, **params))
        tasks[task] = task_dataset(task, data.eval_examples_per_task, data.task_seed + 1, data.seq_len, **params)
        shown = ", ".join(f"{k}={v}" for k, v in params.items() if v is not None)
        descriptions.append(
            f"synthetic `{task}` ({shown}): {data.train_examples_per_task} train / "
            f"{data.eval_examples_per_task} eval examples"
        )
    if not parts:
        raise ConfigError("`data`: no training examples (text_source 'none' and train_examples_per_task 0).")
    train = concatenate_datasets([part.select_columns(columns) for part in parts])
    return {"train": train, "heldout": heldout, "tasks": tasks, "description": descriptions}


def dataset_tags(data: DataArguments) -> list[str]:
    tags = []
    if data.text_source == "pydoc":
        tags.append("cpython-pydoc-topics")
    elif data.text_source != "none":
        tags.append(os.path.basename(data.text_source) if os.path.exists(data.text_source) else data.text_source)
    return tags + [f"synthetic-{task.replace('_', '-')}" for task in data.tasks]


# ---- model card ------------------------------------------------------------------------------


def model_card_template(model_type: str) -> str | None:
    """`model_cards/<model_type>.md`, or None (the generic card) for a type without a template."""
    path = MODEL_CARD_DIR / f"{model_type}.md"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _trainer_class() -> type:
    from transformers import Trainer

    class CardTrainer(Trainer):
        """`Trainer` whose `create_model_card` (used by `push_to_hub`) writes the family's filled card."""

        card_text: str | None = None

        def create_model_card(self, *args: Any, **kwargs: Any) -> None:
            if self.card_text is None:
                return super().create_model_card(*args, **kwargs)
            if self.is_world_process_zero():
                with open(os.path.join(self.args.output_dir, "README.md"), "w", encoding="utf-8") as f:
                    f.write(self.card_text)

    return CardTrainer


def build_trainer(
    model: Any, tokenizer: Any, training_args: Any, train_dataset: Any, eval_dataset: Any, callbacks: Sequence = ()
) -> Any:
    from transformers import default_data_collator

    return _trainer_class()(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        callbacks=list(callbacks),
    )


def _inside(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root)


def resolve_resume(training_args: Any) -> str | None:
    """`resume_from_checkpoint`: a path, or `last`/`true` for the newest checkpoint in `output_dir`."""
    from transformers.trainer_utils import get_last_checkpoint

    value = training_args.resume_from_checkpoint
    if value is None or value.lower() in ("false", "none", ""):
        return None
    if value.lower() in ("last", "true"):
        last = get_last_checkpoint(training_args.output_dir) if os.path.isdir(training_args.output_dir) else None
        if last is None:
            raise ConfigError(
                f"key `training.resume_from_checkpoint` = {value!r}: no checkpoint in {training_args.output_dir}."
            )
        return last
    if not os.path.isdir(value):
        raise ConfigError(f"key `training.resume_from_checkpoint`: no such checkpoint folder {value!r}.")
    return value


def run_training(run: RunConfig, callbacks: Sequence = ()) -> dict[str, Any]:
    """Train, save (model + code + tokenizer), evaluate, write report and card; push when asked.

    Returns `{"output_dir", "metrics", "train_metrics", "trainer", "datasets"}`.
    """
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments, set_seed

    from zpx_hf.evaluation import evaluate_model, render_model_card, write_report
    from zpx_hf.tokenization_bytes import build_byte_tokenizer

    model_args, data, training_args = run[ModelArguments], run[DataArguments], run[TrainingArguments]
    resume = resolve_resume(training_args)
    started = time.time()
    datasets = build_datasets(data)
    tokenizer = build_byte_tokenizer(model_max_length=data.seq_len)
    set_seed(training_args.seed)
    kwargs = {"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}
    model = AutoModelForCausalLM.from_config(run.model_config, **kwargs)
    trainer = build_trainer(model, tokenizer, training_args, datasets["train"], datasets["heldout"], callbacks)
    train_output = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()
    train_metrics = dict(train_output.metrics)

    metrics: dict[str, Any] = {}
    if trainer.is_world_process_zero():
        eval_started = time.time()
        metrics = evaluate_model(
            trainer.model, datasets["heldout"], datasets["tasks"], training_args.per_device_eval_batch_size
        )
        num_params = sum(p.numel() for p in trainer.model.parameters())
        details = {
            "model_type": run.model_config.model_type,
            "parameters": num_params,
            "steps": trainer.state.global_step,
            "world_size": training_args.world_size,
            "effective_batch": training_args.per_device_train_batch_size
            * training_args.world_size
            * training_args.gradient_accumulation_steps,
            "seq_len": data.seq_len,
            "learning_rate": training_args.learning_rate,
            "final_train_loss": round(train_metrics.get("train_loss", float("nan")), 4),
            "train_runtime_s": round(train_metrics.get("train_runtime", 0.0), 1),
            "eval_runtime_s": round(time.time() - eval_started, 1),
            "torch_threads": torch.get_num_threads(),
        }
        name = training_args.hub_model_id or Path(training_args.output_dir).resolve().name
        write_report(training_args.output_dir, metrics, trainer.state.log_history, title=name, details=details)
        model_section = dict(run.mappings["model"])
        model_section.setdefault("vocab_size", run.model_config.vocab_size)
        context = {
            "model_type": run.model_config.model_type,
            "model_name": name,
            "repo_id": training_args.hub_model_id or f"path/to/{name}",
            "config_file": os.path.relpath(run.path, REPO_ROOT)
            if _inside(run.path, REPO_ROOT)
            else Path(run.path).name,
            "license": "apache-2.0",
            "tags": ["zpx-hf", run.model_config.model_type, "custom_code", "text-generation", "geometric-attention"],
            "datasets": dataset_tags(data),
            "config": {**model_section, "parameters": f"{num_params:,}"},
            "data_description": "\n".join(f"- {line}" for line in datasets["description"]),
            "training": details,
            "metrics": metrics,
        }
        trainer.card_text = render_model_card(model_card_template(run.model_config.model_type), context)
        trainer.create_model_card()
    trainer.accelerator.wait_for_everyone()
    if training_args.push_to_hub:
        trainer.push_to_hub(commit_message=f"{run.model_config.model_type}: trained with zpx-hf training/train.py")
    train_metrics["total_runtime"] = time.time() - started
    return {
        "output_dir": training_args.output_dir,
        "metrics": metrics,
        "train_metrics": train_metrics,
        "trainer": trainer,
        "datasets": datasets,
    }


def cli_main(
    argv: Sequence[str] | None,
    usage: str,
    load_config: Callable[[str, Sequence[str]], Any],
    run: Callable[[Any], dict],
    done_message: Callable[[dict], str],
) -> int:
    """`script CONFIG [--flag value ...]`: load (config errors exit 2 naming the key), run, report on rank 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print(usage.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        config = load_config(argv[0], argv[1:])
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    result = run(config)
    if result["trainer"].is_world_process_zero():
        from zpx_hf.evaluation import metrics_table

        print(metrics_table(result["metrics"]))
        print(done_message(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli_main(argv, __doc__, load_run_config, run_training, lambda result: f"saved to {result['output_dir']}")


if __name__ == "__main__":
    sys.exit(main())
