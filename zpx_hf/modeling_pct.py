"""PCT models: complex Phase-Coherent Transformer with non-competitive sigmoid attention (docs/design.md §4).

Complex hidden states throughout, stored as real `[re | im]` tensors (see `modeling_complex.py`):
`hidden_states` and `last_hidden_state` are [B, L, hidden_size] (`hidden_size` counts real features).
Attention per head, complex head dim d = head_dim / 2:

    qn = q / ||q||, kn = k / ||k||                          complex L2 norm (eps inside the root)
    q' = qn r(p) e^{i Theta(p)}, k' likewise                SRPE/RoPE in complex form, after the
                                                            norm so SRPE's radius r survives
    a_ij = sigmoid(tau_h Re<q'_i, k'_j> + b_h), j visible     no softmax, no row sum
    out_i = W_o sum_j a_ij v_j                              real gate x complex value

`query_key_value` takes the joint q/k/v projection to normalised, rotated heads with a closed-form backward
(`query_key_value_naive`, the same map through autograd, is its reference).

The KV cache stores k' (normalised and rotated) and v, both [re | im]. The LM head and the
sequence-classification head are real linear maps on `[re | im]` (with tied embeddings the logit
of token v is Re sum_m conj(e_vm) z_m). Backbone and heads are the shared ones of `modeling_common.py`;
attention runs through the shared `ALL_ATTENTION_FUNCTIONS` (`modeling_common.ATTENTION_KERNELS`) into the op's
one entry (`ops_pct.py`, `PCTAttention.attention_op`): `"eager"` materialises the gates (`pct_attention_weights`),
`"sdpa"` runs `pct_attention(kernel="auto")` (Triton on CUDA, the memory-lean PyTorch path or its one-token step
elsewhere).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from transformers import GenerationMixin
from transformers import initialization as hf_init
from transformers.cache_utils import Cache

from .configuration_common import LOGIT_SCALE_LIMIT
from .configuration_pct import PCTConfig
from .modeling_blocks import init_bias_log_context
from .modeling_common import (
    ALL_ATTENTION_FUNCTIONS,
    ForCausalLMHead,
    ForSequenceClassificationHead,
    GeometricDecoderLayer,
    GeometricModel,
    GeometricPreTrainedModel,
    attention_implementation,
    eager_attention_forward,
    trim_static_cache,
)
from .modeling_complex import ComplexEmbedding, ComplexLinear, ComplexRMSNorm, ModReLU, complex_linear
from .ops_common import autocast_off, upcast
from .ops_pct import pct_attention, pct_attention_weights


def pct_attention_eager(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor | float,
    bias: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The readable path (`ops_pct_naive`'s formula): the gates a_ij materialised once, out = a v; the gates are
    returned as the attention weights, the very tensor the output is computed from (as transformers' eager
    paths return theirs), so gradients reach them."""
    weights = pct_attention_weights(
        query, key, tau, bias, causal=causal, key_padding_mask=key_padding_mask, document_ids=document_ids
    )
    batch, heads, l_q, l_k = weights.shape
    key_heads = value.shape[1]
    with autocast_off(query):  # grouped: each key-value head's values serve its query heads' rows [group * Lq]
        output = weights.view(batch, key_heads, -1, l_k) @ value.to(weights.dtype)
    return output.view(batch, heads, l_q, -1).to(query.dtype), weights


def rotation_tables(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """SRPE/RoPE tables [B, L, d] -> (cos [B, 1, L, 1, d], [-sin, sin] [B, 1, L, 2, d]) in `dtype` (at least
    float32), shaped for `normalize_rotate`'s pairs; built once per forward, shared by every layer."""
    dtype = torch.float64 if dtype == torch.float64 else torch.float32  # promote_types(dtype, float32)
    if cos.dtype != dtype:
        cos, sin = cos.to(dtype), sin.to(dtype)
    sin = sin[:, None, :, None, :]
    return cos[:, None, :, None, :], torch.cat((-sin, sin), dim=-2)


def normalize_rotate(
    pairs: torch.Tensor, eps: float, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None
) -> torch.Tensor:
    """q' = q / sqrt(sum_m |q_m|^2 + eps) * r e^{i Theta} per complex feature, in float32 at least.

    `pairs` [..., B, H, L, 2, d] (row 0 re, row 1 im; queries and keys stacked in front); tables from
    `rotation_tables`: cos [B, 1, L, 1, d], signed sin [B, 1, L, 2, d].
    Rotation: [re, im] cos + [im, re] [-sin, sin] = [re cos - im sin, im cos + re sin].
    """
    z32 = upcast(pairs)
    inverse = torch.rsqrt(z32.square().sum((-2, -1), keepdim=True).add_(eps))  # 1 / ||q||, [..., 1, 1]
    if position_embeddings is None:
        out = z32 * inverse
    else:
        cos, signed_sin = position_embeddings
        if cos.dtype != z32.dtype:
            cos, signed_sin = cos.to(z32.dtype), signed_sin.to(z32.dtype)
        out = torch.addcmul(z32 * cos, z32.flip(-2), signed_sin).mul_(inverse)
    return out if out.dtype == pairs.dtype else out.to(pairs.dtype)


def split_grouped(qkv: torch.Tensor, num_heads: int, num_key_value_heads: int, head_dim: int) -> list[torch.Tensor]:
    """The joint projection [B, L, 2 * (H + 2 Hkv) * d] of a grouped layer -> views q [B, H, L, 2, d], k and v
    [B, Hkv, L, 2, d] ((re, im) rows)."""
    batch, length = qkv.shape[:2]
    widths = (num_heads * head_dim, num_key_value_heads * head_dim, num_key_value_heads * head_dim)
    parts = qkv.view(batch, length, 2, -1).split(widths, dim=-1)
    return [part.unflatten(-1, (-1, head_dim)).permute(0, 3, 1, 2, 4) for part in parts]


def query_key_value_naive(
    qkv: torch.Tensor,
    num_heads: int,
    head_dim: int,
    eps: float,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
    num_key_value_heads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The joint projection [B, L, 2 * (H + 2 Hkv) * d] ([re_q re_k re_v | im_q im_k im_v]; Hkv =
    `num_key_value_heads`, default H) -> query and key normalised and rotated (`normalize_rotate`), value; each
    [B, heads, L, 2d] ([re | im] per head), contiguous. Through autograd: the reference for `query_key_value`'s
    backward."""
    batch, length = qkv.shape[:2]
    if num_key_value_heads not in (None, num_heads):  # grouped: q and k / v differ in heads
        query, key, value = (part.contiguous() for part in split_grouped(qkv, num_heads, num_key_value_heads, head_dim))
        query, key = (normalize_rotate(x, eps, position_embeddings).flatten(-2) for x in (query, key))
        return query, key, value.flatten(-2)
    # [B, L, (re, im), (q, k, v), H, d] -> [(q, k, v), B, H, L, (re, im), d]
    qkv = qkv.view(batch, length, 2, 3, num_heads, head_dim).permute(3, 0, 4, 1, 2, 5).contiguous()
    query, key = normalize_rotate(qkv[:2], eps, position_embeddings).flatten(-2).unbind(0)
    return query, key, qkv[2].flatten(-2)


def normalize_rotate_backward(
    z: torch.Tensor, g: torch.Tensor, cos: torch.Tensor | None, signed_sin: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """dz of `normalize_rotate` for pairs z [..., 2, d] and output gradients g (both >= float32), closed form:
    dz = h / ||z|| - z <z, h> / ||z||^3 with h = R^T(g)."""
    if cos is None or signed_sin is None:  # no rotary tables (the two come together)
        h = g
    else:  # R^T g = [g_re cos + g_im sin, g_im cos - g_re sin] = g cos - [g_im, g_re] [-sin, sin]
        h = torch.addcmul(g * cos.to(g.dtype), g.flip(-2), signed_sin.to(g.dtype), value=-1.0)
    inverse = torch.rsqrt(z.square().sum((-2, -1), keepdim=True).add_(eps))  # 1 / ||z||
    coefficient = (h * z).sum((-2, -1), keepdim=True).mul_(inverse.pow(3))  # <z, h> / ||z||^3
    return torch.addcmul(h * inverse, z, coefficient, value=-1.0)


class _QueryKeyValue(torch.autograd.Function):
    """`query_key_value_naive` with its backward in closed form. Per head, with y = R(z) / ||z|| (R the
    rotation by r e^{i Theta}, linear) and h = R^T(g) (the rotation by r e^{-i Theta}):
        dz = h / ||z|| - z <z, h> / ||z||^3
    written straight into the projection's [B, L, 2 * 3 * H * d] layout; the value's gradient is copied there."""

    @staticmethod
    def forward(ctx, qkv, num_heads, head_dim, eps, cos, signed_sin, num_key_value_heads):
        position_embeddings = None if cos is None else (cos, signed_sin)
        query, key, value = query_key_value_naive(
            qkv, num_heads, head_dim, eps, position_embeddings, num_key_value_heads
        )
        ctx.save_for_backward(qkv, cos, signed_sin)
        ctx.sizes, ctx.eps = (num_heads, head_dim, num_key_value_heads), eps
        return query, key, value

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_query, grad_key, grad_value):
        qkv, cos, signed_sin = ctx.saved_tensors
        num_heads, head_dim, num_key_value_heads = ctx.sizes
        batch, length = qkv.shape[:2]
        if num_key_value_heads not in (None, num_heads):  # grouped: q and k apart, in their heads' views
            grad = qkv.new_empty(qkv.shape)
            views = split_grouped(grad, num_heads, num_key_value_heads, head_dim)
            pairs = split_grouped(qkv, num_heads, num_key_value_heads, head_dim)
            for view, z, grad_out in zip(views[:2], pairs[:2], (grad_query, grad_key)):
                g = upcast(grad_out.unflatten(-1, (2, head_dim)))
                view.copy_(normalize_rotate_backward(upcast(z), g, cos, signed_sin, ctx.eps))
            views[2].copy_(grad_value.unflatten(-1, (2, head_dim)))
            return grad, None, None, None, None, None, None
        layout = (batch, length, 2, 3, num_heads, head_dim)
        z = upcast(qkv.view(layout)[:, :, :, :2].permute(3, 0, 4, 1, 2, 5))  # [2, B, H, L, 2, d]
        g = upcast(torch.stack((grad_query, grad_key)).unflatten(-1, (2, head_dim)))
        grad = qkv.new_empty(layout)
        heads = grad.permute(3, 0, 4, 1, 2, 5)  # [(q, k, v), B, H, L, 2, d] view of the projection's layout
        heads[:2] = normalize_rotate_backward(z, g, cos, signed_sin, ctx.eps)
        heads[2] = grad_value.unflatten(-1, (2, head_dim))
        return grad.view(qkv.shape), None, None, None, None, None, None


def query_key_value(
    qkv: torch.Tensor,
    num_heads: int,
    head_dim: int,
    eps: float,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
    num_key_value_heads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`query_key_value_naive`'s map; with gradients its closed-form backward (`_QueryKeyValue`)."""
    if torch.is_grad_enabled() and qkv.requires_grad:
        cos, signed_sin = (None, None) if position_embeddings is None else position_embeddings
        return _QueryKeyValue.apply(qkv, num_heads, head_dim, eps, cos, signed_sin, num_key_value_heads)
    return query_key_value_naive(qkv, num_heads, head_dim, eps, position_embeddings, num_key_value_heads)


class PCTAttention(nn.Module):
    """Phase-coherent multi-head attention: complex projections, sigmoid gates, phase-preserving sum; grouped-query
    when `num_key_value_heads` < `num_attention_heads` (k and v per key-value head; tau and b_h per query head)."""

    def __init__(self, config: PCTConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.head_dim = config.complex_head_dim
        self.is_causal = config.causal
        self.qk_norm_eps = config.qk_norm_eps
        inner = self.num_heads * self.head_dim
        key_inner = self.num_key_value_heads * self.head_dim
        width = config.complex_hidden_size
        self.q_proj = ComplexLinear(width, inner, bias=config.attention_bias)
        self.k_proj = ComplexLinear(width, key_inner, bias=config.attention_bias)
        self.v_proj = ComplexLinear(width, key_inner, bias=config.attention_bias)
        self.o_proj = ComplexLinear(inner, width, bias=config.attention_bias)
        # b_h, initialised at -log(n) by `_init_weights`
        self.gate_bias = nn.Parameter(torch.empty(self.num_heads))
        self.tau = nn.Parameter(torch.empty(self.num_heads)) if config.tau == "learnable" else None
        # tau_h = exp(log_tau_h): Adam moves log_tau by ~lr a step, so tau can grow geometrically (sharpen)
        self.log_tau = nn.Parameter(torch.empty(self.num_heads)) if config.tau == "log_learnable" else None
        self.fixed_tau = None if config.learnable_tau else config.initial_tau

    def temperature(self) -> torch.Tensor | float:
        """tau per head ([H] tensor, with gradients when learnable) or the fixed number."""
        if self.log_tau is not None:
            # in float32 at least (the kernels' tau precision), capped at LOGIT_SCALE_LIMIT: a float16 log_tau
            # rounds log(65504) up to 11.094, whose exp is inf in float16 (NaN gates)
            return upcast(self.log_tau).exp().clamp(max=LOGIT_SCALE_LIMIT)
        if self.tau is not None:
            return self.tau
        if self.fixed_tau is None:  # learnable_tau always builds tau or log_tau
            raise RuntimeError("PCTAttention holds no temperature: neither a learned tau nor a fixed one.")
        return self.fixed_tau

    def _merge_heads(self, z: torch.Tensor) -> torch.Tensor:
        """[B, H, L, 2d] -> [B, L, 2 H d]."""
        batch, _, length = z.shape[:3]
        z = z.view(batch, self.num_heads, length, 2, self.head_dim)
        return z.permute(0, 2, 3, 1, 4).reshape(batch, length, 2 * self.num_heads * self.head_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        padding_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
        kv_length: int | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if all(projection.plain() for projection in projections):
            qkv = complex_linear(hidden_states, projections)  # one map: [re_q re_k re_v | im_q im_k im_v]
        else:  # adapters or hooks: each projection through its sub-modules, the same layout
            qkv = torch.cat([p(hidden_states).unflatten(-1, (2, -1)) for p in projections], dim=-1).flatten(-2)
        query, key, value = query_key_value(
            qkv, self.num_heads, self.head_dim, self.qk_norm_eps, position_embeddings, self.num_key_value_heads
        )
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
            key, value = trim_static_cache(key, value, kv_length)

        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            attention_implementation(self.config, output_attentions), eager_attention_forward
        )
        # Sigmoid gates have no normaliser: padded keys are dropped per pair (exactly 0), no 4-D mask needed.
        output, weights = attention_interface(self, query, key, value, padding_mask, document_ids=document_ids)
        return self.o_proj(self._merge_heads(output)), weights, None

    def attention_op(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        *,
        kernel: str,
        document_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The op on normalised, rotated q [B, H, Lq, 2d], k and v [B, Hkv, Lk, 2d] with this layer's tau and
        b_h: kernel "naive" materialises the gates and returns them (`pct_attention_eager`), the others run the
        entry (`ops_pct.pct_attention`) and return no weights."""
        tau, bias, causal, documents = self.temperature(), self.gate_bias, self.is_causal, document_ids
        if kernel == "naive":
            return pct_attention_eager(
                query, key, value, tau, bias, causal=causal, key_padding_mask=key_padding_mask, document_ids=documents
            )
        output = pct_attention(
            query, key, value, tau, bias, causal=causal, key_padding_mask=key_padding_mask, document_ids=documents,
            kernel=kernel,
        )  # fmt: skip
        return output, None


class PCTMLP(nn.Module):
    """down(modReLU(up(z))): complex feed-forward layer with a phase-preserving activation."""

    def __init__(self, config: PCTConfig) -> None:
        super().__init__()
        width, inner = config.complex_hidden_size, config.complex_intermediate_size
        self.up_proj = ComplexLinear(width, inner, bias=config.mlp_bias)
        self.act_fn = ModReLU(inner)
        self.down_proj = ComplexLinear(inner, width, bias=config.mlp_bias)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(z)))


class PCTDecoderLayer(GeometricDecoderLayer):
    mixer_class = PCTAttention
    mlp_class = PCTMLP
    norm_class = ComplexRMSNorm


class PCTPreTrainedModel(GeometricPreTrainedModel):
    config_class = PCTConfig
    _no_split_modules = ["PCTDecoderLayer"]
    softmax_engine_refusal = (
        "PCT attention is a sigmoid gate sigmoid(tau Re<q, k> + b) with no softmax and no row normaliser"
    )

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, ComplexRMSNorm):
            hf_init.ones_(module.weight)
        elif isinstance(module, ModReLU):
            hf_init.zeros_(module.bias)
        elif isinstance(module, PCTAttention):
            hf_init.constant_(module.gate_bias, self._initial_gate_bias())
            if module.tau is not None:
                hf_init.constant_(module.tau, self.config.initial_tau)
            if module.log_tau is not None:
                hf_init.constant_(module.log_tau, math.log(self.config.initial_tau))

    def _initial_gate_bias(self) -> float:
        if self.config.gate_bias_init is not None:
            return float(self.config.gate_bias_init)
        return init_bias_log_context(self.config.train_context_length)


class PCTModel(GeometricModel, PCTPreTrainedModel):
    """Shared backbone with complex layers; `inputs_embeds`, when given, are [B, L, hidden_size] ([re | im]).
    One rotary pair per complex feature (`config.rotary_dim` = head_dim = 2d real features)."""

    embedding_class = ComplexEmbedding
    decoder_layer_class = PCTDecoderLayer
    norm_class = ComplexRMSNorm

    def position_embeddings(
        self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """SRPE/RoPE tables shaped for `normalize_rotate` (`rotation_tables`), once per forward; None without."""
        if self.rotary_emb is None:
            return None
        cos, sin = self.rotary_emb.pair_tables(position_ids, inputs_embeds.device)
        return rotation_tables(cos, sin, inputs_embeds.dtype)


class PCTForCausalLM(ForCausalLMHead, PCTPreTrainedModel, GenerationMixin):
    """LM head: a real linear map on the final complex state's [re | im] (logit_v = Re <z, w_v>)."""

    backbone_class = PCTModel


class PCTForSequenceClassification(ForSequenceClassificationHead, PCTPreTrainedModel):
    """Classifies from the last real token's [re | im] features with a real linear `score` head."""

    backbone_class = PCTModel


__all__ = [
    "PCTPreTrainedModel",
    "PCTModel",
    "PCTForCausalLM",
    "PCTForSequenceClassification",
    "PCTAttention",
    "PCTMLP",
    "PCTDecoderLayer",
]
