"""Configuration pieces shared by the ZPX, PCT and Versor families.

`GeometricConfig` holds the fields every family has (vocabulary, depth, width, rotary positions). The
checks are data: each config class lists its fields' rules in `field_rules` (`Rule(kind, ...)`), and
`validate()` applies them before any weight is allocated; only checks across fields are code
(`_validate_family`). Every error names the field and says how to fix it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar, NamedTuple

from transformers import PretrainedConfig

ROTARY_TYPES = ("srpe", "rope", "none")
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


def pop_removed_fields(kwargs: dict[str, Any], removed: dict[str, str]) -> None:
    """Drop fields earlier versions wrote to config.json (their checkpoints still load); warn when the
    stored value asked for something other than the default, since it no longer has an effect."""
    for field, advice in removed.items():
        value = kwargs.pop(field, None)
        if value not in (None, "auto"):
            warnings.warn(f"config field `{field}`={value!r} was removed and is ignored: {advice}", stacklevel=3)


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
        rope_theta: base `theta0` of the rotary frequencies `omega_j = theta0 ** (-2j / d_h)`.
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
        rope_theta: float = 10000.0,
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
        self.rope_theta = rope_theta
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
        self.layer_types = ["full_attention"] * num_hidden_layers
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
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
        # After `__init__`, assigning a checked field (also the overrides `from_pretrained(..., field=v)` sets
        # by setattr) checks it at once; checks across fields run in `validate()`.
        if key in type(self).field_rules and self.__dict__.get("_post_init_done"):  # set by PreTrainedConfig
            check_field(key, value, type(self).field_rules[key])
        super().__setattr__(key, value)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        result = super().from_dict(config_dict, **kwargs)
        config = result[0] if isinstance(result, tuple) else result
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
        if self.rotary != "none" and self.rotary_dim % 2 != 0:
            _fail(
                "head_dim",
                self.head_dim,
                f"rotary={self.rotary!r} rotates pairs of features, so head_dim must be even; "
                "change hidden_size/num_attention_heads (or head_dim), or set rotary='none'.",
            )
        self._validate_family()

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
