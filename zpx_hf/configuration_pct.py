"""PCT configuration (model_type `pct`): complex Phase-Coherent Transformer with sigmoid attention."""

from __future__ import annotations

import math
from typing import Any

from .configuration_common import LOGIT_SCALE_LIMIT, GeometricConfig, Rule, _fail, pop_removed_fields

TAU_MODES = ("sqrt_d", "inv_sqrt_d", "learnable")


class PCTConfig(GeometricConfig):
    """Configuration of a PCT model (docs/design.md §4). Shared fields: see `GeometricConfig`.

    Widths count real features, as for every HF model (PEFT, DeepSpeed "auto" settings and serving engines
    size tensors by `hidden_size`): the residual stream holds `hidden_size / 2` complex numbers stored as
    `hidden_size` real values `[re | im]`; `head_dim` is the real head width `2d` of complex head dim
    `d = head_dim / 2`; `intermediate_size` is the real width of the feed-forward layer. All three must be
    even. Checkpoints saved before this convention (widths in complex features, no `width_unit` field)
    are converted when loaded.

    Args:
        tau: temperature of `s_ij = tau * Re<qn_i, kn_j>`: `"sqrt_d"` (default), `"inv_sqrt_d"`,
            `"learnable"` (one per head, initialised at sqrt(d)) or a fixed number in (0, 65504].
        gate_bias_init: initial value of the per-head gate bias `b_h` in `sigmoid(s_ij + b_h)`; `None`
            means `-log(max_position_embeddings)` (sigmoid attention recipe, arXiv 2409.04431).
        qk_norm_eps: epsilon of the complex L2 normalisation of queries and keys.
        attention_bias: complex biases on the q/k/v/o projections.
        mlp_bias: complex biases in the feed-forward layer.
        width_unit: `"real"` (default); `"complex"` reads `hidden_size`, `head_dim` and `intermediate_size` as
            complex counts (the convention of earlier checkpoints) and converts them.
    """

    model_type = "pct"

    def __init__(
        self,
        tau: str | float = "sqrt_d",
        gate_bias_init: float | None = None,
        qk_norm_eps: float = 1e-6,
        attention_bias: bool = False,
        mlp_bias: bool = False,
        width_unit: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.tau = tau
        self.gate_bias_init = gate_bias_init
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
            why="A larger temperature is inf in float16 (NaN gates); use 'learnable' to let training sharpen it.",
        ),
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

    @property
    def initial_tau(self) -> float:
        """tau at initialisation (the fixed value unless `tau="learnable"`)."""
        if self.tau == "inv_sqrt_d":
            return self.complex_head_dim**-0.5
        if self.tau in ("sqrt_d", "learnable"):
            return math.sqrt(self.complex_head_dim)
        return float(self.tau)


__all__ = ["PCTConfig"]
