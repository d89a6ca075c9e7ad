"""ZPX models: Llama-style decoder blocks whose attention adds the angle and Riemann-sphere kernels.

The family contributes its config, `ZPXAttention` (phase encoder + angle-sphere attention) and its
outputs (`phases`, `center_loss`); the backbone and heads are the shared ones of `modeling_common.py`.
Attention runs through the shared `ALL_ATTENTION_FUNCTIONS` (`modeling_common.ATTENTION_KERNELS`) into the op's
one entry `ops_zpx.zpx_attention` (`ZPXAttention.attention_op`): `"eager"` runs its `naive` kernel (the
term-by-term formula), `"sdpa"` its `"auto"` choice (the exact augmented-head-dim SDPA form, or the one-token
`decode` step); a softmax engine's name runs the engine on q^, k^, v (`ZPXAttention.engine_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as hf_init
from transformers.cache_utils import Cache
from transformers.masking_utils import create_causal_mask, packed_sequence_mask_function
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_zpx import ZPXConfig
from .modeling_blocks import (
    RMSNorm,
    SwiGLUMLP,
    derived_weights_kept,
    kept_linear,
    plain_linears,
    stacked_linear,
)
from .modeling_common import (
    ALL_ATTENTION_FUNCTIONS,
    ATTENTION_IMPLEMENTATIONS,
    ForCausalLMHead,
    ForSequenceClassificationHead,
    GeometricDecoderLayer,
    GeometricModel,
    GeometricPreTrainedModel,
    attention_implementation,
    eager_attention_forward,
    trim_static_cache,
)
from .ops_zpx import (
    PHASE_FEATURES,
    PhaseState,
    augment_query,
    center_cancellation_loss,
    phase_from_stacked,
    phase_key_features,
    phase_tensor,
    resolve_kernel,
    zpx_attention,
)
from .rotary_srpe import apply_rotary

# Engines that read no mask function, only a padding mask (packed rows need their varlen metadata instead).
MASK_FREE_ENGINES = ("flash_attention",)


def engine_attention_mask(
    config: ZPXConfig,
    implementation: str,
    hidden_states: torch.Tensor,
    padding_mask: torch.Tensor | None,
    past_key_values: Cache | None,
    layer_idx: int,
    document_ids: torch.Tensor | None,
) -> Any:
    """A softmax engine's own mask (`create_causal_mask`) for this step, packed documents included: a pair
    counts only inside one document, as on the family's path. Engines that build no mask from a mask function
    (flash, hub kernels) would attend across documents, so packed rows are refused there."""
    if document_ids is None:
        return create_causal_mask(config, hidden_states, padding_mask, past_key_values, layer_idx=layer_idx)
    engine = implementation.split("|")[-1]
    if engine.startswith(MASK_FREE_ENGINES) or "/" in engine:
        raise ValueError(
            f"packed rows (several documents per row: position_ids restarting at 0, or cu_seq_lens) cannot run "
            f"ZPX through attn_implementation={implementation!r}, which takes no document mask and would attend "
            "across documents; use 'sdpa' (ZPX's own kernels handle documents) or 'flex_attention'."
        )
    return create_causal_mask(
        config,
        hidden_states,
        padding_mask,
        past_key_values,
        layer_idx=layer_idx,
        and_mask_function=packed_sequence_mask_function(document_ids),
    )


@dataclass
class ZPXModelOutputWithPast(BaseModelOutputWithPast):
    """Adds `phases` (per layer Phi [B, L, Hkv, C, 7]: one phase per key-value head) and `center_loss` (mean
    over layers); both are computed when `output_phases=True`, and `center_loss` also whenever
    `center_loss_weight > 0`."""

    phases: tuple[torch.Tensor, ...] | None = None
    center_loss: torch.Tensor | None = None


@dataclass
class ZPXCausalLMOutputWithPast(CausalLMOutputWithPast):
    """`loss` = LM loss + `center_loss_weight * center_loss` when labels are given."""

    phases: tuple[torch.Tensor, ...] | None = None
    center_loss: torch.Tensor | None = None


def pad_content_only_keys(cache: Cache, layer_idx: int, width: int) -> None:
    """Keys placed in the cache by other tools (PEFT prefix tuning) have the content width d, not d + 5C:
    give them zero phase features, so their angle and sphere terms vanish and only q.k scores them."""
    layers = getattr(cache, "layers", None)
    if layers is None or layer_idx >= len(layers):
        return
    layer = layers[layer_idx]
    keys = getattr(layer, "keys", None)
    if isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.shape[-1] < width:
        layer.keys = F.pad(keys, (0, width - keys.shape[-1]))


class ZPXPhaseEncoder(nn.Module):
    """Vector phase per key-value head and channel from the layer input (names follow the source design,
    docs/design.md §3.1); a grouped model's query heads share their key-value head's phase (§3.8)."""

    def __init__(self, config: ZPXConfig) -> None:
        super().__init__()
        self.num_heads = config.num_key_value_heads
        self.phase_channels = config.phase_channels
        self.max_log_radius = config.max_log_radius
        width = config.num_key_value_heads * config.phase_channels
        self.to_log_r = nn.Linear(config.hidden_size, width, bias=config.phase_bias)
        self.to_theta = nn.Linear(config.hidden_size, width, bias=config.phase_bias)
        self.to_b = nn.Linear(config.hidden_size, width, bias=config.phase_bias)

    @property
    def encoders(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        return (self.to_log_r, self.to_theta, self.to_b)

    def forward(self, hidden_states: torch.Tensor) -> PhaseState:
        """PhaseState [B, L, Hkv, C] (token-major: the 5C key features are transposed once, not each field)."""
        encoders = self.encoders
        if plain_linears(encoders):
            # One matmul for the three encoders, rows [W_r; W_theta; W_b] -> [B, L, 3HC]: on a decoding step
            # a matmul call costs far more than concatenating these small weights.
            pre = stacked_linear(hidden_states, encoders)
        else:  # wrapped (LoRA, quantised) or hooked encoders run as themselves
            pre = torch.cat([encoder(hidden_states) for encoder in encoders], dim=-1)
        return self.phase_from_pre_activations(pre)

    def phase_from_pre_activations(self, pre: torch.Tensor) -> PhaseState:
        """PhaseState from [W_r h | W_theta h | W_b h] [B, L, 3 Hkv C]."""
        # heads from the width (-1): a tensor-parallel rank holds its own heads' channels (`base_model_tp_plan`)
        return phase_from_stacked(pre.unflatten(-1, (3, -1, self.phase_channels)), self.max_log_radius, 2)


class ZPXAttention(nn.Module):
    """Multi-head angle-sphere attention, grouped-query when `num_key_value_heads` < `num_attention_heads` (as
    Llama's: k, v and the phase per key-value head); the KV cache stores augmented keys k^ = [k, cos, sin, s]."""

    def __init__(self, config: ZPXConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        # read by transformers' attention functions (repeat_kv / enable_gqa) on the softmax-engine path, as Llama's
        self.num_key_value_groups = config.num_key_value_groups
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.is_causal = config.causal
        self.lambda_angle = config.lambda_angle
        self.lambda_sphere = config.lambda_sphere
        self.learnable_lambdas = config.learnable_lambdas
        if config.learnable_lambdas:  # per head, from the config's values (`_init_weights`); see `head_lambdas`
            self.lambda_angle_heads = nn.Parameter(torch.full((self.num_heads,), float(config.lambda_angle)))
            self.lambda_sphere_heads = nn.Parameter(torch.full((self.num_heads,), float(config.lambda_sphere)))
        self.attention_dropout = config.attention_dropout
        inner = self.num_heads * self.head_dim
        key_inner = self.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, key_inner, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, key_inner, bias=config.attention_bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=config.attention_bias)
        self.phase_encoder = ZPXPhaseEncoder(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        padding_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        kv_length: int | None = None,
        document_ids: torch.Tensor | None = None,
        **attention_kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, PhaseState]:
        batch, length = hidden_states.shape[:2]
        implementation = attention_implementation(self.config, output_attentions, engines=True)
        engine = implementation not in ATTENTION_IMPLEMENTATIONS
        engine_mask = None
        if engine:  # the engine's own mask, from the padding mask, the documents and the cache before this step
            engine_mask = engine_attention_mask(
                self.config, implementation, hidden_states, padding_mask, past_key_values, self.layer_idx, document_ids
            )
        hidden_shape = (batch, length, -1, self.head_dim)
        fused = self.fused_projections(hidden_states)
        if fused is None:
            query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            if position_embeddings is not None:
                cos, sin = position_embeddings
                query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
            phase = self.phase_encoder(hidden_states)
        else:
            query, key, value, pre = self.split_fused(fused, hidden_shape, position_embeddings)
            phase = self.phase_encoder.phase_from_pre_activations(pre)
        features = phase_key_features(phase).transpose(1, 2)  # [B, Hkv, L, 5C]
        if features.dtype != query.dtype:  # half precision: the phase is computed in float32
            features = features.to(query.dtype)
        key = torch.cat((key, features), dim=-1)  # k^ = [k, cos, sin, s]
        # The queries' side of the phase terms: query head h uses its key-value head's phase (h // group) at its
        # own token, a per-query-head tensor like q itself (heads from the shapes: a tensor-parallel rank's own).
        group = query.shape[1] // features.shape[1]
        features = features if group == 1 else features.repeat_interleave(group, dim=1)
        if past_key_values is not None:
            pad_content_only_keys(past_key_values, self.layer_idx, key.shape[-1])
            key, value = past_key_values.update(key, value, self.layer_idx)
            key, value = trim_static_cache(key, value, kv_length)

        if engine:  # S = scaling q^ . k^ (q^'s phase terms carry 1 / scaling), all zero-padded to one head size
            query, key, value = self.engine_inputs(query, key, value, features)
            attention_mask = engine_mask
        else:  # the family's kernels: q, k^, v, the padding mask, the queries' phase features, documents
            attention_mask = padding_mask
            attention_kwargs = {**attention_kwargs, "query_features": features, "document_ids": document_ids}
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.attention_dropout if self.training else 0.0,
            **attention_kwargs,
        )
        # [B, Lq, H, width] (an engine's may come flat, [tokens, H * width]; H this rank's heads); padding dropped
        output = output.reshape(batch, length, query.shape[1], -1)[..., : self.head_dim].reshape(batch, length, -1)
        projected = kept_linear(output, (self.o_proj,))  # decoding on CPU (see `kept_linear`)
        output = projected if projected is not None else self.o_proj(output)
        return output, weights, phase

    def attention_op(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        *,
        kernel: str,
        scaling: float,
        query_features: torch.Tensor,
        dropout: float = 0.0,
        document_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The op of the family's own implementations: q [B, H, Lq, d], k^ [B, Hkv, Lk, d + 5C], v [B, Hkv, Lk, d],
        the padding mask [B, Lk] bool (or None) and the queries' phase features [B, H, Lq, 5C]; the lambdas and
        causality from the module. Other kwargs (a softmax engine's metadata) are not the family's."""
        lambda_angle, lambda_sphere = self.lambda_angle, self.lambda_sphere
        if self.learnable_lambdas:
            query_features, lambda_angle, lambda_sphere = self.head_lambdas(
                query_features, resolve_kernel(kernel, query, dropout)
            )
        return zpx_attention(
            query,
            key,
            value,
            query_features,
            key_padding_mask=key_padding_mask,
            causal=self.is_causal,
            scaling=scaling,
            lambda_angle=lambda_angle,
            lambda_sphere=lambda_sphere,
            dropout=dropout,
            document_ids=document_ids,
            kernel=kernel,
        )

    def head_lambdas(self, query_features: torch.Tensor, kernel: str) -> tuple[torch.Tensor, Any, Any]:
        """The learned per-head lambdas in the form `kernel` takes: `(query_features, lambda_angle, lambda_sphere)`.

        The term-by-term `naive` kernel broadcasts lambda [H, 1, 1] over its [B, H, Lq, Lk] angle and sphere terms;
        the others read the query's phase features only linearly (q^ = [q, (la/C) cos phi, (la/C) sin phi, (ls/C) s]),
        so the features are scaled per head ([la_h] * 2C + [ls_h] * 3C) and the kernel's lambdas are 1."""
        angle, sphere = self.lambda_angle_heads, self.lambda_sphere_heads
        if angle.shape[0] != query_features.shape[1]:  # a rank holding some heads (tensor parallelism) has all lambdas
            raise ValueError(
                f"learnable_lambdas: {angle.shape[0]} per-head lambdas for {query_features.shape[1]} query heads; "
                "the tensor-parallel plan does not shard the per-head lambdas, so load this model without tp_plan."
            )
        if kernel == "naive":
            return query_features, angle[:, None, None], sphere[:, None, None]
        channels = query_features.shape[-1] // PHASE_FEATURES
        gains = torch.cat((angle[:, None].expand(-1, 2 * channels), sphere[:, None].expand(-1, 3 * channels)), -1)
        return query_features * gains[:, None, :].to(query_features.dtype), 1.0, 1.0

    def engine_inputs(
        self, query: torch.Tensor, key_aug: torch.Tensor, value: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a softmax engine computes ZPX from, with the standard `scaling` = 1/sqrt(d): S = scaling q^ . k^
        exactly, for q^ = [q, (la / (C scaling)) cos phi, (la / (C scaling)) sin phi, (ls / (C scaling)) s] and
        k^ = [k, cos, sin, s]; q^, k^ and v zero-padded to `config.engine_head_dim` (zero columns add nothing to
        q^ . k^ and give zero outputs, dropped by the caller)."""
        lambda_angle, lambda_sphere = self.lambda_angle, self.lambda_sphere
        if self.learnable_lambdas:
            features, lambda_angle, lambda_sphere = self.head_lambdas(features, "engine")
        query_aug = augment_query(query, features, 1.0, lambda_angle / self.scaling, lambda_sphere / self.scaling)
        width = self.config.engine_head_dim
        query_aug, key_aug, value = (
            x if x.shape[-1] == width else F.pad(x, (0, width - x.shape[-1])) for x in (query_aug, key_aug, value)
        )
        return query_aug, key_aug, value

    def split_fused(
        self,
        fused: torch.Tensor,
        hidden_shape: tuple[int, ...],
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v [B, heads, L, d], the phase pre-activations) from `fused_projections`' output."""
        batch, length = fused.shape[:2]
        inner, key_inner = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        if inner != key_inner:  # grouped: q and k have different head counts, rotated one by one
            sizes = (inner, key_inner, key_inner, fused.shape[-1] - inner - 2 * key_inner)
            query, key, value, pre = fused.split_with_sizes(sizes, -1)
            query, key = (x.view(hidden_shape).transpose(1, 2) for x in (query, key))
            if position_embeddings is not None:
                query, key = (apply_rotary(x, *position_embeddings) for x in (query, key))
            return query, key, value.view(hidden_shape).transpose(1, 2), pre
        query_key, value, pre = fused.split_with_sizes((2 * inner, inner, fused.shape[-1] - 3 * inner), -1)
        query_key = query_key.view(batch, length, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if position_embeddings is not None:  # q and k [2, B, H, L, d] rotated in one pass
            query_key = apply_rotary(query_key, *position_embeddings)
        query, key = query_key.unbind(0)
        return query, key, value.view(hidden_shape).transpose(1, 2), pre

    def fused_projections(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """[q | k | v | W_r h | W_theta h | W_b h] as one matmul while `generate` keeps derived weights (a decoding
        step pays per call, not per multiply); None elsewhere, or when a projection is wrapped or hooked."""
        if not derived_weights_kept():
            return None
        encoder = self.phase_encoder
        linears = (self.q_proj, self.k_proj, self.v_proj, *encoder.encoders)
        if encoder._forward_hooks or encoder._forward_pre_hooks or not plain_linears(linears):
            return None
        return stacked_linear(hidden_states, linears)


class ZPXDecoderLayer(GeometricDecoderLayer):
    mixer_class = ZPXAttention
    mlp_class = SwiGLUMLP
    norm_class = RMSNorm


class ZPXPreTrainedModel(GeometricPreTrainedModel):
    config_class = ZPXConfig
    if TYPE_CHECKING:  # for the type checker only (transformers would read the annotation as config_class)
        config: ZPXConfig
    _no_split_modules = ["ZPXDecoderLayer"]
    # ZPX is softmax attention on q^ . k^ (width `engine_head_dim`, the standard scaling with q^'s phase terms
    # divided by it): any softmax engine computes it exactly, reached through transformers' global
    # AttentionInterface with the standard signature (`ZPXAttention.forward`, `engine_inputs`).
    _supports_attention_backend = True
    _supports_flash_attn = True
    _supports_flex_attn = True

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, ZPXAttention) and module.learnable_lambdas:
            hf_init.constant_(module.lambda_angle_heads, self.config.lambda_angle)
            hf_init.constant_(module.lambda_sphere_heads, self.config.lambda_sphere)


class ZPXModel(GeometricModel, ZPXPreTrainedModel):
    """Shared backbone with ZPX layers; `output_phases=True` adds each layer's phase tensor Phi."""

    output_class = ZPXModelOutputWithPast
    decoder_layer_class = ZPXDecoderLayer
    norm_class = RMSNorm

    def attention_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        # what a softmax engine's attention function takes (its metadata), all but ZPX's own output flags
        return {key: value for key, value in kwargs.items() if key != "output_phases"}

    def extra_outputs(
        self,
        extras: list[PhaseState],
        token_mask: torch.Tensor | None,
        output_phases: bool | None = None,
        document_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        # The centre term costs a reduction per layer: only computed when it is used or asked for; packed rows
        # sum it per document.
        center_loss = None
        if output_phases or self.config.center_loss_weight > 0:
            center_loss = sum(
                center_cancellation_loss(phase, token_mask, document_ids=document_ids) for phase in extras
            ) / len(extras)
        phases = None
        if output_phases:  # [B, L, H, C, 7]
            phases = tuple(phase_tensor(phase) for phase in extras)
        return {"phases": phases, "center_loss": center_loss}


class ZPXForCausalLM(ForCausalLMHead, ZPXPreTrainedModel, GenerationMixin):
    """LM head on `ZPXModel`; `loss` = next-token CE + `center_loss_weight * center_loss`."""

    backbone_class = ZPXModel
    output_class = ZPXCausalLMOutputWithPast
    # as Llama's: the tied head shards with the embedding (transformers adds `embed_tokens` to the plan)
    _tp_plan = {"lm_head": "colwise_gather_output"}

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
    if config.center_loss_weight <= 0:
        return None
    if outputs.center_loss is None:  # ZPXModel computes it whenever the weight is positive
        raise ValueError("center_loss_weight > 0 but the backbone gave no center_loss: pass ZPXModel's outputs.")
    return config.center_loss_weight * outputs.center_loss


__all__ = [
    "ZPXPreTrainedModel",
    "ZPXModel",
    "ZPXForCausalLM",
    "ZPXForSequenceClassification",
    "ZPXPhaseEncoder",
    "ZPXAttention",
]
