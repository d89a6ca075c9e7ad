"""Configuration pieces shared by the ZPX, PCT and Versor families.

`GeometricConfig` holds the fields every family has (vocabulary, depth, width, rotary positions). The
checks are data: each config class lists its fields' rules in `field_rules` (`Rule(kind, ...)`), and
`validate()` applies them before any weight is allocated; only checks across fields are code
(`_validate_family`). Every error names the field and says how to fix it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import inspect
import math
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar, NamedTuple

import torch
from transformers import GenerationConfig, PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

ROTARY_TYPES = ("srpe", "rope", "none")
# transformers' rope types (`rope_parameters["rope_type"]`): "default" plus every `ROPE_INIT_FUNCTIONS` entry of the
# installed version (5.17 to 5.25: linear, dynamic, yarn, longrope, llama3, proportional)
ROPE_TYPES = ("default", *ROPE_INIT_FUNCTIONS)
DEFAULT_ROPE_THETA = 10000.0
# Rotary tables and masks are sized by the context length; beyond this a config is a typo, not a model.
MAX_POSITION_LIMIT = 1 << 24
# GeometricConfig's default max_position_embeddings (also PCT's version-1 gate-bias length, configuration_pct)
DEFAULT_MAX_POSITION_EMBEDDINGS = 512
# Logit-scale weights (ZPX's lambdas, GPA's gamma, PCT's tau) multiply terms in [-1, 1] (or O(1) at
# initialisation) and are held in the model dtype once a model is cast: in float16, the narrowest dtype a
# model runs in, a weight past its max (65504) is inf, and inf * 0 = NaN in the score (measured: 6e4 finite,
# 1e5 NaN in float16; 1e308 is inf in float32 already). So |weight| <= float16 max, for every dtype.
LOGIT_SCALE_LIMIT = 65504.0
TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")
# Keys transformers (or a tool built on it) reads from a config's kwargs or writes to config.json without
# keeping them as `PretrainedConfig` attributes (the rest are read off `PretrainedConfig` itself, below).
TRANSFORMERS_CONFIG_KEYS = frozenset(
    {
        "add_cross_attention", "architectures", "attn_implementation", "auto_map", "bos_token_id",
        "chunk_size_feed_forward", "cross_attention_hidden_size", "custom_pipelines", "decoder_start_token_id",
        "dtype", "eos_token_id", "experts_implementation", "finetuning_task", "id2label", "is_decoder",
        "is_encoder_decoder", "label2id", "model_type", "name_or_path", "num_labels", "output_attentions",
        "output_hidden_states", "pad_token_id", "per_layer_config", "prefix", "problem_type", "pruned_heads",
        "quantization_config", "return_dict", "rope_parameters", "rope_scaling", "sep_token_id",
        "task_specific_params", "tf_legacy_loss", "tie_encoder_decoder", "tie_word_embeddings", "tokenizer_class",
        "torch_dtype", "torchscript", "transformers_version", "use_bfloat16",
    }
)  # fmt: skip

# Keys that loaders hand to the config without the user writing them in it: `AutoTokenizer.from_pretrained(path,
# add_bos_token=True)` passes its tokenizer arguments on to `AutoConfig.from_pretrained`; lm-eval passes
# `gguf_file=None`. They configure the tokenizer or the loading, never the model, so no warning names them.
LOADER_KEYS = frozenset(
    {
        "add_bos_token", "add_eos_token", "add_prefix_space", "clean_up_tokenization_spaces", "gguf_file",
        "legacy", "model_max_length", "padding_side", "split_special_tokens", "truncation_side", "use_fast",
    }
)  # fmt: skip


class Rule(NamedTuple):
    """How one config field is checked. `kind`: "int", "float", "bool" or "choice"; floats are finite."""

    kind: str
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False
    below: float | None = None  # strict upper bound
    above: float | None = None  # strict lower bound
    choices: tuple[Any, ...] = ()  # for "int"/"float": named values accepted besides numbers
    optional: bool = False  # None allowed
    why: str = ""  # the reason behind a range, appended to the message


def _fail(field: str, value: Any, fix: str) -> None:
    raise ValueError(f"config field `{field}`={value!r} is invalid: {fix}")


def check_field(field: str, value: Any, rule: Rule) -> None:
    """Raise `ValueError` naming `field` when `value` breaks `rule`."""
    if value is None and rule.optional:
        return
    if rule.kind == "bool":
        if not isinstance(value, bool):
            _fail(field, value, "expected true or false.")
        return
    if rule.kind == "choice":
        if value not in rule.choices:
            _fail(field, value, f"expected one of {list(rule.choices)}.")
        return
    if rule.choices and isinstance(value, str):
        if value not in rule.choices:
            _fail(field, value, f"expected a number or one of {list(rule.choices)}.")
        return
    if rule.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            hint = f" (write {value}, not {value!r})" if isinstance(value, str) and value.strip().isdigit() else ""
            _fail(field, value, f"expected an integer{hint}.")
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(field, value, "expected a finite number.")
    why = f" {rule.why}" if rule.why else ""
    if rule.positive and value <= 0:
        _fail(field, value, f"expected a number > 0.{why}")
    if rule.above is not None and value <= rule.above:
        _fail(field, value, f"expected a number > {rule.above:g}.{why}")
    if rule.minimum is not None and value < rule.minimum:
        _fail(field, value, f"expected a number >= {rule.minimum:g}.{why}")
    if rule.maximum is not None and value > rule.maximum:
        _fail(field, value, f"expected a number <= {rule.maximum:g}.{why}")
    if rule.below is not None and value >= rule.below:
        _fail(field, value, f"expected a number < {rule.below:g}.{why}")


def check_token_ids(vocab_size: int, token_ids: dict[str, Any]) -> None:
    """Special token ids are `None` or ids of the vocabulary: `pad_token_id` is the embedding's padding row
    (an id past the vocabulary fails deep in `nn.Embedding`; a negative one is read from the end, so -5 would
    silently make token vocab_size - 5 padding)."""
    for field, value in token_ids.items():
        ids = value if isinstance(value, (list, tuple)) else [value]
        for token in ids:
            if token is None:
                continue
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                _fail(
                    field,
                    value,
                    f"expected a token id in [0, vocab_size={vocab_size}) or null (none); use the "
                    "tokenizer's id, or raise vocab_size.",
                )


def check_dtype_name(field: str, value: Any) -> None:
    """`dtype` is null, a torch dtype, or its name ("bfloat16"): transformers turns a name into
    `getattr(torch, name)`, which fails on a typo with an AttributeError about torch."""
    if value is None or isinstance(value, torch.dtype):
        return
    if not isinstance(value, str) or not isinstance(getattr(torch, value, None), torch.dtype):
        _fail(field, value, "expected a torch dtype name such as 'float32', 'bfloat16' or 'float16', or null.")


def pop_removed_fields(kwargs: dict[str, Any], removed: dict[str, str]) -> None:
    """Drop fields earlier versions wrote to config.json (their checkpoints still load); warn when the
    stored value asked for something other than the default, since it no longer has an effect."""
    for field, advice in removed.items():
        value = kwargs.pop(field, None)
        if value not in (None, "auto"):
            warnings.warn(f"config field `{field}`={value!r} was removed and is ignored: {advice}", stacklevel=3)


@functools.cache
def transformers_config_keys() -> frozenset[str]:
    """Every key transformers itself may pass to a config: `PretrainedConfig`'s fields, attributes and
    properties on the installed version, the generation parameters older config.json files carry,
    `TRANSFORMERS_CONFIG_KEYS` and `LOADER_KEYS`."""
    keys = (
        set(TRANSFORMERS_CONFIG_KEYS | LOADER_KEYS) | set(vars(PretrainedConfig())) | set(GenerationConfig().to_dict())
    )
    if dataclasses.is_dataclass(PretrainedConfig):
        keys.update(field.name for field in dataclasses.fields(PretrainedConfig))
    keys.update(name for name in dir(PretrainedConfig) if isinstance(getattr(PretrainedConfig, name), property))
    return frozenset(keys)


@functools.cache
def family_config_fields(config_class: type[GeometricConfig]) -> frozenset[str]:
    """The fields a config class defines itself: its checked fields and every `__init__` parameter up its MRO."""
    fields = set(config_class.field_rules)
    for klass in config_class.__mro__:
        if "__init__" in vars(klass) and issubclass(klass, GeometricConfig):
            parameters = inspect.signature(klass.__init__).parameters.values()
            fields.update(p.name for p in parameters if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD)
    fields.discard("self")
    return frozenset(fields)


def warn_unknown_fields(config_class: type[GeometricConfig], kwargs: dict[str, Any]) -> None:
    """Warn for each key no code reads (a typo such as `hiden_size` leaves `hidden_size` at its default and
    trains the wrong model), naming the nearest known field. transformers keeps such keys as attributes
    without a word; private keys (`_...`) are its own bookkeeping."""
    # arg-type: a class is hashable (by its metaclass); mypy asks the instances' `__hash__`, which a dataclass drops
    family = family_config_fields(config_class)  # type: ignore[arg-type]
    known = family | transformers_config_keys()
    for key, value in kwargs.items():
        if key in known or key.startswith("_"):
            continue
        nearest = difflib.get_close_matches(key, sorted(family), n=1) or difflib.get_close_matches(
            key, sorted(known), n=1
        )
        hint = f"did you mean `{nearest[0]}`? Fix the spelling" if nearest else "check the spelling"
        warnings.warn(
            f"config field `{key}`={value!r} is not a {config_class.__name__} field and has no effect: {hint}, or "
            "remove it.",
            UserWarning,
            stacklevel=4,
        )


def rope_parameters_from(
    rope_parameters: dict[str, Any] | None, rope_theta: float | None, rope_scaling: dict[str, Any] | None
) -> dict[str, Any]:
    """transformers' `rope_parameters` from a config's arguments: the mapping (or its older name `rope_scaling`,
    as transformers reads it) and `rope_theta`, which configs saved before rope types held at the top level."""
    if rope_parameters is not None and rope_scaling is not None and rope_scaling != rope_parameters:
        _fail("rope_scaling", rope_scaling, f"it is the older name of rope_parameters={rope_parameters!r}; give one.")
    given = rope_parameters if rope_parameters is not None else rope_scaling
    if given is not None and not isinstance(given, dict):
        _fail("rope_parameters", given, "expected a mapping such as {'rope_type': 'default', 'rope_theta': 1e4}.")
    params = dict(given or {})  # a copy: transformers' standardisation writes into it
    if rope_theta is not None and params.setdefault("rope_theta", rope_theta) != rope_theta:
        _fail("rope_theta", rope_theta, f"rope_parameters gives rope_theta={params['rope_theta']!r}; give one.")
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", DEFAULT_ROPE_THETA)
    return params


@contextlib.contextmanager
def rope_errors_named(params: dict[str, Any]) -> Iterator[None]:
    """transformers' rope validation raises `KeyError` for a missing key: a `ValueError` naming the field instead."""
    try:
        yield
    except KeyError as error:
        if "rope_parameters" not in str(error):
            raise
        _fail("rope_parameters", params, f"{error.args[0]}.")


class GeometricConfig(PretrainedConfig):
    """Fields shared by all three families (Llama names where the meaning is the same).

    Args:
        vocab_size: token vocabulary size.
        hidden_size: width of the residual stream (real features).
        intermediate_size: width of the SwiGLU feed-forward layer.
        num_hidden_layers: number of decoder blocks.
        num_attention_heads: attention heads per block.
        num_key_value_heads: key-value heads per block (grouped-query attention, as Llama's): each serves
            `num_attention_heads // num_key_value_heads` query heads, and the KV cache holds this many heads.
            Defaults to `num_attention_heads` (multi-head attention); 1 is multi-query attention.
        head_dim: per-head width; defaults to `hidden_size // num_attention_heads`. Must be even when
            a rotary encoding is used (rotation acts on pairs).
        max_position_embeddings: the longest context the model is meant to run at (it may exceed the training
            length: PCT's gate bias reads `train_context_length` instead). Longer inputs raise when
            `allow_longer_positions=False`; otherwise (the default) SRPE/RoPE tables are extended on demand.
        rotary: `"srpe"` (spiral rotary, docs/design.md §2), `"rope"` (plain RoPE) or `"none"`.
        rope_parameters: transformers' `RopeParameters` (validated by transformers): `rope_theta`, the base
            `theta0` of `omega_j = theta0 ** (-2j / d_h)`, and `rope_type`, one of `ROPE_TYPES` ("default", or a
            scaling transformers computes: linear, dynamic, yarn, longrope, llama3, ...) with its fields. Scaled
            types need `rotary="rope"` (docs/design.md §2.5). Also read under its older name `rope_scaling`.
        rope_theta: configs written before `rope_parameters` kept `theta0` here; it is read into
            `rope_parameters["rope_theta"]` (and `config.rope_theta` reads and writes it there).
        srpe_k: spiral divisor `k_s`; the winding angle is `p * omega_j * (1 + 1/k_s)`. `None` means
            `1/k_s = 0` (no second winding). Must be > 2^-24 (k_s <= 0 cancels or reverses the rotation).
        srpe_a: radial amplitude `a_s` of `r_j(p) = 1 + a_s * sin(p * f_s * omega_j)`.
        srpe_f: radial frequency `f_s`.
        causal: causal (decoder) attention; `False` gives a bidirectional encoder (not valid for
            `*ForCausalLM`).
        rms_norm_eps: epsilon of the RMS norms.
        initializer_range: std of the normal weight initialisation.
        pad_token_id, bos_token_id, eos_token_id: ids in `[0, vocab_size)` or `None`.
    """

    def __init__(
        self,
        vocab_size: int = 260,
        hidden_size: int = 128,
        intermediate_size: int = 344,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        max_position_embeddings: int = DEFAULT_MAX_POSITION_EMBEDDINGS,
        allow_longer_positions: bool = True,
        rotary: str = "srpe",
        rope_parameters: dict[str, Any] | None = None,
        rope_theta: float | None = None,
        srpe_k: float | None = 8.0,
        srpe_a: float = 0.1,
        srpe_f: float = 0.01,
        causal: bool = True,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        attention_dropout: float = 0.0,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | None = 2,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else self._default_head_dim(hidden_size, num_attention_heads)
        self.max_position_embeddings = max_position_embeddings
        self.allow_longer_positions = allow_longer_positions
        self.rotary = rotary
        self.rope_parameters = rope_parameters_from(rope_parameters, rope_theta, kwargs.pop("rope_scaling", None))
        self.srpe_k = srpe_k
        self.srpe_a = srpe_a
        self.srpe_f = srpe_f
        self.causal = causal
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.attention_dropout = attention_dropout
        self.use_cache = use_cache
        # Checked before transformers' validators read them (they compare token ids with vocab_size and warn).
        self.check_fields()
        check_token_ids(
            vocab_size, dict(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
        )
        # DynamicCache(config=...) reads `layer_types`; only values HF knows are allowed there.
        kwargs.pop("layer_types", None)
        warn_unknown_fields(type(self), kwargs)
        for field in ("dtype", "torch_dtype"):
            check_dtype_name(field, kwargs.get(field))
        self.layer_types = ["full_attention"] * num_hidden_layers
        self.check_rope_parameters(with_transformers=False)  # transformers' own validation runs in its __init__
        # ... where (5.25) it refuses an odd head_dim even without rotary tables: hidden from it for rotary="none"
        head_dim = self.head_dim
        if rotary == "none":
            self.__dict__["head_dim"] = None  # not a value of the field: its rule is not asked
        with rope_errors_named(self.rope_parameters):
            # call-arg: transformers' `@strict(accept_kwargs=True)` takes the keys its dataclass signature omits
            super().__init__(  # type: ignore[call-arg]
                pad_token_id=pad_token_id,
                bos_token_id=bos_token_id,
                eos_token_id=eos_token_id,
                tie_word_embeddings=tie_word_embeddings,
                **kwargs,
            )
        self.head_dim = head_dim
        self.validate()

    @staticmethod
    def _default_head_dim(hidden_size: Any, num_heads: Any) -> Any:
        if isinstance(hidden_size, int) and isinstance(num_heads, int) and num_heads > 0:
            return hidden_size // num_heads
        return None

    field_rules: ClassVar[dict[str, Rule]] = {
        "vocab_size": Rule("int", minimum=1),
        "hidden_size": Rule("int", minimum=1),
        "intermediate_size": Rule("int", minimum=1),
        "num_hidden_layers": Rule("int", minimum=1),
        "num_attention_heads": Rule("int", minimum=1),
        "num_key_value_heads": Rule("int", minimum=1),
        "head_dim": Rule("int", minimum=1),
        "max_position_embeddings": Rule("int", minimum=1, maximum=MAX_POSITION_LIMIT),
        "allow_longer_positions": Rule("bool"),
        "rotary": Rule("choice", choices=ROTARY_TYPES),
        "rope_theta": Rule("float", positive=True),
        # Theta_j(p) = p omega_j w with winding w = 1 + 1/k_s: k_s = -1 gives w = 0 (every position the same
        # rotation: positions ignored) and k_s < 0 shrinks or mirrors every frequency, so k_s > 0 (w > 1).
        # The fastest pair (omega_0 = 1) turns w rad per token, in float32 tables whose ulp is 2 rad at 2^24
        # rad (a third of a turn: rounding noise from position 1), so w < 2^24, i.e. k_s > 2^-24 (~6e-8).
        "srpe_k": Rule(
            "float",
            optional=True,
            above=2.0**-24,
            why="The winding is 1 + 1/srpe_k: use a positive srpe_k (k=-1 cancels the rotation), or null for "
            "no second winding.",
        ),
        "srpe_a": Rule("float", minimum=0.0, below=1.0),
        "srpe_f": Rule("float"),
        "causal": Rule("bool"),
        "rms_norm_eps": Rule("float", positive=True),
        "initializer_range": Rule("float", minimum=0.0),
        "attention_dropout": Rule("float", minimum=0.0, below=1.0),
    }

    def __setattr__(self, key: str, value: Any) -> None:
        # Once every checked field is set (after `__init__`, or a copy), assigning one (also the overrides
        # `from_pretrained(..., field=v)` sets by setattr) checks it at once; checks across fields run in
        # `validate()`. (transformers 5.25 marks the end of init with `_post_init_done`; 5.17 has no such mark.)
        rules = type(self).field_rules
        # (a field held by a property, such as `rope_theta` over `rope_parameters`, is never in `__dict__`)
        stored = [field for field in rules if not isinstance(getattr(type(self), field, None), property)]
        if key in rules and all(field in self.__dict__ for field in stored):
            check_field(key, value, rules[key])
        super().__setattr__(key, value)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        result = super().from_dict(config_dict, **kwargs)
        config = result[0] if isinstance(result, tuple) else result
        if not kwargs.get("return_unused_kwargs"):  # else the caller gets them back (the model's kwargs)
            warn_unknown_fields(cls, {key: value for key, value in kwargs.items() if not hasattr(config, key)})
        config.validate()  # overrides were set one by one: check how they combine
        return result

    def check_fields(self) -> None:
        """Each field against its own rule (`field_rules`)."""
        for field, rule in self.field_rules.items():
            check_field(field, getattr(self, field), rule)

    def validate(self) -> None:
        """Raise `ValueError` naming the first invalid field."""
        self.check_fields()
        check_token_ids(self.vocab_size, {field: getattr(self, field, None) for field in TOKEN_ID_FIELDS})
        if self.num_attention_heads % self.num_key_value_heads != 0:
            _fail(
                "num_key_value_heads",
                self.num_key_value_heads,
                f"each key-value head serves a whole group of query heads, so it must divide num_attention_heads="
                f"{self.num_attention_heads}; use a divisor of it (1 is multi-query attention, "
                f"{self.num_attention_heads} is multi-head attention).",
            )
        self.check_rope_parameters()
        self._validate_family()

    @property
    def rope_theta(self) -> float:
        """`rope_parameters["rope_theta"]`, the base `theta0` of the rotary frequencies."""
        return self.rope_parameters["rope_theta"]

    @rope_theta.setter
    def rope_theta(self, value: float) -> None:
        self.rope_parameters["rope_theta"] = value

    def check_rope_parameters(self, with_transformers: bool = True) -> None:
        """`rope_parameters` in transformers' format, checked for what the rotary modules compute (a known rope type,
        the whole head rotated, scalings only on plain RoPE) and by transformers (`validate_rope`)."""
        if self.rotary != "none" and self.rotary_dim % 2 != 0:
            _fail(
                "head_dim",
                self.head_dim,
                f"rotary={self.rotary!r} rotates pairs of features, so head_dim must be even; "
                "change hidden_size/num_attention_heads (or head_dim), or set rotary='none'.",
            )
        params = self.rope_parameters
        if not isinstance(params, dict) or any(isinstance(value, dict) for value in params.values()):
            _fail(
                "rope_parameters", params, "expected one mapping such as {'rope_type': 'default', 'rope_theta': 1e4}."
            )
        rope_type = params.get("rope_type")
        if rope_type not in ROPE_TYPES:
            _fail("rope_parameters", params, f"rope_type must be one of transformers' rope types {list(ROPE_TYPES)}.")
        if params.get("partial_rotary_factor", 1.0) != 1.0 and rope_type != "proportional":
            _fail(
                "rope_parameters",
                params,
                "partial_rotary_factor must be 1 (the rotary tables rotate every pair of the head); "
                "rope_type='proportional' is the type that leaves a part of the head unrotated.",
            )
        if rope_type != "default" and self.rotary != "rope":
            _fail(
                "rope_parameters",
                params,
                f"rope_type={rope_type!r} scales RoPE's frequencies and needs rotary='rope' (rotary={self.rotary!r}"
                + (
                    ": SRPE's winding and radial terms have no scaled form, docs/design.md §2.5)."
                    if self.rotary == "srpe"
                    else " has no rotary tables to scale)."
                ),
            )
        if with_transformers and self.rotary != "none":  # without rotary tables there is nothing to validate
            with rope_errors_named(params):
                self.standardize_rope_params()
                self.validate_rope()

    @property
    def num_key_value_groups(self) -> int:
        """Query heads per key-value head: query head h reads key-value head `h // num_key_value_groups`."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def rotary_dim(self) -> int:
        """Real features per head that rotary positions rotate in pairs (PCT: 2 x complex head_dim)."""
        return self.head_dim

    def _validate_family(self) -> None:
        """Family-specific checks; overridden by each family's config."""
