"""ZPX models: Llama-style decoder blocks whose attention adds the angle and Riemann-sphere kernels.

`ZPXModel` (backbone), `ZPXForCausalLM` (generation, KV cache, centre-cancellation loss) and
`ZPXForSequenceClassification`. The attention path follows `config._attn_implementation`:
`"eager"` is the materialised reference, `"sdpa"` the exact augmented-head-dim form (see
`ops_zpx.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
)

from .configuration_zpx import ZPXConfig
from .modeling_blocks import (
    CACHE_FIELD,
    ForCausalLMHead,
    ForSequenceClassificationHead,
    GeometricPreTrainedModel,
    RMSNorm,
    SwiGLUMLP,
    build_attention_mask,
    check_inputs,
    default_position_ids,
    pop_cache_kwarg,
    resolve_forward_flags,
    uses_is_causal,
)
from .ops_zpx import (
    ZPX_ATTENTION_FUNCTIONS,
    PhaseState,
    center_cancellation_loss,
    phase_coordinates,
    phase_key_features,
    phase_tensor,
)
from .rotary_srpe import apply_rotary, build_rotary


@dataclass
class ZPXModelOutputWithPast(BaseModelOutputWithPast):
    """Adds `phases` (per layer Phi [B, L, H, C, 7]) and `center_loss` (mean over layers); both are
    computed when `output_phases=True`, and `center_loss` also whenever `center_loss_weight > 0`."""

    phases: tuple[torch.Tensor, ...] | None = None
    center_loss: torch.Tensor | None = None


@dataclass
class ZPXCausalLMOutputWithPast(CausalLMOutputWithPast):
    """`loss` = LM loss + `center_loss_weight * center_loss` when labels are given."""

    phases: tuple[torch.Tensor, ...] | None = None
    center_loss: torch.Tensor | None = None


class ZPXPhaseEncoder(nn.Module):
    """Vector phase per head and channel from the layer input (names follow the seed)."""

    def __init__(self, config: ZPXConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.phase_channels = config.phase_channels
        self.max_log_radius = config.max_log_radius
        width = config.num_attention_heads * config.phase_channels
        self.to_log_r = nn.Linear(config.hidden_size, width, bias=config.phase_bias)
        self.to_theta = nn.Linear(config.hidden_size, width, bias=config.phase_bias)
        self.to_b = nn.Linear(config.hidden_size, width, bias=config.phase_bias)

    def forward(self, hidden_states: torch.Tensor) -> PhaseState:
        batch, length = hidden_states.shape[:2]

        def heads(x: torch.Tensor) -> torch.Tensor:  # [B, L, H*C] -> [B, H, L, C]
            return x.view(batch, length, self.num_heads, self.phase_channels).transpose(1, 2)

        return phase_coordinates(
            heads(self.to_log_r(hidden_states)),
            heads(self.to_theta(hidden_states)),
            heads(self.to_b(hidden_states)),
            self.max_log_radius,
        )


class ZPXAttention(nn.Module):
    """Multi-head angle-sphere attention; the KV cache stores augmented keys k^ = [k, cos, sin, s]."""

    def __init__(self, config: ZPXConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.is_causal = config.causal
        inner = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=config.attention_bias)
        self.phase_encoder = ZPXPhaseEncoder(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, PhaseState]:
        batch, length = hidden_states.shape[:2]
        hidden_shape = (batch, length, self.num_heads, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        if position_embeddings is not None:
            cos, sin = position_embeddings
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)

        phase = self.phase_encoder(hidden_states)
        features = phase_key_features(phase).to(query.dtype)  # [B, H, L, 5C]
        key_aug = torch.cat((key, features), dim=-1)
        if past_key_values is not None:
            key_aug, value = past_key_values.update(key_aug, value, self.layer_idx)

        implementation = self.config._attn_implementation or "sdpa"
        if implementation not in ZPX_ATTENTION_FUNCTIONS:
            raise ValueError(
                f"`attn_implementation`={implementation!r} is not available for ZPX; use one of "
                f"{sorted(ZPX_ATTENTION_FUNCTIONS)} (sdpa already runs FlashAttention-class kernels)."
            )
        attention = ZPX_ATTENTION_FUNCTIONS[implementation]
        output, weights = attention(
            query,
            key_aug,
            value,
            features,
            attention_mask,
            is_causal=uses_is_causal(attention_mask, self.is_causal, length),
            scaling=self.scaling,
            lambda_angle=self.config.lambda_angle,
            lambda_sphere=self.config.lambda_sphere,
            dropout=self.config.attention_dropout,
            training=self.training,
        )
        output = self.o_proj(output.reshape(batch, length, -1))
        return output, weights, phase


class ZPXDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: ZPXConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = ZPXAttention(config, layer_idx)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        past_key_values: Cache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, PhaseState]:
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, weights, phase = self.self_attn(
            hidden_states, position_embeddings, attention_mask, past_key_values=past_key_values
        )
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states, weights, phase


class ZPXPreTrainedModel(GeometricPreTrainedModel):
    config_class = ZPXConfig
    _no_split_modules = ["ZPXDecoderLayer"]
    remote_code_auto_map = {
        "AutoConfig": "configuration_zpx.ZPXConfig",
        "AutoModel": "modeling_zpx.ZPXModel",
        "AutoModelForCausalLM": "modeling_zpx.ZPXForCausalLM",
        "AutoModelForSequenceClassification": "modeling_zpx.ZPXForSequenceClassification",
    }


class ZPXModel(ZPXPreTrainedModel):
    def __init__(self, config: ZPXConfig) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([ZPXDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = build_rotary(config)
        self.feature_size = config.hidden_size
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_phases: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> ZPXModelOutputWithPast | tuple:
        past_key_values = pop_cache_kwarg(past_key_values, kwargs)
        output_attentions, output_hidden_states, return_dict, use_cache = resolve_forward_flags(
            self, output_attentions, output_hidden_states, return_dict, use_cache
        )
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        check_inputs(self.config, input_ids, inputs_embeds, attention_mask, past_length)

        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        batch, length = inputs_embeds.shape[:2]
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, past_length, length, inputs_embeds.device)
        mask = build_attention_mask(
            attention_mask, batch, length, past_length + length, self.config.causal, inputs_embeds.device
        )
        position_embeddings = None
        if self.rotary_emb is not None:
            position_embeddings = self.rotary_emb(inputs_embeds, position_ids)
        token_mask = attention_mask[:, past_length:] if attention_mask is not None else None

        hidden_states = inputs_embeds
        all_hidden_states = () if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_phases = () if output_phases else None
        # The centre term costs a reduction per layer: only computed when it is used or asked for.
        want_center = bool(output_phases) or self.config.center_loss_weight > 0
        center_loss = hidden_states.new_zeros((), dtype=torch.float32) if want_center else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states, weights, phase = layer(
                hidden_states,
                attention_mask=mask,
                position_embeddings=position_embeddings,
                past_key_values=past_key_values,
            )
            if want_center:
                center_loss = center_loss + center_cancellation_loss(phase, token_mask)
            if output_attentions:
                all_attentions += (weights,)
            if output_phases:
                # [B, H, L, C, 7] -> [B, L, H, C, 7]
                all_phases += (phase_tensor(phase).transpose(1, 2),)
        hidden_states = self.norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)
        if want_center:
            center_loss = center_loss / len(self.layers)

        output = ZPXModelOutputWithPast(
            last_hidden_state=hidden_states,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            phases=all_phases,
            center_loss=center_loss,
            **{CACHE_FIELD: past_key_values if use_cache else None},
        )
        return output if return_dict else output.to_tuple()


class ZPXForCausalLM(ForCausalLMHead, ZPXPreTrainedModel, GenerationMixin):
    """LM head on `ZPXModel`; `loss` = next-token CE + `center_loss_weight * center_loss`."""

    backbone_class = ZPXModel
    output_class = ZPXCausalLMOutputWithPast

    def auxiliary_loss(self, outputs: ZPXModelOutputWithPast) -> torch.Tensor | None:
        return _weighted_center_loss(self.config, outputs)

    def extra_outputs(self, outputs: ZPXModelOutputWithPast) -> dict[str, Any]:
        return {"phases": outputs.phases, "center_loss": outputs.center_loss}


class ZPXForSequenceClassification(ForSequenceClassificationHead, ZPXPreTrainedModel):
    """Classifies from the last real token's features; adds the weighted centre term to the loss."""

    backbone_class = ZPXModel

    def auxiliary_loss(self, outputs: ZPXModelOutputWithPast) -> torch.Tensor | None:
        return _weighted_center_loss(self.config, outputs)


def _weighted_center_loss(config: ZPXConfig, outputs: ZPXModelOutputWithPast) -> torch.Tensor | None:
    if config.center_loss_weight > 0:
        return config.center_loss_weight * outputs.center_loss
    return None


__all__ = [
    "ZPXPreTrainedModel",
    "ZPXModel",
    "ZPXForCausalLM",
    "ZPXForSequenceClassification",
    "ZPXPhaseEncoder",
    "ZPXAttention",
]
