"""PCT configuration (model_type `pct`): complex Phase-Coherent Transformer with sigmoid attention."""

from __future__ import annotations

import math
from typing import Any

from .configuration_common import (
    DEFAULT_MAX_POSITION_EMBEDDINGS,
    LOGIT_SCALE_LIMIT,
    GeometricConfig,
    Rule,
    _fail,
    pop_removed_fields,
)

TAU_MODES = ("log_learnable", "sqrt_d", "inv_sqrt_d", "learnable")
LEARNABLE_TAU_MODES = ("log_learnable", "learnable")
# Package defaults (docs/design.md §4.2-4.3: the measurements behind them, benchmarks/results/pct_defaults.md).
DEFAULT_TAU = "log_learnable"
DEFAULT_TAU_INIT = 5.0
DEFAULT_TRAIN_CONTEXT_LENGTH = 512
# 1: the first defaults, of configs saved before this field existed (tau "sqrt_d", b_h =
# -log(max_position_embeddings)); 2: "log_learnable" from tau 20 (its configs omit `tau_init`); 3: the defaults
# above (from tau 5: 20 did not learn MQAR, docs/design.md §4.2).
DEFAULTS_VERSION = 3
V2_TAU_INIT = 20.0


class PCTConfig(GeometricConfig):
    """Configuration of a PCT model (docs/design.md §4). Shared fields: see `GeometricConfig`.

    Widths count real features, as for every HF model (PEFT, DeepSpeed "auto" settings and serving engines
    size tensors by `hidden_size`): the residual stream holds `hidden_size / 2` complex numbers stored as
    `hidden_size` real values `[re | im]`; `head_dim` is the real head width `2d` of complex head dim
    `d = head_dim / 2`; `intermediate_size` is the real width of the feed-forward layer. All three must be
    even. Checkpoints saved before this convention (widths in complex features, no `width_unit` field)
    are converted when loaded.

    Args:
        tau: temperature of `s_ij = tau_h * Re<qn_i, kn_j>`: `"log_learnable"` (default: one per head,
            `tau_h = exp(log_tau_h)`, so Adam's ~lr steps on `log_tau_h` scale tau geometrically and
            attention can sharpen), `"learnable"` (one per head, linear), `"sqrt_d"`, `"inv_sqrt_d"` or a
            fixed number in (0, 65504].
        tau_init: initial tau of the learnable modes; `None` means 5 for `"log_learnable"` (from 5 PCT learns
            MQAR, 0.997, and the keyed needle, where 20 stays at MQAR's plateau: docs/design.md §4.2) and
            sqrt(d) for `"learnable"`. Not allowed with a fixed tau.
        train_context_length: context length n the model is trained at; `b_h` starts at `-log(n)` (sigmoid
            attention recipe, arXiv 2409.04431), so a row of n near-orthogonal keys sums to ~1. Default 512;
            zpx-train sets it from the data's sequence length. Not `max_position_embeddings`: a model
            meant to run 8x past its training length then starts with gates 8x too small to learn.
        gate_bias_init: initial value of `b_h` in `sigmoid(s_ij + b_h)`, overriding `-log(train_context_length)`.
        defaults_version: which package defaults fill fields a config omits: 3 (current); 2 starts
            `"log_learnable"` at 20; a saved config without it was written before the field existed and gets
            version 1's (tau `"sqrt_d"`, n = max_position_embeddings), so an old checkpoint loads as the model it
            was.
        qk_norm_eps: epsilon of the complex L2 normalisation of queries and keys.
        attention_bias: complex biases on the q/k/v/o projections.
        mlp_bias: complex biases in the feed-forward layer.
        width_unit: `"real"` (default); `"complex"` reads `hidden_size`, `head_dim` and `intermediate_size` as
            complex counts (the convention of earlier checkpoints) and converts them.
    """

    model_type = "pct"

    def __init__(
        self,
        tau: str | float | None = None,
        tau_init: float | None = None,
        train_context_length: int | None = None,
        gate_bias_init: float | None = None,
        qk_norm_eps: float = 1e-6,
        attention_bias: bool = False,
        mlp_bias: bool = False,
        width_unit: str | None = None,
        defaults_version: int | None = None,
        **kwargs: Any,
    ) -> None:
        if defaults_version is None:
            # A saved config.json carries `transformers_version`; without `defaults_version` it predates the field (v1).
            defaults_version = 1 if "transformers_version" in kwargs else DEFAULTS_VERSION
        if defaults_version not in range(1, DEFAULTS_VERSION + 1):
            raise ValueError(
                f"config field `defaults_version`={defaults_version!r} is invalid: expected 1 .. {DEFAULTS_VERSION}."
            )
        if tau is None:
            tau = "sqrt_d" if defaults_version == 1 else DEFAULT_TAU
        if tau_init is None and tau == "log_learnable":  # written out, so a re-saved config keeps its start
            tau_init = DEFAULT_TAU_INIT if defaults_version == DEFAULTS_VERSION else V2_TAU_INIT
        if train_context_length is None and defaults_version == 1:  # the old b_h = -log(max_position_embeddings)
            train_context_length = kwargs.get("max_position_embeddings", DEFAULT_MAX_POSITION_EMBEDDINGS)
        self.tau = tau
        self.tau_init = tau_init
        self.train_context_length = (
            DEFAULT_TRAIN_CONTEXT_LENGTH if train_context_length is None else train_context_length
        )
        self.gate_bias_init = gate_bias_init
        self.defaults_version = DEFAULTS_VERSION  # every field above is explicit now
        self.qk_norm_eps = qk_norm_eps
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        pop_removed_fields(
            kwargs, {"attention_kernel": "choose the path with attn_implementation ('eager' or 'sdpa')."}
        )
        if width_unit is None:
            # A saved config.json carries `transformers_version`; without `width_unit` it predates real widths.
            width_unit = "complex" if "transformers_version" in kwargs else "real"
        if width_unit == "complex":
            for field in ("hidden_size", "intermediate_size", "head_dim"):
                if isinstance(kwargs.get(field), int):
                    kwargs[field] *= 2
        elif width_unit != "real":
            raise ValueError(f"config field `width_unit`={width_unit!r} is invalid: expected 'real' or 'complex'.")
        self.width_unit = "real"
        super().__init__(**kwargs)

    @property
    def complex_hidden_size(self) -> int:
        """Complex features of the residual stream."""
        return self.hidden_size // 2

    @property
    def complex_head_dim(self) -> int:
        """Complex head dim d."""
        return self.head_dim // 2

    @property
    def complex_intermediate_size(self) -> int:
        """Complex width of the feed-forward layer."""
        return self.intermediate_size // 2

    field_rules = {
        **GeometricConfig.field_rules,
        # s_ij = tau cos(qn_i, kn_j): see LOGIT_SCALE_LIMIT (a number past it is inf once the model is half
        # precision; 1e308 is inf in float32 already, and inf * 0 = NaN in the gate)
        "tau": Rule(
            "float",
            positive=True,
            maximum=LOGIT_SCALE_LIMIT,
            choices=TAU_MODES,
            why="A larger temperature is inf in float16 (NaN gates); use 'log_learnable' to let training sharpen it.",
        ),
        "tau_init": Rule(
            "float",
            optional=True,
            positive=True,
            maximum=LOGIT_SCALE_LIMIT,
            why="A larger initial temperature is inf in float16 (NaN gates).",
        ),
        "train_context_length": Rule("int", minimum=1),
        "gate_bias_init": Rule("float", optional=True),
        "qk_norm_eps": Rule("float", positive=True),
        "attention_bias": Rule("bool"),
        "mlp_bias": Rule("bool"),
    }

    def _validate_family(self) -> None:
        for field in ("hidden_size", "head_dim", "intermediate_size"):
            if getattr(self, field) % 2:
                _fail(
                    field,
                    getattr(self, field),
                    "PCT widths count real features [re | im] of complex ones: use an even number.",
                )
        if self.attention_dropout != 0:
            _fail(
                "attention_dropout",
                self.attention_dropout,
                "PCT's sigmoid-attention kernels have no gate dropout; set attention_dropout=0.0.",
            )
        if self.tau_init is not None and self.tau not in LEARNABLE_TAU_MODES:
            _fail(
                "tau_init",
                self.tau_init,
                f"tau={self.tau!r} is fixed, so an initial value would be ignored: set tau='log_learnable' or "
                "'learnable', or tau_init=None.",
            )

    @property
    def learnable_tau(self) -> bool:
        """Whether tau is a trained parameter per head."""
        return self.tau in LEARNABLE_TAU_MODES

    @property
    def initial_tau(self) -> float:
        """tau at initialisation (the fixed value unless tau is learnable)."""
        if self.tau_init is not None:
            return float(self.tau_init)
        if self.tau == "log_learnable":
            return DEFAULT_TAU_INIT
        if self.tau == "inv_sqrt_d":
            return self.complex_head_dim**-0.5
        if self.tau in ("sqrt_d", "learnable"):
            return math.sqrt(self.complex_head_dim)
        return float(self.tau)


__all__ = ["PCTConfig"]
