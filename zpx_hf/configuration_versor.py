"""Versor configuration (model_type `versor`): Cl(4,1) multivector transformer with GPA and RRA mixers."""

from __future__ import annotations

import math
from typing import Any

from .configuration_common import LOGIT_SCALE_LIMIT, GeometricConfig, Rule, _fail, pop_removed_fields

VERSOR_MIXERS = ("gpa", "rra", "hybrid")
RRA_ACCUMULATE = ("compact", "full")
NUM_BLADES = 32
NUM_GRADES = 6

# Per-token boost (both modes): B_t = s tanh(W x_t) has 4 boost coefficients, each |.| <= s, so its rapidity is
# |A_t| <= 2s; the sandwich T v ~T scales v by up to e^{|A_t|} = e^{2s} and the next grade norm squares it:
# e^{4s} must stay below the float32 maximum e^{88.7}, so s < 22.2 (measured with saturated tanh: finite at
# s = 20, NaN from s = 22). 20 leaves e^8 for |v| and the output projection.
RRA_SCALE_LIMIT = 20.0
# "full" accumulates the boosts. At initialisation every RRA layer reads a grade-normed stream (each of the 6
# grades of each of the H/32 channels has unit norm: |x|^2 = 6H/32) through weights N(0, sigma^2) and zero
# bias, so the coefficients have RMS rho <= s min(1, sigma sqrt(6H/32)) (tanh^2 <= min(1, u^2)). Over random
# tokens the accumulated boost grows like a random walk, rho sqrt(t): measured (7 configs, sigma 0.01-0.2,
# H 128-256, s 0.5-5) the state leaves float32 (NaN) at rho sqrt(t) = 4.3-5.5 (the s = 2: t = 671-769;
# s = 5: t = 126-132). Limit rho sqrt(max_position_embeddings) <= 2.5: under half the first NaN, so a full
# context is > 3x shorter than the first NaN. Repeated tokens align the boosts (linear growth, NaN at
# rho t = 16 = ln(1 / eps_float32)): no scale keeps "full" finite on every input of every length.
RRA_FULL_GROWTH_LIMIT = 2.5


class VersorConfig(GeometricConfig):
    """Configuration of a Versor model (docs/design.md §5). Shared fields: see `GeometricConfig`.

    The hidden state is `hidden_size // 32` Cl(4,1) multivector channels; `head_dim` (default
    `hidden_size // num_attention_heads`) and `intermediate_size` must be multiples of 32 too.

    Args:
        mixer: sequence mixer of every layer: `"gpa"` (geometric product attention), `"rra"` (recursive
            rotor accumulator, O(1) state per token) or `"hybrid"` (RRA in even layers, GPA in odd ones:
            GPA has no positional encoding and gets order from the RRA below it).
            `num_key_value_heads` (grouped-query attention) applies to GPA layers; RRA has no keys or values, so
            `mixer="rra"` refuses a value other than `num_attention_heads` and hybrid's RRA layers ignore it.
        gpa_gamma_init: initial `gamma_h`, weight of the bivector norm in the GPA score; |value| <= 65504.
        gpa_bivector: `False` keeps only the scalar part `<Q~K>_0` (runs through SDPA).
        gpa_eps: epsilon inside the bivector norm `sqrt(sum <P>_2^2 + eps)`.
        rra_accumulate: `"compact"` accumulates the 6 rotation bivectors (unitary state, stable for any
            length) and applies the 4 boost bivectors per token; `"full"` accumulates all 10 as in the paper
            (the state grows with accumulated boosts; fine for short contexts).
        rra_bivector_scale: per-token bivector coefficients are `scale * tanh(W x)`; at most 20 (a per-token
            boost multiplies values by up to e^(2 scale)). With `"full"`, also
            `scale * min(1, initializer_range * sqrt(6 hidden_size / 32)) * sqrt(max_position_embeddings) <= 2.5`,
            so the accumulated boosts stay in float32 over the context at initialisation (`RRA_FULL_GROWTH_LIMIT`).

    `rotary` must be `"none"`: Versor has no positional encoding (order comes from the RRA and the causal
    mask).
    """

    model_type = "versor"

    def __init__(
        self,
        mixer: str = "hybrid",
        gpa_gamma_init: float = 0.1,
        gpa_bivector: bool = True,
        gpa_eps: float = 1e-6,
        rra_accumulate: str = "compact",
        rra_bivector_scale: float = 1.0,
        **kwargs: Any,
    ) -> None:
        self.mixer = mixer
        self.gpa_gamma_init = gpa_gamma_init
        self.gpa_bivector = gpa_bivector
        self.gpa_eps = gpa_eps
        self.rra_accumulate = rra_accumulate
        self.rra_bivector_scale = rra_bivector_scale
        advice = "choose the path with attn_implementation ('eager': references, 'sdpa': fast paths)."
        pop_removed_fields(kwargs, {"gpa_kernel": advice, "rra_kernel": advice})
        kwargs.setdefault("rotary", "none")
        kwargs.setdefault("hidden_size", 128)
        kwargs.setdefault("intermediate_size", 256)
        kwargs.setdefault("num_attention_heads", 2)
        super().__init__(**kwargs)

    @property
    def num_channels(self) -> int:
        return self.hidden_size // NUM_BLADES

    @property
    def head_channels(self) -> int:
        return self.head_dim // NUM_BLADES

    def layer_mixer(self, layer_idx: int) -> str:
        if self.mixer == "hybrid":
            return "rra" if layer_idx % 2 == 0 else "gpa"
        return self.mixer

    def _validate_family(self) -> None:
        for field in ("hidden_size", "head_dim", "intermediate_size"):
            value = getattr(self, field)
            if value % NUM_BLADES != 0:
                _fail(
                    field,
                    value,
                    f"Versor features are Cl(4,1) multivectors of 32 coefficients; use a multiple of 32 "
                    f"(e.g. {max(NUM_BLADES, value // NUM_BLADES * NUM_BLADES)}).",
                )
        if self.mixer == "rra" and self.num_key_value_heads != self.num_attention_heads:
            _fail(
                "num_key_value_heads",
                self.num_key_value_heads,
                f"mixer='rra' has no keys or values to group (its rotor recurrence keeps one state per head); leave "
                f"it unset or equal to num_attention_heads={self.num_attention_heads}, or use mixer='gpa' or "
                "'hybrid' (whose GPA layers group their keys and values; RRA layers ignore the field).",
            )
        if self.rra_accumulate == "full" and self.mixer != "gpa":
            self._check_full_accumulation()
        if self.rotary != "none":
            _fail(
                "rotary",
                self.rotary,
                "Versor has no rotary positions (rotating multivector coefficients as pairs breaks the "
                "algebra); set rotary='none' and use mixer='rra' or 'hybrid' for order information.",
            )

    def _check_full_accumulation(self) -> None:
        """`"full"` must stay finite over `max_position_embeddings` random tokens at initialisation (see
        `RRA_FULL_GROWTH_LIMIT`)."""
        input_std = self.initializer_range * math.sqrt(NUM_GRADES * self.hidden_size / NUM_BLADES)
        per_scale = min(1.0, input_std) * math.sqrt(self.max_position_embeddings)
        if self.rra_bivector_scale * per_scale > RRA_FULL_GROWTH_LIMIT:
            _fail(
                "rra_bivector_scale",
                self.rra_bivector_scale,
                f'rra_accumulate="full" accumulates boosts, which leave float32 (NaN) at initialisation within '
                f"max_position_embeddings={self.max_position_embeddings} tokens at this scale (initializer_range="
                f'{self.initializer_range}, hidden_size={self.hidden_size}); use rra_accumulate="compact" (stable at '
                f"any length), rra_bivector_scale <= {RRA_FULL_GROWTH_LIMIT / per_scale:.3g}, or a smaller "
                "max_position_embeddings or initializer_range.",
            )

    field_rules = {
        **GeometricConfig.field_rules,
        "mixer": Rule("choice", choices=VERSOR_MIXERS),
        # the GPA score's bivector weight, a parameter in the model dtype: see LOGIT_SCALE_LIMIT
        "gpa_gamma_init": Rule(
            "float",
            minimum=-LOGIT_SCALE_LIMIT,
            maximum=LOGIT_SCALE_LIMIT,
            why="Past the float16 maximum gamma is inf in a half-precision model (NaN scores).",
        ),
        "gpa_bivector": Rule("bool"),
        "gpa_eps": Rule("float", positive=True),
        "rra_accumulate": Rule("choice", choices=RRA_ACCUMULATE),
        "rra_bivector_scale": Rule(
            "float",
            positive=True,
            maximum=RRA_SCALE_LIMIT,
            why="A per-token boost of scale s multiplies values by up to e^(2s): past 20 they overflow float32.",
        ),
    }


__all__ = ["VersorConfig"]
