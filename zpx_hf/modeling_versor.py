"""Versor models: a multivector transformer over Cl(4,1) (docs/design.md §5).

The residual stream holds C multivector channels per token (`hidden_size = 32 C`), flat `[B, L, 32 C]`
between blocks and viewed as `[B, L, C, 32]` inside them. Blocks are the shared pre-norm ones of
`modeling_common.py`:

    x = x + Mixer(Norm(x));   x = x + MLP(Norm(x))

with a grade-aware RMS norm, channel-mixing linear maps with one weight per grade (they commute with
the grade projections), a scalar-gated MLP, and a mixer per layer: geometric product attention
(`ops_gpa.py`) or the recursive rotor accumulator (`ops_rra.py`). Both take their kernel from
`attn_implementation` through the shared table (`modeling_common.ATTENTION_KERNELS`; GPA through
`ALL_ATTENTION_FUNCTIONS`): `"eager"` runs the readable references (kernel "naive"), `"sdpa"` the fast paths
(kernel "auto": Triton on CUDA, the PyTorch kernels "chunk" (GPA) and "scan" (RRA) elsewhere, RRA's "decode"
step for one token); the ops entry points resolve it.
`VersorCache` holds, per layer, the multivector keys/values of GPA layers and only the rotor state of RRA
layers (O(1) per token).

Packed rows (several documents per row, as `DataCollatorWithFlattening` and TRL's packing make) reach the
mixers as `document_ids` [B, L]: GPA attends only inside a document, RRA restarts its rotor at each one.
"""

from __future__ import annotations

import inspect
import warnings
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as hf_init

from .clifford_algebra import BIVECTOR_MASKS, NUM_BLADES, NUM_GRADES, conformal_algebra
from .configuration_versor import VersorConfig
from .modeling_blocks import derived_weight, plain_tensor
from .modeling_cache import GrowingRows
from .modeling_common import (
    ALL_ATTENTION_FUNCTIONS,
    ATTENTION_KERNELS,
    ForCausalLMHead,
    ForSequenceClassificationHead,
    GeometricDecoderLayer,
    GeometricModel,
    GeometricPreTrainedModel,
    attention_implementation,
    eager_attention_forward,
)
from .ops_common import constant_tables, upcast
from .ops_gpa import geometric_product_attention, gpa_with_weights
from .ops_rra import recursive_rotor_accumulator


class VersorCache:
    """Generation state: multivector keys/values for GPA layers, the rotor state for RRA layers.

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
        # the cached tokens' document ids (packed rows only): one tensor for every GPA layer, whose keys are the
        # same tokens
        self.key_documents: torch.Tensor | None = None
        self.lengths = [0] * len(self.mixers)
        self.key_rows = [GrowingRows() for _ in self.mixers]
        self.value_rows = [GrowingRows() for _ in self.mixers]

    @property
    def is_linear(self) -> list[bool]:
        # `generate` slices already-seen tokens off `input_ids` only for layers that are not "linear"
        # (recurrent). Every layer here counts its tokens exactly (`get_seq_length`), so continuing from a
        # returned cache with the full sequence must slice too: no layer reports itself as linear.
        return [False] * len(self.mixers)

    def __len__(self) -> int:
        return len(self.mixers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.lengths[layer_idx]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `[B, H, L, D]` keys/values of a GPA layer; returns the full cached tensors."""
        self.lengths[layer_idx] += key.shape[-2]
        key = self.key_rows[layer_idx].append(self.keys[layer_idx], key)  # torch.cat on dim -2, without the copy
        value = self.value_rows[layer_idx].append(self.values[layer_idx], value)
        self.keys[layer_idx], self.values[layer_idx] = key, value
        return key, value

    def update_documents(self, document_ids: torch.Tensor | None, layer_idx: int, length: int) -> torch.Tensor | None:
        """Document ids [B, past + L] of the GPA layers' keys once `update` appended `length` tokens with ids
        `document_ids` [B, L] (the backbone's; None: they continue each row's last document); None while every row
        is one document. The same for every GPA layer: the first of a forward extends them, the others read them.
        A chunk's id 0 continues the row's last cached document."""
        total = self.lengths[layer_idx]
        past = self.key_documents
        if past is not None and past.shape[1] == total:  # extended by an earlier GPA layer of this forward
            return past
        past_length = total - length
        if past is None:  # the cached tokens so far: one document per row (None while this chunk is one too)
            if document_ids is None:
                return None
            past = torch.zeros(document_ids.shape[0], past_length, dtype=torch.long, device=document_ids.device)
        last = past[:, -1:] if past_length else past.new_zeros(past.shape[0], 1)
        chunk = last.expand(-1, length) if document_ids is None else document_ids.to(past.device) + last
        self.key_documents = torch.cat((past, chunk), dim=1)
        return self.key_documents

    def get_rotor(self, layer_idx: int) -> torch.Tensor | None:
        return self.rotors[layer_idx]

    def set_rotor(self, rotor: torch.Tensor, layer_idx: int, length: int) -> None:
        """Store an RRA layer's state after `length` more tokens."""
        self.rotors[layer_idx] = rotor
        self.lengths[layer_idx] += length

    def _map(self, fn) -> None:
        for store in (self.keys, self.values, self.rotors):
            for i, tensor in enumerate(store):
                if tensor is not None:
                    store[i] = fn(tensor)
        if self.key_documents is not None:
            self.key_documents = fn(self.key_documents)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])


def multivectors(x: torch.Tensor) -> torch.Tensor:
    """[..., 32 C] -> [..., C, 32] (a view)."""
    return x.view(*x.shape[:-1], -1, NUM_BLADES)  # `view`, not `unflatten`: a C call, no Python wrapper


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype`, without a dispatch when it already is (decode runs one token: every op call counts)."""
    return x if x.dtype == dtype else x.to(dtype)


# VersorLinear multiplies and sums directly (no bmm and layout copies) when tokens x in x out is at most this
SMALL_PRODUCT = 8192


class VersorLinear(nn.Module):
    """Channel mixing with one weight matrix per grade: y[o, A] = sum_i W[grade(A), o, i] x[i, A].

    Commutes with grade projection (and with any grade-preserving map such as a rotor sandwich)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.weight = nn.Parameter(torch.empty(NUM_GRADES, out_channels, in_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in, 32] -> [..., out, 32]: one batched matmul over the 32 blades, or for a few tokens
        (decode) one broadcast multiply and sum, which needs fewer op calls (not under autocast, where the
        matmul sets the output dtype)."""
        if not plain_tensor(self.weight):
            return self.forward_per_grade(x)
        tokens = x.numel() // (self.in_channels * NUM_BLADES)
        # (not when exporting: the graph serves every number of tokens)
        small = not torch.compiler.is_exporting() and tokens * self.in_channels * self.out_channels <= SMALL_PRODUCT
        if small and not torch.is_autocast_enabled(x.device.type):  # [..., out, in, 32], summed over in
            weight = derived_weight(("versor_blade_weight", id(self), x.dtype), lambda: self.blade_weight(x.dtype))
            return (x.unsqueeze(-3) * weight).sum(-2)
        grades = conformal_algebra().table("grades", x.device)
        weight = self.weight.index_select(0, grades)  # [32, out, in]
        blades = x.reshape(-1, self.in_channels, NUM_BLADES).permute(2, 0, 1)  # [32, N, in]
        out = torch.bmm(blades, cast(weight, x.dtype).transpose(1, 2))  # [32, N, out]
        return out.permute(1, 2, 0).reshape(*x.shape[:-2], self.out_channels, NUM_BLADES)

    def forward_per_grade(self, x: torch.Tensor) -> torch.Tensor:
        """The same map as one `F.linear` per grade on `weight[g]`: for a weight that is not a plain tensor
        (torchao's quantised [6, out, in] implements `select` and `F.linear`, not the fused path's views)."""
        order, inverse, counts = grade_order(x.device)
        parts = x.index_select(-1, order).split(counts, dim=-1)  # per grade [..., in, blades of g]
        out = [F.linear(part.transpose(-1, -2), self.weight[g]).transpose(-1, -2) for g, part in enumerate(parts)]
        return torch.cat(out, dim=-1).index_select(-1, inverse)

    def blade_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """[out, in, 32] (the grade weight of every blade), contiguous, in `dtype`; kept per `generate` call."""
        grades = conformal_algebra().table("grades", self.weight.device)
        return cast(self.weight.permute(1, 2, 0).index_select(-1, grades), dtype)

    def scalar_part(self, x: torch.Tensor) -> torch.Tensor:
        """<forward(x)>_0 `[..., out]` alone: the scalar blade is mixed by the grade-0 weight only. It reads the
        weight outside `forward`, so callers use it only where `runs_plain(self)` (`versor_scalar_part`)."""
        return F.linear(x[..., 0], cast(self.weight[0], x.dtype))

    def extra_repr(self) -> str:
        return f"{self.in_channels} -> {self.out_channels} channels, {NUM_GRADES} grades"


def runs_plain(layer: nn.Module) -> TypeGuard[VersorLinear]:
    """Whether `layer` is a bare `VersorLinear` whose call is its own `forward`: not a subclass or PEFT wrapper, no
    hooks, no instance-level forward (accelerate's offloading hooks load the weight in one; reading the weight
    outside the call would see it on the meta device)."""
    return (
        type(layer) is VersorLinear
        and not (layer._forward_hooks or layer._forward_pre_hooks)
        and "forward" not in layer.__dict__
    )


def versor_scalar_part(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """<layer(x)>_0 `[..., out]`: the grade-0 GEMM alone for a bare `VersorLinear`, else the module's own call
    (whatever wraps or hooks it sees the input and loads the weight), scalar blade taken after."""
    return layer.scalar_part(x) if runs_plain(layer) else layer(x)[..., 0]


@constant_tables
def grade_order(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(blades sorted by grade, the inverse permutation, blades per grade: 1, 5, 10, 10, 5, 1); the grade of
    blade A is the number of generators in its mask."""
    order = sorted(range(NUM_BLADES), key=lambda mask: bin(mask).count("1"))
    counts = [sum(bin(mask).count("1") == grade for mask in order) for grade in range(NUM_GRADES)]
    inverse = sorted(range(NUM_BLADES), key=order.__getitem__)
    return torch.tensor(order, device=device), torch.tensor(inverse, device=device), counts


@constant_tables
def grade_mean_tables(
    channels: int, eps: float, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(`[C * 32, 6]` table, `[6]` eps): eps + (x^2 flattened) @ table = eps + mean over channels of each
    grade's squared norm, in one `addmm`."""
    onehot = conformal_algebra().table("grade_onehot", torch.device("cpu"), torch.float64)
    table = (onehot / channels).repeat(channels, 1).to(device=device, dtype=dtype)
    return table, torch.full((NUM_GRADES,), eps, device=device, dtype=dtype)


class VersorNorm(nn.Module):
    """Grade-aware RMS norm: each grade g is divided by sqrt(mean_c ||x_{c,g}||^2 + eps) (Euclidean norm of
    its coefficients, averaged over channels), then scaled by a learned weight per (channel, grade)."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels, NUM_GRADES))
        self.variance_epsilon = eps

    @classmethod
    def from_config(cls, config: VersorConfig) -> VersorNorm:
        return cls(config.num_channels, eps=config.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., 32 C] -> [..., 32 C], computed in at least float32."""
        input_dtype = x.dtype
        x = multivectors(upcast(x))
        squares = x.square().reshape(-1, x.shape[-2] * NUM_BLADES)
        table, eps = grade_mean_tables(x.shape[-2], self.variance_epsilon, x.device, x.dtype)
        per_grade = torch.addmm(eps, squares, table)  # mean_c ||x_{c,g}||^2 + eps, [N, 6]
        scale = torch.rsqrt(per_grade).view(*x.shape[:-2], 1, NUM_GRADES) * upcast(self.weight)
        spread = conformal_algebra().table("grade_spread", x.device, x.dtype)  # [6, 32]
        return cast((x * (scale @ spread)).flatten(-2), input_dtype)


class VersorMLP(nn.Module):
    """down(up(x) * silu(<gate(x)>_0)): the scalar part of each gate channel gates a whole multivector."""

    def __init__(self, config: VersorConfig) -> None:
        super().__init__()
        inner = config.intermediate_size // NUM_BLADES
        self.gate_proj = VersorLinear(config.num_channels, inner)
        self.up_proj = VersorLinear(config.num_channels, inner)
        self.down_proj = VersorLinear(inner, config.num_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., 32 C] -> [..., 32 C]."""
        x = multivectors(x)
        gate = F.silu(versor_scalar_part(self.gate_proj, x)).unsqueeze(-1)
        return self.down_proj(self.up_proj(x) * gate).flatten(-2)


class VersorGPA(nn.Module):
    """Geometric product attention; the cache stores multivector keys/values `[B, Hkv, L, 32 c]` (grouped-query
    when `num_key_value_heads` < `num_attention_heads`; gamma per query head)."""

    def __init__(self, config: VersorConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.head_channels = config.head_channels
        self.scaling = config.head_dim**-0.5
        self.is_causal = config.causal
        inner = self.num_heads * self.head_channels
        key_inner = self.num_key_value_heads * self.head_channels
        self.q_proj = VersorLinear(config.num_channels, inner)
        self.k_proj = VersorLinear(config.num_channels, key_inner)
        self.v_proj = VersorLinear(config.num_channels, key_inner)
        self.o_proj = VersorLinear(inner, config.num_channels)
        self.gamma = nn.Parameter(torch.full((self.num_heads,), float(config.gpa_gamma_init)))

    def project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query [B, H, L, 32 c], key and value [B, Hkv, L, 32 c]) from the normed stream [B, L, 32 C]."""
        batch, length = hidden_states.shape[:2]
        x = multivectors(hidden_states)

        def heads(y: torch.Tensor) -> torch.Tensor:  # [B, L, heads*c, 32] -> [B, heads, L, 32 c]
            return y.reshape(batch, length, -1, self.head_channels * NUM_BLADES).transpose(1, 2)

        return heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: Any = None,
        padding_mask: torch.Tensor | None = None,
        past_key_values: VersorCache | None = None,
        output_attentions: bool = False,
        kv_length: int | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        batch, length = hidden_states.shape[:2]
        query, key, value = self.project(hidden_states)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
            document_ids = past_key_values.update_documents(document_ids, self.layer_idx, length)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            attention_implementation(self.config, output_attentions), eager_attention_forward
        )
        output, weights = attention_interface(
            self, query, key, value, padding_mask, scaling=self.scaling, document_ids=document_ids
        )
        output = output.transpose(1, 2).reshape(batch, length, -1, NUM_BLADES)
        return self.o_proj(output).flatten(-2), weights, None

    def attention_op(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        *,
        kernel: str,
        scaling: float,
        document_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The op on multivector heads (q [B, H, Lq, 32 c], k and v [B, Hkv, Lk, 32 c]) with this layer's gamma:
        kernel "naive" also returns the weights the output is computed from (`gpa_with_weights`), the others run
        the entry (`ops_gpa.geometric_product_attention`) and return none."""
        causal, eps, bivector = self.is_causal, self.config.gpa_eps, self.config.gpa_bivector
        if kernel == "naive":
            return gpa_with_weights(
                query, key, value, self.gamma, causal=causal, key_padding_mask=key_padding_mask,
                document_ids=document_ids, scaling=scaling, eps=eps, bivector=bivector,
            )  # fmt: skip
        output = geometric_product_attention(
            query, key, value, self.gamma, causal=causal, key_padding_mask=key_padding_mask,
            document_ids=document_ids, scaling=scaling, eps=eps, bivector=bivector, kernel=kernel,
        )  # fmt: skip
        return output, None


class VersorRRA(nn.Module):
    """Recursive rotor accumulator: B_t = s tanh(W x_t) per head, R_t = R_{t-1} exp(-B_t/2), y_t = R_t v_t ~R_t.

    With `rra_accumulate="compact"` the rotation part of B_t is accumulated and the boost part applied per
    token (see `ops_rra.py`). Padding tokens get B_t = 0 (identity rotor). The cache keeps the rotor state
    only."""

    def __init__(self, config: VersorConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_channels = config.head_channels
        inner = self.num_heads * self.head_channels
        self.bivector_proj = nn.Linear(config.hidden_size, self.num_heads * len(BIVECTOR_MASKS), bias=True)
        self.bivector_scale = float(config.rra_bivector_scale)
        self.v_proj = VersorLinear(config.num_channels, inner)
        self.o_proj = VersorLinear(inner, config.num_channels)

    def bivectors(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """B_t = s tanh(W x_t), float32 [B, L, H, 10] (BIVECTOR_MASKS order) from the normed stream."""
        bivectors = torch.tanh(upcast(self.bivector_proj(hidden_states)))
        if self.bivector_scale != 1.0:
            bivectors = self.bivector_scale * bivectors
        return bivectors.view(*bivectors.shape[:-1], self.num_heads, len(BIVECTOR_MASKS))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: Any = None,
        padding_mask: torch.Tensor | None = None,
        past_key_values: VersorCache | None = None,
        output_attentions: bool = False,
        kv_length: int | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, None, None]:
        batch, length = hidden_states.shape[:2]
        bivectors = self.bivectors(hidden_states)
        if padding_mask is not None:  # [B, past + L] -> this chunk's tokens
            bivectors = bivectors * padding_mask[:, -length:, None, None].to(bivectors.dtype)
        value = self.v_proj(multivectors(hidden_states))
        value = value.reshape(batch, length, self.num_heads, self.head_channels, NUM_BLADES)
        initial = past_key_values.get_rotor(self.layer_idx) if past_key_values is not None else None
        implementation = attention_implementation(self.config)
        output, state = recursive_rotor_accumulator(
            bivectors,
            value,
            accumulate=self.config.rra_accumulate,
            initial=initial,
            document_ids=document_ids,  # the backbone's, this chunk's tokens [B, L], as computed
            kernel=ATTENTION_KERNELS[implementation],  # no attention matrix: the same table picks its kernel
        )
        if past_key_values is not None:
            past_key_values.set_rotor(state, self.layer_idx, length)
        return self.o_proj(output.reshape(batch, length, -1, NUM_BLADES)).flatten(-2), None, None


VERSOR_MIXER_CLASSES = {"gpa": VersorGPA, "rra": VersorRRA}

# `GenerationConfig` fields that turn `generate` into assisted decoding (besides `assistant_model`)
ASSISTED_GENERATION_FIELDS = ("prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp")
_GENERATE_SIGNATURE = inspect.signature(GenerationMixin.generate)


class VersorDecoderLayer(GeometricDecoderLayer):
    mixer_name = "mixer"
    mlp_class = VersorMLP
    norm_class = VersorNorm

    def __init__(self, config: VersorConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.mixer_type = config.layer_mixer(layer_idx)  # "gpa" or "rra"

    def mixer_class_for(self, config: VersorConfig, layer_idx: int) -> type[nn.Module]:
        return VERSOR_MIXER_CLASSES[config.layer_mixer(layer_idx)]


class VersorPreTrainedModel(GeometricPreTrainedModel):
    config_class = VersorConfig
    if TYPE_CHECKING:  # for the type checker only (transformers would read the annotation as config_class)
        config: VersorConfig
    _no_split_modules = ["VersorDecoderLayer"]
    softmax_engine_refusal = (
        "Versor's GPA score adds the norm of a bivector (not a dot product) and RRA layers keep a recurrent rotor "
        "state, not keys and values"
    )

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate must not build a DynamicCache: the model creates its own VersorCache
        return False

    def _prepare_cache_for_generation(self, generation_config: Any, *args: Any, **kwargs: Any) -> Any:
        # transformers says this once per process (a logger's warning_once); say it on every such call
        if generation_config.cache_implementation is not None:
            warnings.warn(
                f"cache_implementation={generation_config.cache_implementation!r} is ignored by Versor: it keeps "
                "its own VersorCache (GPA keys grow by one token per step, RRA carries a fixed rotor state); the "
                "tokens are the same.",
                UserWarning,
                stacklevel=3,
            )
        # misc: GenerationMixin's, after this class in the MRO of VersorForCausalLM (the one class that generates)
        return super()._prepare_cache_for_generation(generation_config, *args, **kwargs)  # type: ignore[misc]

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, VersorLinear):
            hf_init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, VersorNorm):
            hf_init.ones_(module.weight)
        elif isinstance(module, VersorGPA):
            hf_init.constant_(module.gamma, float(self.config.gpa_gamma_init))


class VersorModel(GeometricModel, VersorPreTrainedModel):
    """Shared backbone with multivector layers and the recurrent `VersorCache`. No positional encoding
    (`rotary="none"`): order enters through the causal mask and the rotor recursion."""

    decoder_layer_class = VersorDecoderLayer
    norm_class = VersorNorm

    def new_cache(self) -> VersorCache:
        return VersorCache(self.config)

    def check_cache(self, cache: Any) -> None:
        if cache is not None and not isinstance(cache, VersorCache):
            raise ValueError(
                f"Versor keeps its own recurrent cache; got {type(cache).__name__}. Pass the cache returned by a "
                "previous Versor forward (or none). PEFT prefix tuning passes such a cache and does not apply to "
                "Versor: use LoRA or prompt tuning."
            )


def warn_unquantized_projections(model: Any, args: Any) -> None:
    """Forward pre-hook of the Versor heads (`model`: VersorForCausalLM or VersorForSequenceClassification):
    quantisers that pick `nn.Linear`s (torchao's default `quantize_` filter, transformers' `TorchAoConfig`,
    bitsandbytes) skip every `VersorLinear`, so the model would run with its head (or nothing at all) quantised and
    its projections in float, without a word. Checked once per head weight (quantising replaces it) and
    quantization config; skipped while compiling."""
    if torch.compiler.is_compiling():
        return
    head = model.get_output_embeddings() if hasattr(model, "lm_head") else model.score
    quantization = getattr(model.config, "quantization_config", None)
    key = (id(head.weight), id(quantization))
    if model.__dict__.get("_quantization_checked") == key:
        return
    model._quantization_checked = key
    if plain_tensor(head.weight) and quantization is None:
        return
    projections = [module for module in model.modules() if isinstance(module, VersorLinear)]
    if projections and all(plain_tensor(module.weight) for module in projections):
        warnings.warn(
            f"{type(model).__name__} is quantized (its nn.Linear head, or `quantization_config`) but none of its "
            f"{len(projections)} VersorLinear projections is: torchao's default filter and TorchAoConfig pick "
            "nn.Linear only. Use quantize_(model, config, filter_fn=zpx_hf.integration_torchao.is_projection), or "
            "from_pretrained(..., quantization_config=TorchAoConfig(zpx_hf.integration_torchao.projection_config("
            "config))).",
            UserWarning,
            stacklevel=2,
        )


class VersorForCausalLM(ForCausalLMHead, VersorPreTrainedModel, GenerationMixin):
    """LM head on the final multivector features (a real linear map of all 32 x channels blades)."""

    backbone_class = VersorModel

    def __init__(self, config: VersorConfig) -> None:
        super().__init__(config)
        self.register_forward_pre_hook(warn_unquantized_projections)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        # Assisted (speculative) decoding crops the cache back to the accepted draft tokens; an RRA rotor state is
        # a running product and cannot be cropped. Refused here, from generate's public arguments, so the message
        # is ours on every transformers version (5.25 dropped the `_is_stateful` hook it used to honour).
        arguments = _GENERATE_SIGNATURE.bind_partial(self, *args, **kwargs).arguments
        config = arguments.get("generation_config") or self.generation_config
        values = {"assistant_model": arguments.get("assistant_model")}
        values.update({field: kwargs.get(field, getattr(config, field, None)) for field in ASSISTED_GENERATION_FIELDS})
        requested = [field for field, value in values.items() if value not in (None, False)]
        if requested:
            raise ValueError(
                f"{type(self).__name__} cannot do assisted decoding (set by {', '.join(requested)}): Versor is "
                "stateful, its RRA rotor state cannot be cropped back to the accepted draft tokens. Generate without "
                "an assistant model or prompt lookup."
            )
        return super().generate(*args, **kwargs)


class VersorForSequenceClassification(ForSequenceClassificationHead, VersorPreTrainedModel):
    """Classifies from the last real token's multivector features."""

    backbone_class = VersorModel

    def __init__(self, config: VersorConfig) -> None:
        super().__init__(config)
        self.register_forward_pre_hook(warn_unquantized_projections)


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
