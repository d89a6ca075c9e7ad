"""Building blocks shared by the ZPX, PCT and Versor families.

Llama-style pieces (RMSNorm, SwiGLU), input checks, positions, attention masks, last-token pooling, and
the one place that knows how the installed transformers names the KV cache argument (`past_key_values`
up to 5.2x, `cache` later). The backbone and heads that use them live in `modeling_common.py`.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from transformers.modeling_outputs import CausalLMOutputWithPast

from .ops_common import upcast

# Name of the cache field in HF outputs and the kwarg `generate` passes to `forward`.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def pop_cache_kwarg(past_key_values: Any, kwargs: dict) -> Any:
    """Accept the cache under either name (`past_key_values` or, in newer transformers, `cache`)."""
    cache = kwargs.pop("cache", None)
    return past_key_values if past_key_values is not None else cache


# Weights derived from parameters (stacked, fused) kept for the span of one `generate` call, where parameters
# cannot change; outside it they are rebuilt on every call (a copy kept longer could go stale: writes through
# `.data`, as PEFT's merge does, leave no trace on a parameter).
_DERIVED_WEIGHTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("derived_weights", default=None)


@contextlib.contextmanager
def keep_derived_weights() -> Iterator[None]:
    """Inside: `derived_weight` builds each derived weight once; on exit every kept weight is dropped."""
    token = _DERIVED_WEIGHTS.set({})
    try:
        yield
    finally:
        _DERIVED_WEIGHTS.reset(token)


def plain_tensor(tensor: torch.Tensor | None) -> bool:
    """Whether `tensor` is None or a plain tensor / parameter, not a tensor subclass (torchao's quantised weights
    are one: they implement `F.linear` and a few views, not the `.t()` / `torch.cat` / `torch.mm` of fused paths)."""
    # (tracing tensors of torch.export / compile are subclasses too, but not wrapper subclasses)
    return tensor is None or not is_traceable_wrapper_subclass(tensor)


def plain_linears(modules: tuple[nn.Module | None, ...]) -> bool:
    """Whether every module is an `nn.Linear` whose call is exactly `F.linear(x, weight, bias)` on plain tensors:
    not a subclass (LoRA), no quantised weight (`plain_tensor`), no hooks, no instance-level forward
    (accelerate's offloading hooks replace it). Fused fast paths run only then; otherwise each module runs as
    itself, so whatever wraps it sees its input."""
    for module in modules:
        if type(module) is not nn.Linear or module._forward_hooks or module._forward_pre_hooks:
            return False
        if "forward" in module.__dict__ or not (plain_tensor(module.weight) and plain_tensor(module.bias)):
            return False
    return True


def derived_weights_kept() -> bool:
    """Whether `derived_weight` keeps what it builds here (inside `generate`, eager, no gradient): a path that
    pays a weight concatenation per call only where it is paid once."""
    if torch.compiler.is_compiling() or torch.is_grad_enabled():  # (compiled graphs cannot read a ContextVar)
        return False
    return _DERIVED_WEIGHTS.get() is not None


def derived_weight(key: tuple, build: Callable[[], Any]) -> Any:
    """`build()`, kept under `key` while `keep_derived_weights` is active (and no gradient is recorded)."""
    kept = _DERIVED_WEIGHTS.get() if derived_weights_kept() else None
    if kept is None:
        return build()
    if key not in kept:
        kept[key] = build()
    return kept[key]


def row_major_transpose(weights: list[torch.Tensor]) -> torch.Tensor:
    """[W_1; W_2; ...]^T [K, N_1 + N_2 + ...] stored row-major (one copy): for the few rows of a decoding step,
    a CPU GEMM mostly reads a row-major W^T faster than the [N, K] weight `F.linear` passes it (the weights
    do not fit in cache, so the matrix read is the step's cost): benchmarks/results/bench_row_major.md."""
    return torch.cat([weight.t() for weight in weights], dim=1)


def stacked_bias(linears: tuple[nn.Linear, ...]) -> torch.Tensor | None:
    """The biases of `linears` side by side; a missing bias is zeros when another has one, None when none has."""
    if all(linear_bias(linear) is None for linear in linears):
        return None
    biases = [linear_bias(linear) for linear in linears]
    return torch.cat(
        [b if b is not None else linear.weight.new_zeros(len(linear.weight)) for b, linear in zip(biases, linears)]
    )


def linear_bias(linear: nn.Linear) -> torch.Tensor | None:
    """`linear.bias`: None for `bias=False` (torch annotates the attribute as always a Parameter)."""
    return linear.bias


def kept_linear(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> torch.Tensor | None:
    """The outputs of `linears` side by side, from a row-major copy of their stacked weights kept for the span of
    one `generate` call on CPU (`row_major_transpose`; it holds one more copy of those weights meanwhile). None
    elsewhere (training, outside `generate`, other devices, wrapped or hooked linears): call the modules."""
    if x.device.type != "cpu" or not derived_weights_kept() or not plain_linears(linears):
        return None
    return stacked_linear(x, linears)


def stacked_linear(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """The outputs of plain `linears` side by side as one GEMM on their stacked W^T (row-major), built on every
    call or once per `generate` call (`derived_weight`)."""
    weight_t, bias = derived_weight(
        ("row_major", *map(id, linears)),
        lambda: (row_major_transpose([linear.weight for linear in linears]), stacked_bias(linears)),
    )
    out = torch.mm(x.view(-1, x.shape[-1]) if x.is_contiguous() else x.reshape(-1, x.shape[-1]), weight_t)
    if bias is not None:
        out = out.add_(bias)  # (an `addmm` reads the matrix more slowly here)
    return out.view(*x.shape[:-1], weight_t.shape[1])


def module_from_config(module_class: type[nn.Module], config: Any) -> nn.Module:
    """A module class a family declares (embedding, MLP, norm) built from the config: by its `from_config` where
    it sizes itself from config fields (shared modules: `RMSNorm`, `SwiGLUMLP`), torch's `nn.Embedding` as the
    token table [vocab_size, hidden_size] with the padding row, any other as `module_class(config)`."""
    from_config = getattr(module_class, "from_config", None)
    if from_config is not None:
        return from_config(config)
    if module_class is nn.Embedding:
        return nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
    return module_class(config)


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in float32 (Llama's RMSNorm)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    @classmethod
    def from_config(cls, config: Any) -> RMSNorm:
        return cls(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        shape = (hidden_states.shape[-1],)
        if input_dtype == self.weight.dtype and input_dtype in (torch.float32, torch.float64):
            # torch's rms_norm: one call (forward and backward) for Llama's pow, mean, add, rsqrt and two muls
            return F.rms_norm(hidden_states, shape, self.weight, self.variance_epsilon)
        hidden_states = F.rms_norm(upcast(hidden_states), shape, eps=self.variance_epsilon)
        if hidden_states.dtype != input_dtype:
            hidden_states = hidden_states.to(input_dtype)
        return self.weight * hidden_states

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with Llama's parameter names."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    @classmethod
    def from_config(cls, config: Any) -> SwiGLUMLP:
        return cls(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = kept_linear(x, (self.gate_proj, self.up_proj))  # decoding on CPU: one GEMM for both
        if gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = gate_up.chunk(2, dim=-1)
        hidden = F.silu(gate) * up
        down = kept_linear(hidden, (self.down_proj,))
        return down if down is not None else self.down_proj(hidden)


def check_inputs(
    config: Any,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    past_length: int,
    embedding_width: int | None = None,
    embedding_dtype: torch.dtype | None = None,
) -> None:
    """Fail early, naming the argument, on inputs the model cannot handle.

    The value checks read tensors back to the host, so they run in eager mode only: under `torch.compile`
    they are skipped and the compiled graph has no breaks (shape checks still run, they are free).
    """
    check_values = not torch.compiler.is_compiling()
    if input_ids is not None and inputs_embeds is None:
        if input_ids.dim() != 2:
            raise ValueError(f"`input_ids` must be [batch, seq_len]; got shape {tuple(input_ids.shape)}.")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"`input_ids` must be an integer tensor; got {input_ids.dtype}.")
        if check_values and input_ids.numel():
            low, high = value_range(input_ids)
            if low < 0 or high >= config.vocab_size:
                raise ValueError(
                    f"`input_ids` must lie in [0, vocab_size={config.vocab_size}); got values in [{low}, {high}]. "
                    "Check the tokenizer matches the model."
                )
        batch, length = input_ids.shape
    elif inputs_embeds is not None and input_ids is None:
        if inputs_embeds.dim() != 3:
            raise ValueError(
                f"`inputs_embeds` must be [batch, seq_len, features]; got shape {tuple(inputs_embeds.shape)}."
            )
        if embedding_width is not None and inputs_embeds.shape[-1] != embedding_width:
            raise ValueError(
                f"`inputs_embeds` must have {embedding_width} features per token (the width of "
                f"`get_input_embeddings()`); got {inputs_embeds.shape[-1]}."
            )
        if (
            embedding_dtype is not None
            and inputs_embeds.dtype != embedding_dtype
            and not torch.is_autocast_enabled(inputs_embeds.device.type)
        ):
            raise ValueError(
                f"`inputs_embeds` are {inputs_embeds.dtype} but the model computes in {embedding_dtype}; cast them "
                "with `inputs_embeds.to(model.dtype)` (or the model with `model.to(dtype)`)."
            )
        if check_values and not torch.isfinite(inputs_embeds).all():
            raise ValueError("`inputs_embeds` contains NaN or Inf.")
        batch, length = inputs_embeds.shape[:2]
    else:
        raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`.")
    if batch == 0 or length == 0:
        name = "input_ids" if input_ids is not None else "inputs_embeds"
        raise ValueError(
            f"`{name}` is empty (batch={batch}, seq_len={length}): pass at least one sequence of at least one "
            "token. To `generate` from nothing, start the prompt with the BOS token (`config.bos_token_id`)."
        )
    if attention_mask is not None:
        if (
            attention_mask.dim() != 2
            or attention_mask.shape[0] != batch
            or attention_mask.shape[1] != past_length + length
        ):
            raise ValueError(
                f"`attention_mask` must be [batch={batch}, past+current={past_length + length}]; got shape "
                f"{tuple(attention_mask.shape)}."
            )
        if (
            check_values
            and attention_mask.dtype != torch.bool
            and attention_mask.numel()
            and not is_zero_one(attention_mask)
        ):
            raise ValueError(
                "`attention_mask` must hold only 0 (padding) and 1 (real token); got other values. Pass a 0/1 "
                "padding mask, not additive biases or weights."
            )
    if position_ids is not None:
        if (
            position_ids.dim() not in (1, 2)
            or position_ids.shape[-1] != length
            or (position_ids.dim() == 2 and position_ids.shape[0] not in (1, batch))
        ):
            raise ValueError(
                f"`position_ids` must be [batch={batch}, seq_len={length}] (or [1, seq_len] or [seq_len], shared by "
                f"every row); got shape {tuple(position_ids.shape)}."
            )
        if position_ids.dtype.is_floating_point or position_ids.dtype.is_complex or position_ids.dtype == torch.bool:
            raise ValueError(f"`position_ids` must be an integer tensor; got {position_ids.dtype}.")
        if check_values and position_ids.numel():
            low, high = value_range(position_ids)
            if low < 0:
                raise ValueError(f"`position_ids` must be >= 0; got {low}. Derive them from the attention mask.")
            if high >= config.max_position_embeddings and not config.allow_longer_positions:
                raise ValueError(
                    f"`position_ids` reach {high}, beyond `max_position_embeddings`={config.max_position_embeddings}; "
                    "pass smaller positions or set `allow_longer_positions=True` in the config."
                )
    total = past_length + length
    if total > config.max_position_embeddings and not config.allow_longer_positions:
        raise ValueError(
            f"sequence length {total} exceeds `max_position_embeddings`={config.max_position_embeddings}; "
            "truncate the input or set `allow_longer_positions=True` in the config."
        )


def value_range(x: torch.Tensor) -> tuple[int, int]:
    """(min, max) of an integer tensor in one reduction."""
    low, high = torch.aminmax(x)
    return int(low), int(high)


def is_zero_one(mask: torch.Tensor) -> bool:
    """Whether every value of `mask` is 0 or 1 (for integers the range decides: one reduction)."""
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        return bool(((mask == 0) | (mask == 1)).all())
    low, high = value_range(mask)
    return low >= 0 and high <= 1


def default_position_ids(
    attention_mask: torch.Tensor | None, past_length: int, length: int, device: torch.device
) -> torch.Tensor:
    """Positions for the current tokens: counted over real tokens when a padding mask is given
    (so left-padded prompts start at 0), else `past_length + arange(length)`."""
    if attention_mask is not None:
        positions = attention_mask.long().cumsum(-1) - 1
        positions = positions.clamp(min=0)
        return positions[:, past_length : past_length + length].to(device)
    return torch.arange(past_length, past_length + length, device=device)[None]


def pool_last_token(
    hidden_states: torch.Tensor, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, pad_token_id: Any
) -> torch.Tensor:
    """Features of the last real token of each sequence (right or left padding both work)."""
    batch, length = hidden_states.shape[:2]
    if attention_mask is not None:
        # last index where the mask is 1
        index = torch.arange(length, device=hidden_states.device)
        last = (attention_mask.to(hidden_states.device).long() * index).argmax(-1)
    elif input_ids is not None and pad_token_id is not None:
        non_pad = (input_ids != pad_token_id).long().to(hidden_states.device)
        index = torch.arange(length, device=hidden_states.device)
        last = (non_pad * index).argmax(-1)
    else:
        last = torch.full((batch,), length - 1, device=hidden_states.device, dtype=torch.long)
    return hidden_states[torch.arange(batch, device=hidden_states.device), last]


def init_bias_log_context(length: int) -> float:
    """-log(n): sigmoid-attention bias initialisation for a context of n tokens (arXiv 2409.04431)."""
    return -math.log(max(int(length), 2))
