"""Versor models: a multivector transformer over Cl(4,1) (SPEC §4).

The residual stream is `[B, L, C, 32]`: C multivector channels (`hidden_size = 32 C`; flattened to
`[B, L, hidden_size]` in outputs). Blocks are pre-norm:

    x = x + Mixer(Norm(x));   x = x + MLP(Norm(x))

with a grade-aware RMS norm, channel-mixing linear maps with one weight per grade (they commute with
the grade projections), a scalar-gated MLP, and a mixer per layer: geometric product attention
(`ops_gpa.py`) or the recursive rotor accumulator (`ops_rra.py`). `VersorCache` holds, per layer, the
multivector keys/values of GPA layers and only the rotor state R_t of RRA layers (O(1) per token).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
)

from .clifford_algebra import BIVECTOR_MASKS, NUM_BLADES, NUM_GRADES, conformal_algebra
from .configuration_versor import VersorConfig
from .modeling_blocks import (
    CACHE_FIELD,
    ForCausalLMHead,
    ForSequenceClassificationHead,
    GeometricPreTrainedModel,
    build_attention_mask,
    check_inputs,
    hf_init,
    pop_cache_kwarg,
    resolve_forward_flags,
    uses_is_causal,
)
from .ops_gpa import geometric_product_attention
from .ops_rra import recursive_rotor_accumulator

# positions of the 6 rotation (e_i e_j, i, j <= 4) and 4 boost (e_i e5) bivectors in BIVECTOR_MASKS order
_ROTATION = [i for i, mask in enumerate(BIVECTOR_MASKS) if not mask & 16]
_BOOST = [i for i, mask in enumerate(BIVECTOR_MASKS) if mask & 16]


class VersorCache:
    """Generation state: multivector keys/values for GPA layers, the rotor R_t for RRA layers.

    Not a `transformers.Cache` subclass (its layer classes assume KV tensors); it implements what
    `generate` uses: `get_seq_length`, `is_linear`, `is_compileable`, `is_croppable`, and beam reordering.
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, config: VersorConfig) -> None:
        self.mixers = [config.layer_mixer(i) for i in range(config.num_hidden_layers)]
        self.keys: list[torch.Tensor | None] = [None] * len(self.mixers)
        self.values: list[torch.Tensor | None] = [None] * len(self.mixers)
        self.rotors: list[torch.Tensor | None] = [None] * len(self.mixers)
        self.seen_tokens = 0

    @property
    def is_linear(self) -> list[bool]:
        return [mixer == "rra" for mixer in self.mixers]

    def __len__(self) -> int:
        return len(self.mixers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `[B, H, L, D]` keys/values of a GPA layer; returns the full cached tensors."""
        if self.keys[layer_idx] is not None:
            key = torch.cat((self.keys[layer_idx], key), dim=-2)
            value = torch.cat((self.values[layer_idx], value), dim=-2)
        self.keys[layer_idx], self.values[layer_idx] = key, value
        return key, value

    def get_rotor(self, layer_idx: int) -> torch.Tensor | None:
        return self.rotors[layer_idx]

    def set_rotor(self, rotor: torch.Tensor, layer_idx: int) -> None:
        self.rotors[layer_idx] = rotor

    def _map(self, fn) -> None:
        for store in (self.keys, self.values, self.rotors):
            for i, tensor in enumerate(store):
                if tensor is not None:
                    store[i] = fn(tensor)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])


class VersorLinear(nn.Module):
    """Channel mixing with one weight matrix per grade: y[o, A] = sum_i W[grade(A), o, i] x[i, A].

    Commutes with grade projection (and with any grade-preserving map such as a rotor sandwich)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.weight = nn.Parameter(torch.empty(NUM_GRADES, out_channels, in_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight[conformal_algebra().table("grades", x.device)]  # [32, out, in]
        return torch.einsum("...ia,aoi->...oa", x, weight.to(x.dtype))

    def extra_repr(self) -> str:
        return f"{self.in_channels} -> {self.out_channels} channels, {NUM_GRADES} grades"


class VersorNorm(nn.Module):
    """Grade-aware RMS norm: each grade g is divided by sqrt(mean_c ||x_{c,g}||^2 + eps) (Euclidean norm of
    its coefficients, averaged over channels), then scaled by a learned weight per (channel, grade)."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels, NUM_GRADES))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.float()
        onehot = conformal_algebra().table("grade_onehot", x.device)  # [32, 6]
        per_grade = (x.pow(2) @ onehot).mean(-2, keepdim=True)  # [..., 1, 6]
        scale = torch.rsqrt(per_grade + self.variance_epsilon) * self.weight.float()  # [..., C, 6]
        return (x * (scale @ onehot.T)).to(input_dtype)


class VersorMLP(nn.Module):
    """down(up(x) * silu(<gate(x)>_0)): the scalar part of each gate channel gates a whole multivector."""

    def __init__(self, config: VersorConfig) -> None:
        super().__init__()
        inner = config.intermediate_size // NUM_BLADES
        self.gate_proj = VersorLinear(config.num_channels, inner)
        self.up_proj = VersorLinear(config.num_channels, inner)
        self.down_proj = VersorLinear(inner, config.num_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.silu(self.gate_proj(x)[..., :1])
        return self.down_proj(self.up_proj(x) * gate)


class VersorGPA(nn.Module):
    """Geometric product attention; the cache stores multivector keys/values `[B, H, L, 32 c]`."""

    def __init__(self, config: VersorConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_channels = config.head_channels
        self.scaling = config.head_dim**-0.5
        self.is_causal = config.causal
        inner = self.num_heads * self.head_channels
        self.q_proj = VersorLinear(config.num_channels, inner)
        self.k_proj = VersorLinear(config.num_channels, inner)
        self.v_proj = VersorLinear(config.num_channels, inner)
        self.o_proj = VersorLinear(inner, config.num_channels)
        self.gamma = nn.Parameter(torch.full((self.num_heads,), float(config.gpa_gamma_init)))

    def _kernel(self) -> str:
        if self.config.gpa_kernel != "auto":
            return self.config.gpa_kernel
        return "reference" if self.config._attn_implementation == "eager" else "auto"

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        padding_mask: torch.Tensor | None,
        past_key_values: VersorCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, length = hidden_states.shape[:2]

        def heads(x: torch.Tensor) -> torch.Tensor:  # [B, L, H*c, 32] -> [B, H, L, 32 c]
            return x.reshape(batch, length, self.num_heads, -1).transpose(1, 2)

        query = heads(self.q_proj(hidden_states))
        key = heads(self.k_proj(hidden_states))
        value = heads(self.v_proj(hidden_states))
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
        output, weights = geometric_product_attention(
            query,
            key,
            value,
            self.gamma,
            attention_mask,
            is_causal=uses_is_causal(attention_mask, self.is_causal, length),
            scaling=self.scaling,
            eps=self.config.gpa_eps,
            kernel=self._kernel(),
            scalar_only=not self.config.gpa_bivector,
            output_weights=output_attentions,
            key_padding_mask=padding_mask,
            causal=self.is_causal,
        )
        output = output.transpose(1, 2).reshape(batch, length, -1, NUM_BLADES)
        return self.o_proj(output), weights


class VersorRRA(nn.Module):
    """Recursive rotor accumulator: B_t = s tanh(W x_t) per head, R_t = R_{t-1} exp(-B_t/2), y_t = R_t v_t ~R_t.

    With `rra_accumulate="compact"` the rotation part of B_t is accumulated and the boost part applied per
    token (see `ops_rra.py`). Padding tokens get B_t = 0 (identity rotor). The cache keeps R_t only."""

    def __init__(self, config: VersorConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_channels = config.head_channels
        inner = self.num_heads * self.head_channels
        self.bivector_proj = nn.Linear(config.hidden_size, self.num_heads * len(BIVECTOR_MASKS), bias=True)
        self.v_proj = VersorLinear(config.num_channels, inner)
        self.o_proj = VersorLinear(inner, config.num_channels)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        padding_mask: torch.Tensor | None,
        past_key_values: VersorCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, None]:
        batch, length = hidden_states.shape[:2]
        raw = self.bivector_proj(hidden_states.reshape(batch, length, -1))
        bivectors = self.config.rra_bivector_scale * torch.tanh(raw.float())
        bivectors = bivectors.reshape(batch, length, self.num_heads, len(BIVECTOR_MASKS))
        if padding_mask is not None:  # [B, past + L] -> this chunk's tokens
            token_mask = padding_mask[:, -length:]
            bivectors = bivectors * token_mask[:, :, None, None].to(bivectors.dtype)
        local = None
        if self.config.rra_accumulate == "compact":
            keep = torch.zeros(len(BIVECTOR_MASKS), device=bivectors.device, dtype=bivectors.dtype)
            keep[_ROTATION] = 1.0
            local = bivectors * (1.0 - keep)
            bivectors = bivectors * keep
        value = self.v_proj(hidden_states).reshape(batch, length, self.num_heads, self.head_channels, NUM_BLADES)
        initial = past_key_values.get_rotor(self.layer_idx) if past_key_values is not None else None
        output, state = recursive_rotor_accumulator(
            bivectors, value, initial=initial, kernel=self.config.rra_kernel, local_bivectors=local
        )
        if past_key_values is not None:
            past_key_values.set_rotor(state, self.layer_idx)
        return self.o_proj(output.reshape(batch, length, -1, NUM_BLADES)), None


VERSOR_MIXER_CLASSES = {"gpa": VersorGPA, "rra": VersorRRA}


class VersorDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: VersorConfig, layer_idx: int) -> None:
        super().__init__()
        self.mixer_type = config.layer_mixer(layer_idx)
        self.mixer = VERSOR_MIXER_CLASSES[self.mixer_type](config, layer_idx)
        self.mlp = VersorMLP(config)
        self.input_layernorm = VersorNorm(config.num_channels, eps=config.rms_norm_eps)
        self.post_attention_layernorm = VersorNorm(config.num_channels, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        past_key_values: VersorCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        residual = hidden_states
        hidden_states, weights = self.mixer(
            self.input_layernorm(hidden_states),
            attention_mask,
            padding_mask,
            past_key_values=past_key_values,
            output_attentions=output_attentions,
        )
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states, weights


class VersorPreTrainedModel(GeometricPreTrainedModel):
    config_class = VersorConfig
    _no_split_modules = ["VersorDecoderLayer"]
    _supports_sdpa = True
    remote_code_auto_map = {
        "AutoConfig": "configuration_versor.VersorConfig",
        "AutoModel": "modeling_versor.VersorModel",
        "AutoModelForCausalLM": "modeling_versor.VersorForCausalLM",
        "AutoModelForSequenceClassification": "modeling_versor.VersorForSequenceClassification",
    }

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate must not build a DynamicCache: the model creates its own VersorCache
        return False

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, VersorLinear):
            hf_init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, VersorNorm):
            hf_init.ones_(module.weight)
        elif isinstance(module, VersorGPA):
            hf_init.constant_(module.gamma, float(self.config.gpa_gamma_init))


class VersorModel(VersorPreTrainedModel):
    def __init__(self, config: VersorConfig) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([VersorDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = VersorNorm(config.num_channels, eps=config.rms_norm_eps)
        self.feature_size = config.hidden_size  # 32 blades x channels, read by the heads
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
        past_key_values: VersorCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast | tuple:
        past_key_values = pop_cache_kwarg(past_key_values, kwargs)
        output_attentions, output_hidden_states, return_dict, use_cache = resolve_forward_flags(
            self, output_attentions, output_hidden_states, return_dict, use_cache
        )
        if past_key_values is not None and not isinstance(past_key_values, VersorCache):
            raise ValueError(
                f"Versor keeps its own recurrent cache; got {type(past_key_values).__name__}. Pass the cache "
                "returned by a previous Versor forward (or none)."
            )
        if use_cache and past_key_values is None:
            past_key_values = VersorCache(self.config)
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        check_inputs(self.config, input_ids, inputs_embeds, attention_mask, past_length)

        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        batch, length = inputs_embeds.shape[:2]
        mask = build_attention_mask(
            attention_mask, batch, length, past_length + length, self.config.causal, inputs_embeds.device
        )

        hidden_states = inputs_embeds.reshape(batch, length, self.config.num_channels, NUM_BLADES)
        all_hidden_states = () if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states.reshape(batch, length, -1),)
            hidden_states, weights = layer(
                hidden_states,
                attention_mask=mask,
                padding_mask=attention_mask,
                past_key_values=past_key_values,
                output_attentions=output_attentions,
            )
            if output_attentions:
                all_attentions += (weights,)
        hidden_states = self.norm(hidden_states).reshape(batch, length, -1)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)
        if past_key_values is not None:
            past_key_values.seen_tokens += length

        output = BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            **{CACHE_FIELD: past_key_values if use_cache else None},
        )
        return output if return_dict else output.to_tuple()


class VersorForCausalLM(ForCausalLMHead, VersorPreTrainedModel, GenerationMixin):
    """LM head on the final multivector features (a real linear map of all 32 x channels blades)."""

    backbone_class = VersorModel


class VersorForSequenceClassification(ForSequenceClassificationHead, VersorPreTrainedModel):
    """Classifies from the last real token's multivector features."""

    backbone_class = VersorModel


__all__ = [
    "VersorCache",
    "VersorPreTrainedModel",
    "VersorModel",
    "VersorForCausalLM",
    "VersorForSequenceClassification",
    "VersorGPA",
    "VersorRRA",
    "VersorLinear",
    "VersorNorm",
]
