"""PCT models: complex Phase-Coherent Transformer with non-competitive sigmoid attention (SPEC §3).

Complex hidden states throughout, stored as real `[re | im]` tensors (see `modeling_complex.py`):
`hidden_states` and `last_hidden_state` are [B, L, 2 * hidden_size]. Attention per head, complex
head dim d:

    qn = q / ||q||, kn = k / ||k||                          complex L2 norm (eps inside the root)
    q' = qn r(p) e^{i Theta(p)}, k' likewise                SRPE/RoPE in complex form, after the
                                                            norm so SRPE's radius r survives
    a_ij = sigmoid(tau Re<q'_i, k'_j> + b_h), j visible     no softmax, no row sum
    out_i = W_o sum_j a_ij v_j                              real gate x complex value

The KV cache stores k' (normalised and rotated) and v, both [re | im]. The LM head and the
sequence-classification head are real linear maps on `[re | im]` (with tied embeddings the logit
of token v is Re sum_m conj(e_vm) z_m).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast

from .configuration_pct import PCTConfig
from .modeling_blocks import (
    CACHE_FIELD,
    ForCausalLMHead,
    ForSequenceClassificationHead,
    GeometricPreTrainedModel,
    check_inputs,
    default_position_ids,
    hf_init,
    init_bias_log_context,
    pop_cache_kwarg,
    resolve_forward_flags,
)
from .modeling_complex import ComplexEmbedding, ComplexLinear, ComplexRMSNorm, ModReLU, complex_rotate
from .ops_pct import pct_attention, pct_attention_weights
from .rotary_srpe import build_rotary


def complex_l2_normalize(z: torch.Tensor, eps: float) -> torch.Tensor:
    """z / sqrt(sum_m |z_m|^2 + eps) over the last dim ([re | im]), computed in float32."""
    z32 = z.float()
    return (z32 * torch.rsqrt(z32.pow(2).sum(-1, keepdim=True) + eps)).to(z.dtype)


class PCTAttention(nn.Module):
    """Phase-coherent multi-head attention: complex projections, sigmoid gates, phase-preserving sum."""

    def __init__(self, config: PCTConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.is_causal = config.causal
        inner = self.num_heads * self.head_dim
        self.q_proj = ComplexLinear(config.hidden_size, inner, bias=config.attention_bias)
        self.k_proj = ComplexLinear(config.hidden_size, inner, bias=config.attention_bias)
        self.v_proj = ComplexLinear(config.hidden_size, inner, bias=config.attention_bias)
        self.o_proj = ComplexLinear(inner, config.hidden_size, bias=config.attention_bias)
        # b_h, initialised at -log(n) by `_init_weights`
        self.gate_bias = nn.Parameter(torch.empty(self.num_heads))
        if config.tau == "learnable":
            self.tau = nn.Parameter(torch.empty(self.num_heads))
        else:
            self.tau = None
            self.fixed_tau = config.initial_tau

    def temperature(self) -> torch.Tensor | float:
        return self.tau if self.tau is not None else self.fixed_tau

    def _split_heads(self, z: torch.Tensor) -> torch.Tensor:
        """[B, L, 2 H d] ([re | im] over all heads) -> [B, H, L, 2d] ([re | im] per head)."""
        batch, length = z.shape[:2]
        z = z.view(batch, length, 2, self.num_heads, self.head_dim)
        return z.permute(0, 3, 1, 2, 4).reshape(batch, self.num_heads, length, 2 * self.head_dim)

    def _merge_heads(self, z: torch.Tensor) -> torch.Tensor:
        """[B, H, L, 2d] -> [B, L, 2 H d]."""
        batch, _, length = z.shape[:3]
        z = z.view(batch, self.num_heads, length, 2, self.head_dim)
        return z.permute(0, 2, 3, 1, 4).reshape(batch, length, 2 * self.num_heads * self.head_dim)

    def attention_kernel(self) -> str:
        """HF's `attn_implementation`: "eager" forces the PyTorch reference; "sdpa" (HF's default) and
        None defer to `config.attention_kernel` (auto: Triton on CUDA)."""
        implementation = self.config._attn_implementation
        if implementation == "eager":
            return "reference"
        if implementation not in (None, "sdpa"):
            raise ValueError(
                f"`attn_implementation`={implementation!r} is not available for PCT (softmax kernels do not apply): "
                "use 'eager' (PyTorch reference) or 'sdpa' (default; picks the Triton kernel on CUDA), and choose "
                "the kernel with the config field `attention_kernel`."
            )
        return self.config.attention_kernel

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_tables: tuple[torch.Tensor, torch.Tensor] | None,
        key_padding_mask: torch.Tensor | None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        eps = self.config.qk_norm_eps
        query = complex_l2_normalize(self._split_heads(self.q_proj(hidden_states)), eps)
        key = complex_l2_normalize(self._split_heads(self.k_proj(hidden_states)), eps)
        value = self._split_heads(self.v_proj(hidden_states))
        if position_tables is not None:
            cos, sin = position_tables  # r cos Theta, r sin Theta per complex feature
            query, key = complex_rotate(query, cos, sin), complex_rotate(key, cos, sin)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)

        output = pct_attention(
            query,
            key,
            value,
            self.temperature(),
            self.gate_bias,
            key_padding_mask=key_padding_mask,
            causal=self.is_causal,
            implementation=self.attention_kernel(),
        )
        weights = None
        if output_attentions:
            weights = pct_attention_weights(
                query, key, self.temperature(), self.gate_bias, key_padding_mask, causal=self.is_causal
            )
        return self.o_proj(self._merge_heads(output)), weights


class PCTMLP(nn.Module):
    """down(modReLU(up(z))): complex feed-forward layer with a phase-preserving activation."""

    def __init__(self, config: PCTConfig) -> None:
        super().__init__()
        self.up_proj = ComplexLinear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.act_fn = ModReLU(config.intermediate_size)
        self.down_proj = ComplexLinear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(z)))


class PCTDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: PCTConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = PCTAttention(config, layer_idx)
        self.mlp = PCTMLP(config)
        self.input_layernorm = ComplexRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = ComplexRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_padding_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        residual = hidden_states
        hidden_states, weights = self.self_attn(
            self.input_layernorm(hidden_states),
            position_tables,
            key_padding_mask,
            past_key_values=past_key_values,
            output_attentions=output_attentions,
        )
        hidden_states = residual + hidden_states
        hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states, weights


class PCTPreTrainedModel(GeometricPreTrainedModel):
    config_class = PCTConfig
    _no_split_modules = ["PCTDecoderLayer"]
    remote_code_auto_map = {
        "AutoConfig": "configuration_pct.PCTConfig",
        "AutoModel": "modeling_pct.PCTModel",
        "AutoModelForCausalLM": "modeling_pct.PCTForCausalLM",
        "AutoModelForSequenceClassification": "modeling_pct.PCTForSequenceClassification",
    }

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

    def _initial_gate_bias(self) -> float:
        if self.config.gate_bias_init is not None:
            return float(self.config.gate_bias_init)
        return init_bias_log_context(self.config.max_position_embeddings)


class PCTModel(PCTPreTrainedModel):
    def __init__(self, config: PCTConfig) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens = ComplexEmbedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([PCTDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = ComplexRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.feature_size = 2 * config.hidden_size  # real features per token read by the heads: [re | im]
        # One rotary pair per complex feature (`config.rotary_dim` = 2d real features).
        self.rotary_emb = build_rotary(config)
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
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast | tuple:
        """`inputs_embeds`, when given, are complex embeddings [B, L, 2 * hidden_size] laid out [re | im]."""
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
        elif inputs_embeds.shape[-1] != 2 * self.config.hidden_size:
            raise ValueError(
                f"`inputs_embeds` must have 2 * hidden_size = {2 * self.config.hidden_size} features ([re | im]); "
                f"got {inputs_embeds.shape[-1]}."
            )
        length = inputs_embeds.shape[1]
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, past_length, length, inputs_embeds.device)
        position_tables = None
        if self.rotary_emb is not None:
            position_tables = self.rotary_emb.pair_tables(position_ids, inputs_embeds.device)
        # Sigmoid gates have no normaliser: padded keys are dropped per pair (exactly 0), no 4-D mask needed.
        key_padding_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            key_padding_mask = attention_mask.to(device=inputs_embeds.device, dtype=torch.bool)

        hidden_states = inputs_embeds
        all_hidden_states = () if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states, weights = layer(
                hidden_states,
                position_tables=position_tables,
                key_padding_mask=key_padding_mask,
                past_key_values=past_key_values,
                output_attentions=bool(output_attentions),
            )
            if output_attentions:
                all_attentions += (weights,)
        hidden_states = self.norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)

        output = BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            **{CACHE_FIELD: past_key_values if use_cache else None},
        )
        return output if return_dict else output.to_tuple()


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
