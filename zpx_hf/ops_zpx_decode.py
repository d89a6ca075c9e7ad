"""ZPX angle-sphere attention for one query row (kernel `decode`: cached decoding, one token per step).

The last position sees every key of its document, so causality hides nothing and only padding and documents
mask keys (`ops_common.decode_key_mask`). softmax(q^ k^T) v as two batched GEMMs over [B*Hkv], each key-value
head's group of query rows against its keys read once (cheaper than a fused kernel's launch at one row), v
keeping its own head dim. Same function as `ops_zpx_naive` for one row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops_common import decode_key_mask, upcast
from .ops_zpx_base import augment_query


def zpx_attention_decode(
    query: torch.Tensor,
    key_aug: torch.Tensor,
    value: torch.Tensor,
    query_features: torch.Tensor,
    *,
    causal: bool,
    scaling: float,
    lambda_angle: float,
    lambda_sphere: float,
    dropout: float,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, None]:
    """`ops_zpx_base.ZPXKernel` for query [B, H, 1, d] (the entry never sends dropout here); returns (output
    [B, 1, H, dv], None)."""
    batch, heads, _, _ = query.shape
    key_heads, k_len = key_aug.shape[1:3]
    group = heads // key_heads
    query_aug = augment_query(query, query_features, scaling, lambda_angle, lambda_sphere)
    # [B*Hkv, group, W] x [B*Hkv, W, Lk]: query head h = kv * group + g is row g of key-value head kv
    rows = query_aug.reshape(batch * key_heads, group, -1)
    scores = torch.bmm(rows, key_aug.flatten(0, 1).transpose(1, 2))  # [B*Hkv, group, Lk]
    visible = decode_key_mask(key_padding_mask, document_ids)
    if visible is not None:
        visible = visible[:, None, None, :]
        scores = scores.view(batch, key_heads, group, k_len).masked_fill(~visible, torch.finfo(scores.dtype).min)
    weights = F.softmax(upcast(scores), dim=-1)
    if visible is not None:
        weights = weights * visible.any(dim=-1, keepdim=True)  # a row with no visible key: zeros
    if weights.dtype != value.dtype:
        weights = weights.to(value.dtype)
    output = torch.bmm(weights.view(batch * key_heads, group, k_len), value.flatten(0, 1))  # [B*Hkv, group, dv]
    return output.view(batch, heads, 1, -1).transpose(1, 2), None


__all__ = ["zpx_attention_decode"]
