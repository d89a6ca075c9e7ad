"""Versor configuration (model_type `versor`): Cl(4,1) multivector transformer with GPA and RRA mixers."""

from __future__ import annotations

from typing import Any

from .configuration_common import GeometricConfig, Rule, _fail, pop_removed_fields

VERSOR_MIXERS = ("gpa", "rra", "hybrid")
RRA_ACCUMULATE = ("compact", "full")
NUM_BLADES = 32


class VersorConfig(GeometricConfig):
    """Configuration of a Versor model (docs/design.md §5). Shared fields: see `GeometricConfig`.

    The hidden state is `hidden_size // 32` Cl(4,1) multivector channels; `head_dim` (default
    `hidden_size // num_attention_heads`) and `intermediate_size` must be multiples of 32 too.

    Args:
        mixer: sequence mixer of every layer: `"gpa"` (geometric product attention), `"rra"` (recursive
            rotor accumulator, O(1) state per token) or `"hybrid"` (RRA in even layers, GPA in odd ones:
            GPA has no positional encoding and gets order from the RRA below it).
        gpa_gamma_init: initial `gamma_h`, weight of the bivector norm in the GPA score.
        gpa_bivector: `False` keeps only the scalar part `<Q~K>_0` (runs through SDPA).
        gpa_eps: epsilon inside the bivector norm `sqrt(sum <P>_2^2 + eps)`.
        rra_accumulate: `"compact"` accumulates the 6 rotation bivectors (unitary state, stable for any
            length) and applies the 4 boost bivectors per token; `"full"` accumulates all 10 as in the paper
            (the state grows with accumulated boosts; fine for short contexts).
        rra_bivector_scale: per-token bivector coefficients are `scale * tanh(W x)`.

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
        if self.rotary != "none":
            _fail(
                "rotary",
                self.rotary,
                "Versor has no rotary positions (rotating multivector coefficients as pairs breaks the "
                "algebra); set rotary='none' and use mixer='rra' or 'hybrid' for order information.",
            )

    field_rules = {
        **GeometricConfig.field_rules,
        "mixer": Rule("choice", choices=VERSOR_MIXERS),
        "gpa_gamma_init": Rule("float"),
        "gpa_bivector": Rule("bool"),
        "gpa_eps": Rule("float", positive=True),
        "rra_accumulate": Rule("choice", choices=RRA_ACCUMULATE),
        "rra_bivector_scale": Rule("float", positive=True),
    }


__all__ = ["VersorConfig"]
