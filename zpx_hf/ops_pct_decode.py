"""PCT sigmoid attention for one query row (kernel `decode`: cached decoding, one token per step).

Same function as `ops_pct_naive.pct_attention_naive` for the last position: no panels, no autograd Function,
few dispatched ops (at one row the per-op cost is the whole cost). Accumulation in float32 at least (float64
stays float64), autocast off inside the op.
"""

from __future__ import annotations

import torch

from .ops_common import autocast_off, decode_key_mask


def _as(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor.to(dtype)`, without a dispatched call when the dtype already matches."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def pct_attention_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor,
    bias: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> torch.Tensor:
    """`ops_pct_base.PCTKernel` for one query per (batch, head): out = sigmoid(tau q.K^T + b) V over the visible
    keys (others exactly 0).

    query [B, H, 1, D] is the last position: causal or not it sees every key of its document, so only padding
    and documents mask pairs (one key mask, `decode_key_mask`). Grouped keys: each key-value head's query rows
    [B, Hkv, group, D] against its keys, read once."""
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32  # promote_types(dtype, float32)
    visible = decode_key_mask(key_padding_mask, document_ids)
    batch, heads, _, dim = query.shape
    key_heads = key.shape[1]
    # query head h = kv * group + g is row g of key-value head kv (with full heads: [B, H, 1, D] as it is)
    query = query.view(batch, key_heads, heads // key_heads, dim)
    with autocast_off(query):
        raw = torch.matmul(_as(query, acc) * _as(tau, acc).view(key_heads, -1, 1), _as(key, acc).transpose(-1, -2))
        gate = torch.sigmoid(raw.add_(_as(bias, acc).view(key_heads, -1, 1)))  # tau q.k_j + b, [B, Hkv, group, Lk]
        if visible is not None:
            gate = gate.masked_fill(~visible[:, None, None, :], 0.0)  # not in place: sigmoid's backward
        out = torch.matmul(gate, _as(value, acc))
    return _as(out.view(batch, heads, 1, dim), query.dtype)


__all__ = ["pct_attention_decode"]
