"""ZPX configuration (model_type `zpx`): angle-sphere attention with spiral rotary positions."""

from __future__ import annotations

from typing import Any

from .configuration_common import LOGIT_SCALE_LIMIT, GeometricConfig, Rule, _fail

# Fused softmax kernels (flash, cuDNN, paged, vLLM's) take head sizes that are multiples of 8.
ENGINE_HEAD_MULTIPLE = 8
_WHY = "Past the float16 maximum the score's weight is inf in a half-precision model (NaN attention)."


class ZPXConfig(GeometricConfig):
    """Configuration of a ZPX model (docs/design.md §3). Shared fields: see `GeometricConfig`.

    Args:
        phase_channels: phase channels `C` per head of the phase encoder.
        lambda_angle: weight of `mean_c cos(phi_i - phi_j)` in the attention score.
        lambda_sphere: weight of `mean_c <s_i, s_j>` (Riemann-sphere kernel). `|lambda_angle| + |lambda_sphere|`
            must stay <= 65504 (float16's maximum: past it the score is inf in a half-precision model).
        max_log_radius: `R` in `log_r = R tanh(W_r h / R)`.
        learnable_lambdas: per-head `lambda_angle` and `lambda_sphere` as trained parameters (`self_attn.
            lambda_angle_heads`, `lambda_sphere_heads` [H]) starting at the two values above. At 0 the model is
            softmax attention exactly and the weights still receive a gradient, so the geometric terms can grow
            from zero (the start of a converted Llama, `conversion_llama.py`).
        center_loss_weight: weight of the centre-cancellation loss added to the LM loss.
        attention_bias: biases on q/k/v/o projections.
        phase_bias: biases on the phase encoder's `to_log_r`, `to_theta`, `to_b`.
        mlp_bias: biases in the SwiGLU feed-forward layer.

    With `lambda_angle = lambda_sphere = 0` and `rotary="rope"` the model is a Llama-style
    transformer (the ablation baseline).
    """

    model_type = "zpx"
    # Tensor parallelism as Llama's: heads are independent, so q, k, v and the phase encoder (each output
    # [H, C] head-major, like q's [H, d]) split by heads (colwise), o_proj sums the heads' parts (rowwise); the
    # MLP as Llama's. No pipeline plan: the layers return (hidden, weights, phase) tuples and take the
    # backbone's position embeddings, padding mask and documents, not Llama's (hidden_states, attention_mask).
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.phase_encoder.to_log_r": "colwise",
        "layers.*.self_attn.phase_encoder.to_theta": "colwise",
        "layers.*.self_attn.phase_encoder.to_b": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        phase_channels: int = 8,
        lambda_angle: float = 1.0,
        lambda_sphere: float = 1.0,
        learnable_lambdas: bool = False,
        max_log_radius: float = 4.0,
        center_loss_weight: float = 0.0,
        attention_bias: bool = False,
        phase_bias: bool = True,
        mlp_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        self.phase_channels = phase_channels
        self.lambda_angle = lambda_angle
        self.lambda_sphere = lambda_sphere
        self.learnable_lambdas = learnable_lambdas
        self.max_log_radius = max_log_radius
        self.center_loss_weight = center_loss_weight
        self.attention_bias = attention_bias
        self.phase_bias = phase_bias
        self.mlp_bias = mlp_bias
        super().__init__(**kwargs)

    def _validate_family(self) -> None:
        # S_ij's geometric part lies in [-(|la| + |ls|), |la| + |ls|] (both kernels are in [-1, 1]): the sum must
        # stay within float16 too (measured: both at +65504 give NaN in float16 eager attention).
        if abs(self.lambda_angle) + abs(self.lambda_sphere) > LOGIT_SCALE_LIMIT:
            _fail(
                "lambda_angle",
                self.lambda_angle,
                f"|lambda_angle| + |lambda_sphere| (lambda_sphere={self.lambda_sphere!r}) must be <= "
                f"{LOGIT_SCALE_LIMIT:g}, the float16 maximum: the score's angle and sphere terms add up to it.",
            )

    @property
    def engine_head_dim(self) -> int:
        """The head size a softmax engine computes ZPX with, and so the width of its KV cache: q^ and k^ are
        `d + 5C` wide ([k, cos phi, sin phi, s]), zero-padded with the values to a multiple of
        `ENGINE_HEAD_MULTIPLE`. (`head_dim` stays d, the width of q, k and v.)"""
        return -(-(self.head_dim + 5 * self.phase_channels) // ENGINE_HEAD_MULTIPLE) * ENGINE_HEAD_MULTIPLE

    field_rules = {
        **GeometricConfig.field_rules,
        "phase_channels": Rule("int", minimum=1),
        # held in the fast form's query features (lambda / C) cos phi, (lambda / C) s: see LOGIT_SCALE_LIMIT
        "lambda_angle": Rule("float", minimum=-LOGIT_SCALE_LIMIT, maximum=LOGIT_SCALE_LIMIT, why=_WHY),
        "lambda_sphere": Rule("float", minimum=-LOGIT_SCALE_LIMIT, maximum=LOGIT_SCALE_LIMIT, why=_WHY),
        "learnable_lambdas": Rule("bool"),
        "max_log_radius": Rule("float", positive=True),
        "center_loss_weight": Rule("float", minimum=0.0),
        "attention_bias": Rule("bool"),
        "phase_bias": Rule("bool"),
        "mlp_bias": Rule("bool"),
    }


__all__ = ["ENGINE_HEAD_MULTIPLE", "ZPXConfig"]
