"""YAML run configs read into dataclasses through `HfArgumentParser`, checked before anything is built.

A config has top-level keys (`ModelArguments`, `RunArguments`, or a job's own dataclasses), dataclass
sections (`data:`, `training:`, `lora:`) and free mappings (`model:`, the family config's keyword
arguments). Command-line flags override any section or top-level field. Unknown keys, wrong types and
values out of range raise `ConfigError` whose one-line message names the key and the fix.

Parsing is bounded: at most `MAX_CONFIG_BYTES` of UTF-8, a safe loader that refuses aliases (an alias bomb
expands exponentially wherever the config is walked, e.g. by `RunConfig.fingerprint`) and duplicate keys,
and `check_regular_file` before any input file is opened (a FIFO would block forever).
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import inspect
import json
import math
import os
import re
import stat
import types
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from zpx_hf.tokenization_bytes import VOCAB_SIZE

from .distributed import configure_launch
from .errors import ConfigError
from .package_data import data_folder, shipped_configs


@dataclass
class ModelArguments:
    """Top-level YAML keys of a training config; the `model:` mapping holds the family config's arguments."""

    model_type: str | None = field(
        default=None, metadata={"help": "AutoConfig model type of the family to train (zpx, pct, versor, ...)."}
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "Attention implementation passed to from_config (e.g. sdpa, eager)."}
    )


@dataclass
class RunArguments:
    """Top-level keys about the run folder, shared by every job."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Train into an output_dir that holds another run's files (they are replaced)."},
    )
    inspect: bool = field(
        default=False,
        metadata={"help": "Draw the model's geometry into output_dir/inspection/ and embed it in the card."},
    )


@dataclass
class RunConfig:
    """A parsed and validated config: the dataclass instances, free mappings and the built model config."""

    path: str
    args: dict[type, Any]
    mappings: dict[str, dict[str, Any]]
    model_config: Any = None

    def __getitem__(self, cls: type) -> Any:
        return self.args[cls]

    def fingerprint(self, exclude: Sequence[type] = ()) -> str:
        """Hash of what defines the trained weights (model config, data, every section but `training`).

        Two runs with the same fingerprint may share an output folder (resume); others may not."""
        from transformers import TrainingArguments

        parts: dict[str, Any] = {name: values for name, values in self.mappings.items()}
        for cls, obj in self.args.items():
            if cls is TrainingArguments or cls is RunArguments or cls in exclude:
                continue
            if not is_dataclass(obj) or isinstance(obj, type):  # a parsed section: a dataclass instance
                continue
            parts[cls.__name__] = asdict(obj)
        if self.model_config is not None:
            config = self.model_config.to_dict()
            config.pop("transformers_version", None)
            parts["model_config"] = config
        canonical = json.dumps(parts, sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


MAX_CONFIG_BYTES = 1 << 20  # a run config is a few kB; the cap bounds parsing time and memory


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that a run config refuses (an alias, a duplicate key)."""


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that reads `3e-4` (no dot) as a float, as YAML 1.2 does, and refuses what a run config never
    needs: aliases (`*name`, whose expansion makes a 1 kB file gigabytes: the "billion laughs"), duplicate
    keys (YAML lets the last one win silently) and keys that are not strings (`1: x`, `? [a, b] : 1`)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            problem = f"alias *{event.anchor} is not allowed; write the value out"
            raise _Refused(problem=problem, problem_mark=event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):  # `1: x`, `? [a, b]`: never a field name (and not hashable, for a list)
                kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list"}.get(type(key), "a value")
                problem = f"key {key!r} is {kind}, not a name; config keys are names such as `seed`"
                raise _Refused(problem=problem, problem_mark=key_node.start_mark)
            if key in seen:
                raise _Refused(problem=f"duplicate key {key!r}; keep one", problem_mark=key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def check_regular_file(path: str | os.PathLike[str], where: str) -> os.stat_result:
    """`os.stat` of a regular file; `ConfigError` for a missing path, a folder or a FIFO, socket or device
    (reading one blocks forever or never ends). Every file the jobs read as input passes here first."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise ConfigError(f"{where}: cannot open {os.fspath(path)!r} ({error.strerror}).") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise ConfigError(f"{where}: {os.fspath(path)!r} is {kind}; give a regular file.")
    return info


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


def unknown_key(path: str, where: str, key: str, valid: Sequence[str]) -> ConfigError:
    """`ConfigError` for an unknown key, with the closest valid names."""
    close = difflib.get_close_matches(key, valid, n=3)
    hint = f" Did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
    return ConfigError(f"{path}: unknown key `{where}{key}`.{hint} Valid keys: {', '.join(sorted(valid))}.")


def _check_section(path: str, prefix: str, values: dict[str, Any], cls: type) -> None:
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in fields(cls) if f.init]
    for key, value in values.items():
        if key not in valid:
            raise unknown_key(path, prefix, key, valid)
        if not _matches(value, hints[key]):
            raise ConfigError(
                f"{path}: key `{prefix}{key}` = {value!r} has the wrong type: expected {_type_name(hints[key])}."
            )


def config_init_keys(config_class: type) -> set[str]:
    """Keyword arguments accepted by a config class and its `PretrainedConfig` bases."""
    from transformers import PretrainedConfig

    keys: set[str] = set()
    for cls in config_class.__mro__:
        if issubclass(cls, PretrainedConfig) and "__init__" in cls.__dict__:
            for name, param in inspect.signature(cls.__init__).parameters.items():
                if name != "self" and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                    keys.add(name)
    return keys


def resolve_config(path: str) -> str:
    """`path` when it exists; else the config shipped with the package that it names without a folder
    (`zpx-tiny` or `zpx-tiny.yaml`), so an installed package runs its configs from any folder; else
    `ConfigError` listing the shipped names."""
    if os.path.lexists(path):
        return path
    shipped = shipped_configs()
    name = path.removesuffix(".yaml")
    if "/" not in path and os.sep not in path and name in shipped:
        return str(shipped[name])
    raise ConfigError(
        f"config file {path!r} does not exist; give a YAML file, or the name of a config that ships with zpx-hf: "
        f"{', '.join(shipped)} (in {data_folder('configs')})."
    )


def read_yaml(path: str) -> dict[str, Any]:
    """The top-level mapping of a YAML file of at most `MAX_CONFIG_BYTES` UTF-8 bytes, without aliases or
    duplicate keys; `ConfigError` naming the file, line and fix otherwise."""
    if not os.path.exists(path):
        raise ConfigError(f"config file {path!r} does not exist.")
    check_regular_file(path, "config file")
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)  # never more, whatever the file's size
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: over the {MAX_CONFIG_BYTES}-byte limit of a run config; is it the right file?")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path}: not UTF-8 (byte 0x{data[error.start]:02x} at offset {error.start}); re-save it as UTF-8."
        ) from None
    try:
        raw = yaml.load(text, Loader=_YamlLoader)  # safe: a SafeLoader subclass
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or " ".join(str(error).split())
        kind = "" if isinstance(error, _Refused) else "not valid YAML: "
        raise ConfigError(f"{path}{line}: {kind}{problem}.") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a run config.") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(raw).__name__}.")
    return raw


def parse_config_file(
    path: str,
    cli_args: Sequence[str],
    tops: Sequence[type],
    sections: dict[str, type],
    mappings: Sequence[str] = (),
) -> RunConfig:
    """Read a YAML config into dataclasses through `HfArgumentParser`; `cli_args` override its values.

    Each class in `tops` contributes top-level keys, each `sections[name]` is a mapping read into that
    dataclass, and each name in `mappings` is a free mapping returned as a dict (validated by the caller).
    """
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.hf_argparser import DataClassType

    path = resolve_config(path)
    raw = read_yaml(path)
    top_fields = {f.name: cls for cls in tops for f in fields(cls) if f.init}
    valid_top = sorted(set(top_fields) | set(sections) | set(mappings))
    flat: dict[str, Any] = {}
    for key in raw:
        if key not in valid_top:
            raise unknown_key(path, "", key, valid_top)
    for cls in tops:
        values = {key: raw[key] for key in raw if top_fields.get(key) is cls}
        _check_section(path, "", values, cls)
        flat.update(values)
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

    class FlagParser(HfArgumentParser):
        def error(self, message: str) -> typing.NoReturn:
            raise _FlagError(message)

    configure_launch()
    parser = FlagParser([DataClassType(cls) for cls in (*tops, *sections.values())])
    parser.set_defaults(**flat)
    try:
        parsed = parser.parse_args_into_dataclasses(args=list(cli_args))
    except _FlagError as error:  # argparse: a flag without its value, a bad value or choice
        raise ConfigError(f"{path}: command-line {error}; flags are config keys, e.g. --max_steps 100.") from None
    except ValueError as error:  # TrainingArguments.__post_init__ and unused command-line flags
        raise ConfigError(f"{path}: {' '.join(str(error).split())}") from error
    run = RunConfig(path=path, args={type(obj): obj for obj in parsed}, mappings=found_mappings)
    prefixes = {**{cls: "" for cls in tops}, **{cls: f"{name}." for name, cls in sections.items()}}
    for cls, obj in run.args.items():
        check_finite(path, prefixes[cls], obj)
    if TrainingArguments in run.args:
        check_training_args(path, run[TrainingArguments])
    return run


class _FlagError(Exception):
    """argparse's error, raised instead of printing the usage of every field and exiting."""


def check_finite(path: str, prefix: str, args: Any) -> None:
    """No float field of a dataclass section may be NaN (`.nan` in YAML, `nan` on the command line)."""
    for f in fields(args):
        value = getattr(args, f.name, None)
        if isinstance(value, float) and math.isnan(value):
            raise ConfigError(f"{path}: key `{prefix}{f.name}` is NaN; give a number.")


def check_training_args(path: str, args: Any) -> None:
    """Ranges `TrainingArguments` leaves to fail later (batch sizes, steps), and the Hub token moved out of it.

    A token given as `hub_token` would be pickled into every `training_args.bin` (and uploaded with
    it): it is moved to the process's `HF_TOKEN` and removed from the arguments."""
    minimums = {
        "per_device_train_batch_size": 1,
        "per_device_eval_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "logging_steps": 1,
        "learning_rate": 0.0,
        "weight_decay": 0.0,
        "max_grad_norm": 0.0,
    }
    for key, minimum in minimums.items():
        value = getattr(args, key)
        if value < minimum:
            raise ConfigError(f"{path}: key `training.{key}` = {value} must be >= {minimum}.")
    if args.dataloader_num_workers < 0:
        raise ConfigError(
            f"{path}: key `training.dataloader_num_workers` = {args.dataloader_num_workers} must be >= 0 "
            "(0 loads batches in the main process)."
        )
    for key in ("seed", "data_seed"):  # numpy's seed range: set_seed fails outside it only once training starts
        value = getattr(args, key)
        if value is not None and not 0 <= value < 2**32:
            raise ConfigError(f"{path}: key `training.{key}` = {value} must be in [0, {2**32 - 1}].")
    for key in ("learning_rate", "weight_decay"):  # an infinite step turns every weight into inf or NaN
        if math.isinf(getattr(args, key)):
            raise ConfigError(f"{path}: key `training.{key}` is infinite; give a finite number.")
    check_output_dir(path, args.output_dir)
    if args.max_steps == 0 or (args.max_steps < 0 and args.num_train_epochs <= 0):
        raise ConfigError(
            f"{path}: key `training.max_steps` = {args.max_steps} trains nothing; set max_steps > 0 "
            "(or num_train_epochs > 0 with max_steps -1)."
        )
    if args.hub_token:
        os.environ["HF_TOKEN"] = args.hub_token
        args.hub_token = None
        print(
            "warning: `hub_token` is used for this run only and never saved; set HF_TOKEN or run "
            "`hf auth login` instead of passing the token on the command line.",
            flush=True,
        )


def check_output_dir(path: str, output_dir: str | None) -> None:
    """`training.output_dir` is a folder (or can become one) that this process may write."""
    if not output_dir:
        return
    where = f"{path}: key `training.output_dir` = {output_dir!r}"
    existing = Path(os.path.abspath(output_dir))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{where}: {str(existing)!r} is a file, not a folder; choose another output_dir.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: folder {str(existing)!r} is not writable; choose another output_dir.")


def check_attn_implementation(path: str, model_config: Any, attn_implementation: str | None) -> None:
    """The model accepts `attn_implementation` (known name, supported by the family, its package installed).

    The check is transformers' own: the model is built on the meta device (no memory, no weights)."""
    if attn_implementation is None:
        return
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(model_config, attn_implementation=attn_implementation)
    except (ValueError, ImportError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0].split(" Please request")[0]
        raise ConfigError(
            f"{path}: key `attn_implementation` = {attn_implementation!r}: {first} Use sdpa or eager."
        ) from None


def build_model_config(
    path: str,
    model_type: str | None,
    kwargs: dict[str, Any],
    seq_len: int | None = None,
    attn_implementation: str | None = None,
    tokenizer: Any = None,
) -> Any:
    """The family config from `model_type` + the `model:` mapping, checked with `attn_implementation`; every
    error names its key. With `model.init_from: PATH` it is PATH's config, the mapping's other keys applied.
    `tokenizer`: the run's (default the byte tokenizer); the vocabulary must hold its ids."""
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
        if key not in valid and key != "init_from":
            raise unknown_key(path, "model.", key, valid + ["init_from"])
    if seq_len and "train_context_length" in valid and "train_context_length" not in kwargs:
        kwargs = {**kwargs, "train_context_length": seq_len}  # PCT: b_h = -log(the data's training length)
    init_from = kwargs.get("init_from")
    kwargs = {key: value for key, value in kwargs.items() if key != "init_from"}
    try:
        if init_from is None:
            config = config_class(**kwargs)
        else:  # the checkpoint's config, the mapping's keys applied and the result checked as a whole
            config = config_class.from_pretrained(init_from_folder(path, init_from, model_type, tokenizer), **kwargs)
            config.validate()
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{path}: section `model`: {' '.join(str(error).split())}") from error
    vocab, needed = getattr(config, "vocab_size", None), VOCAB_SIZE if tokenizer is None else len(tokenizer)
    if isinstance(vocab, int) and vocab < needed:
        raise ConfigError(
            f"{path}: key `model.vocab_size` = {vocab} is smaller than `data.tokenizer`'s {needed} tokens."
        )
    check_positions(path, config, seq_len)
    check_attn_implementation(path, config, attn_implementation)
    return config


def init_from_folder(path: str, init_from: Any, model_type: str, tokenizer: Any = None) -> str:
    """`model.init_from`: a local checkpoint of the `model_type` family (e.g. one `zpx-convert` wrote) whose
    tokenizer, if it has one, is the run's `tokenizer` (default the byte tokenizer; the data is tokenized with it)."""
    import warnings

    from zpx_hf.tokenization_bytes import build_byte_tokenizer

    expected = build_byte_tokenizer() if tokenizer is None else tokenizer

    folder = Path(str(init_from))
    if not isinstance(init_from, str) or not (folder / "config.json").is_file():
        raise ConfigError(f"{path}: key `model.init_from` = {init_from!r} is not a checkpoint folder (no config.json).")
    saved_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    if saved_type != model_type:
        raise ConfigError(
            f"{path}: key `model.init_from` = {init_from!r} holds a {saved_type!r} checkpoint; set model_type: "
            f"{saved_type} (or convert it first: zpx-convert)."
        )
    if (folder / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        saved = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")).get_vocab()
        if saved != expected.get_vocab():
            raise ConfigError(
                f"{path}: key `model.init_from` = {init_from!r} has another tokenizer than `data.tokenizer`, which "
                f"the training data is tokenized with; set data.tokenizer: {str(init_from)!r} (or start from a model "
                "trained on the same tokenizer)."
            )
    else:
        warnings.warn(
            f"model.init_from = {init_from!r} has no tokenizer.json: zpx-train assumes it was trained on the ids of "
            "`data.tokenizer`.",
            stacklevel=2,
        )
    return str(folder)


def check_positions(path: str, config: Any, seq_len: int | None) -> None:
    """`data.seq_len` must fit the model's positions unless the config allows longer ones."""
    max_positions = getattr(config, "max_position_embeddings", None)
    allowed = getattr(config, "allow_longer_positions", False)
    if seq_len and isinstance(max_positions, int) and seq_len > max_positions and not allowed:
        raise ConfigError(
            f"{path}: key `data.seq_len` = {seq_len} exceeds the model's max_position_embeddings = "
            f"{max_positions}; lower seq_len or raise max_position_embeddings."
        )


__all__ = [
    "ConfigError",
    "ModelArguments",
    "RunArguments",
    "RunConfig",
    "build_model_config",
    "check_attn_implementation",
    "check_finite",
    "check_output_dir",
    "check_positions",
    "check_regular_file",
    "check_training_args",
    "config_init_keys",
    "parse_config_file",
    "read_yaml",
    "resolve_config",
    "unknown_key",
]
