"""PCT sigmoid attention, the readable formula (docs/design.md §4.1): every gate materialised, plain autograd.

After the complex L2 normalisation and rotation (done by the model), a PCT head is real sigmoid
attention on the real head dim D = 2d, with q, k, v laid out [re | im]:

    raw_ij = q_i . k_j                    (= Re sum_m q_im conj(k_jm))
    a_ij   = sigmoid(tau_h raw_ij + b_h)  if key j is visible to query i, else exactly 0
    out_i  = sum_j a_ij v_j               (no row max, no normaliser)

Key j is visible to query i iff `key_padding_mask[b, j]` (when given) and, when causal,
j <= i + (Lk - Lq) (the Lq queries are the last positions, as with a KV cache).

This file also holds the input contract shared by every implementation (`prepare_inputs`).
Gates are computed in float32 at least (float64 stays float64) with autocast off, so bf16/fp16
inputs change only the rounding of q, k, v, never the gate arithmetic. Memory O(B H Lq Lk).
"""

from __future__ import annotations

import contextlib

import torch

from .modeling_blocks import visible_keys


def autocast_off(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """Autocast disabled on `tensor`'s device (a no-op context when it is off already)."""
    if torch.is_autocast_enabled(tensor.device.type):
        return torch.autocast(tensor.device.type, enabled=False)
    return contextlib.nullcontext()


def per_head(value: torch.Tensor | float, name: str, num_heads: int, device: torch.device) -> torch.Tensor:
    """`tau` or `bias` as a vector [H] of at least float32 precision (a scalar is broadcast to every head)."""
    if (
        isinstance(value, torch.Tensor)
        and value.shape == (num_heads,)
        and value.dtype in (torch.float32, torch.float64)
    ):
        return value if value.device == device else value.to(device)  # the common case (a parameter)
    value = torch.as_tensor(value, device=device)
    if not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"`{name}` must be a real number or a float tensor [H]; got dtype {value.dtype}.")
    value = value.to(torch.promote_types(value.dtype, torch.float32))
    if value.numel() == 1:
        return value.reshape(1).expand(num_heads)
    if value.shape != (num_heads,):
        raise ValueError(
            f"`{name}` is per-head: it must have shape [{num_heads}] (one per head) or be a scalar; "
            f"got {tuple(value.shape)}."
        )
    return value


def prepare_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    tau: torch.Tensor | float,
    bias: torch.Tensor | float,
    key_padding_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Check shapes (ValueError naming the argument) and return (tau [H], bias [H], mask [B, Lk] bool or None)."""
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(f"`query` and `key` must be [B, H, L, D]; got {tuple(query.shape)} and {tuple(key.shape)}.")
    if not query.is_floating_point():
        raise ValueError(f"`query` must be a float tensor; got {query.dtype}.")
    if value is not None and value.shape != key.shape:
        raise ValueError(f"`value` must have the shape of `key` {tuple(key.shape)}; got {tuple(value.shape)}.")
    if query.shape[:2] != key.shape[:2] or query.shape[-1] != key.shape[-1]:
        raise ValueError(f"`query` {tuple(query.shape)} and `key` {tuple(key.shape)} disagree on B, H or D.")
    if query.shape[2] > key.shape[2]:
        raise ValueError(
            f"`query` has more positions ({query.shape[2]}) than `key` ({key.shape[2]}): queries are the last "
            "Lq <= Lk positions."
        )
    batch, heads, _, _ = query.shape
    if key_padding_mask is not None:
        if key_padding_mask.shape != (batch, key.shape[2]):
            raise ValueError(
                f"`key_padding_mask` must be [B={batch}, Lk={key.shape[2]}]; got {tuple(key_padding_mask.shape)}."
            )
        key_padding_mask = key_padding_mask.to(device=query.device, dtype=torch.bool)
    return (
        per_head(tau, "tau", heads, query.device),
        per_head(bias, "bias", heads, query.device),
        key_padding_mask,
    )


def gates(
    query: torch.Tensor,
    key: torch.Tensor,
    tau: torch.Tensor,
    bias: torch.Tensor,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
) -> torch.Tensor:
    """a_ij = sigmoid(tau_h q_i.k_j + b_h) on visible pairs, exactly 0 elsewhere; [B, H, Lq, Lk], >= float32."""
    acc = torch.promote_types(query.dtype, torch.float32)
    with autocast_off(query):
        raw = query.to(acc) @ key.to(acc).transpose(-1, -2)
        gate = torch.sigmoid(tau.to(acc)[:, None, None] * raw + bias.to(acc)[:, None, None])
    mask = visible_keys(query.shape[2], key.shape[2], causal, key_padding_mask, query.device)
    return gate if mask is None else gate.masked_fill(~mask, 0.0)


def pct_attention_naive(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor | float,
    bias: torch.Tensor | float,
    *,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """out_i = sum_j sigmoid(tau q_i.k_j + b) v_j over visible pairs, materialising every gate (module doc)."""
    tau, bias, key_padding_mask = prepare_inputs(query, key, value, tau, bias, key_padding_mask)
    gate = gates(query, key, tau, bias, causal, key_padding_mask)
    with autocast_off(query):
        return (gate @ value.to(gate.dtype)).to(query.dtype)


__all__ = ["autocast_off", "gates", "pct_attention_naive", "per_head", "prepare_inputs"]
