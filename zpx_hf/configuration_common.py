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


class Rule(NamedTuple):
    """How one config field is checked. `kind`: "int", "float", "bool" or "choice"; floats are finite."""

    kind: str
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False
    below: float | None = None  # strict upper bound
    choices: tuple[Any, ...] = ()
    optional: bool = False  # None allowed


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
    if rule.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(field, value, "expected an integer.")
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(field, value, "expected a finite number.")
    if rule.positive and value <= 0:
        _fail(field, value, "expected a number > 0.")
    if rule.minimum is not None and value < rule.minimum:
        _fail(field, value, f"expected a number >= {rule.minimum}.")
    if rule.maximum is not None and value > rule.maximum:
        _fail(field, value, f"expected a number <= {rule.maximum}.")
    if rule.below is not None and value >= rule.below:
        _fail(field, value, f"expected a number < {rule.below}.")


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
        head_dim: per-head width; defaults to `hidden_size // num_attention_heads`. Must be even when
            a rotary encoding is used (rotation acts on pairs).
        max_position_embeddings: context length the model is trained for. Longer inputs raise unless
            `allow_longer_positions=True` (SRPE/RoPE tables are extended on demand then).
        rotary: `"srpe"` (spiral rotary, docs/design.md §2), `"rope"` (plain RoPE) or `"none"`.
        rope_theta: base `theta0` of the rotary frequencies `omega_j = theta0 ** (-2j / d_h)`.
        srpe_k: spiral divisor `k_s`; the winding angle is `p * omega_j * (1 + 1/k_s)`. `None` means
            `1/k_s = 0` (no second winding).
        srpe_a: radial amplitude `a_s` of `r_j(p) = 1 + a_s * sin(p * f_s * omega_j)`.
        srpe_f: radial frequency `f_s`.
        causal: causal (decoder) attention; `False` gives a bidirectional encoder (not valid for
            `*ForCausalLM`).
        rms_norm_eps: epsilon of the RMS norms.
        initializer_range: std of the normal weight initialisation.
    """

    def __init__(
        self,
        vocab_size: int = 260,
        hidden_size: int = 128,
        intermediate_size: int = 344,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        head_dim: int | None = None,
        max_position_embeddings: int = 512,
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
        # DynamicCache(config=...) reads `layer_types`; only values HF knows are allowed there.
        kwargs.pop("layer_types", None)
        self.layer_types = ["full_attention"] * (num_hidden_layers if isinstance(num_hidden_layers, int) else 0)
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
        "head_dim": Rule("int", minimum=1),
        "max_position_embeddings": Rule("int", minimum=1, maximum=MAX_POSITION_LIMIT),
        "allow_longer_positions": Rule("bool"),
        "rotary": Rule("choice", choices=ROTARY_TYPES),
        "rope_theta": Rule("float", positive=True),
        "srpe_k": Rule("float", optional=True),
        "srpe_a": Rule("float", minimum=0.0, below=1.0),
        "srpe_f": Rule("float"),
        "causal": Rule("bool"),
        "rms_norm_eps": Rule("float", positive=True),
        "initializer_range": Rule("float", minimum=0.0),
        "attention_dropout": Rule("float", minimum=0.0, below=1.0),
    }

    def validate(self) -> None:
        """Raise `ValueError` naming the first invalid field."""
        for field, rule in self.field_rules.items():
            check_field(field, getattr(self, field), rule)
        if self.rotary != "none" and self.rotary_dim % 2 != 0:
            _fail(
                "head_dim",
                self.head_dim,
                f"rotary={self.rotary!r} rotates pairs of features, so head_dim must be even; "
                "change hidden_size/num_attention_heads (or head_dim), or set rotary='none'.",
            )
        if self.srpe_k == 0:
            _fail("srpe_k", self.srpe_k, "the winding uses 1/k_s; use null (None) for no second winding.")
        self._validate_family()

    @property
    def rotary_dim(self) -> int:
        """Real features per head that rotary positions rotate in pairs (PCT: 2 x complex head_dim)."""
        return self.head_dim

    def _validate_family(self) -> None:
        """Family-specific checks; overridden by each family's config."""
