"""YAML run configs read into dataclasses through `HfArgumentParser`, checked before anything is built.

A config has top-level keys (`ModelArguments`, `RunArguments`, or a job's own dataclasses), dataclass
sections (`data:`, `training:`, `lora:`) and free mappings (`model:`, the family config's keyword
arguments). Command-line flags override any section or top-level field. Unknown keys, wrong types and
values out of range raise `ConfigError` whose one-line message names the key and the fix.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import inspect
import json
import os
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Literal

import yaml

from zpx_hf.tokenization_bytes import VOCAB_SIZE


class ConfigError(ValueError):
    """A config file or command-line value is invalid; the message names the key and the fix."""


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
            if cls is TrainingArguments or cls is RunArguments or cls in exclude or not is_dataclass(obj):
                continue
            parts[cls.__name__] = asdict(obj)
        if self.model_config is not None:
            config = self.model_config.to_dict()
            config.pop("transformers_version", None)
            parts["model_config"] = config
        canonical = json.dumps(parts, sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


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
        if isinstance(cls, type) and issubclass(cls, PretrainedConfig) and "__init__" in cls.__dict__:
            for name, param in inspect.signature(cls.__init__).parameters.items():
                if name != "self" and param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                    keys.add(name)
    return keys


def read_yaml(path: str) -> dict[str, Any]:
    """The top-level mapping of a YAML file; `ConfigError` for a missing file or invalid YAML."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist.")
    with open(path, encoding="utf-8") as f:
        try:
            raw = yaml.load(f, Loader=_YamlLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as error:
            first = str(error).splitlines()[0]
            raise ConfigError(f"{path}: not valid YAML ({first}); fix the syntax.") from error
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

    from .distributed import configure_launch

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

    configure_launch()
    parser = HfArgumentParser([*tops, *sections.values()])
    parser.set_defaults(**flat)
    try:
        parsed = parser.parse_args_into_dataclasses(args=list(cli_args))
    except ValueError as error:  # TrainingArguments.__post_init__ and unused command-line flags
        raise ConfigError(f"{path}: {' '.join(str(error).split())}") from error
    except SystemExit as error:  # argparse: a flag without its value, a bad choice
        raise ConfigError(
            f"{path}: invalid command-line flags {' '.join(cli_args)!r} (see the message above)."
        ) from error
    run = RunConfig(path=path, args={type(obj): obj for obj in parsed}, mappings=found_mappings)
    if TrainingArguments in run.args:
        check_training_args(path, run[TrainingArguments])
    return run


def check_training_args(path: str, args: Any) -> None:
    """Ranges `TrainingArguments` leaves to fail later (batch sizes, steps), and the Hub token moved out of it.

    A token given as `hub_token` would be pickled into every `training_args.bin` (and uploaded with
    it): it is moved to the process's `HF_TOKEN` and removed from the arguments."""
    minimums = {
        "per_device_train_batch_size": 1,
        "per_device_eval_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "logging_steps": 1,
    }
    for key, minimum in minimums.items():
        value = getattr(args, key)
        if value < minimum:
            raise ConfigError(f"{path}: key `training.{key}` = {value} must be >= {minimum}.")
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
            raise unknown_key(path, "model.", key, valid)
    try:
        config = config_class(**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{path}: section `model`: {' '.join(str(error).split())}") from error
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and vocab < VOCAB_SIZE:
        raise ConfigError(
            f"{path}: key `model.vocab_size` = {vocab} is smaller than the byte tokenizer's {VOCAB_SIZE} tokens."
        )
    check_positions(path, config, seq_len)
    return config


def check_positions(path: str, config: Any, seq_len: int | None) -> None:
    """`data.seq_len` must fit the model's positions unless the config allows longer ones."""
    max_positions = getattr(config, "max_position_embeddings", None)
    if seq_len and isinstance(max_positions, int) and seq_len > max_positions:
        if not getattr(config, "allow_longer_positions", False):
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
    "check_positions",
    "check_training_args",
    "config_init_keys",
    "parse_config_file",
    "read_yaml",
    "unknown_key",
]
