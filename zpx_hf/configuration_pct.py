"""PCT configuration (model_type `pct`): complex Phase-Coherent Transformer with sigmoid attention."""

from __future__ import annotations

import math
from typing import Any

from .configuration_common import GeometricConfig, Rule, _fail, check_field, pop_removed_fields

TAU_MODES = ("sqrt_d", "inv_sqrt_d", "learnable")


class PCTConfig(GeometricConfig):
    """Configuration of a PCT model (SPEC §3). Shared fields: see `GeometricConfig`.

    Widths are counted in complex features: the residual stream holds `hidden_size` complex numbers,
    stored as `2 * hidden_size` real values `[re | im]`; `head_dim` is the complex head dim `d` (the
    attention kernel works on the real head dim `2d`); `intermediate_size` is the complex width of the
    feed-forward layer.

    Args:
        tau: temperature of `s_ij = tau * Re<qn_i, kn_j>`: `"sqrt_d"` (default), `"inv_sqrt_d"`,
            `"learnable"` (one per head, initialised at sqrt(d)) or a fixed positive number.
        gate_bias_init: initial value of the per-head gate bias `b_h` in `sigmoid(s_ij + b_h)`; `None`
            means `-log(max_position_embeddings)` (sigmoid attention recipe, arXiv 2409.04431).
        qk_norm_eps: epsilon of the complex L2 normalisation of queries and keys.
        attention_bias: complex biases on the q/k/v/o projections.
        mlp_bias: complex biases in the feed-forward layer.
    """

    model_type = "pct"

    def __init__(
        self,
        tau: str | float = "sqrt_d",
        gate_bias_init: float | None = None,
        qk_norm_eps: float = 1e-6,
        attention_bias: bool = False,
        mlp_bias: bool = False,
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
        super().__init__(**kwargs)

    @property
    def rotary_dim(self) -> int:
        """Complex features rotate one pair each: [re | im] of head dim d gives 2d real features."""
        return 2 * self.head_dim

    field_rules = {
        **GeometricConfig.field_rules,
        "gate_bias_init": Rule("float", optional=True),
        "qk_norm_eps": Rule("float", positive=True),
        "attention_bias": Rule("bool"),
        "mlp_bias": Rule("bool"),
    }

    def _validate_family(self) -> None:
        if isinstance(self.tau, str):
            check_field("tau", self.tau, Rule("choice", choices=TAU_MODES))
        else:
            check_field("tau", self.tau, Rule("float", positive=True))
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
            return self.head_dim**-0.5
        if self.tau in ("sqrt_d", "learnable"):
            return math.sqrt(self.head_dim)
        return float(self.tau)


__all__ = ["PCTConfig"]
