"""ZPX angle-sphere attention, the readable reference (kernel `naive`, `attn_implementation="eager"`).

The score formula of docs/design.md §3.2 term by term:

    S_ij = q_i.k_j / sqrt(d) + la mean_c cos(phi_ic - phi_jc) + ls mean_c <s_ic, s_jc>

materialising the [.., Lq, Lk, C] angle and [.., Lq, Lk, C, 3] sphere tensors: O(L^2 C) memory. Query i
sees key j when causality, padding and documents allow; a row that sees no key outputs zeros. Grouped-query
attention by its definition: query head h reads key-value head h // group (the keys and values indexed per
query head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops_common import upcast, visible_keys
from .ops_zpx_base import PHASE_FEATURES


def zpx_attention_naive(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ops_zpx_base.ZPXKernel`; returns (output [B, Lq, H, dv], weights [B, H, Lq, Lk])."""
    head_dim = query.shape[-1]
    group = query.shape[1] // key_aug.shape[1]
    if group > 1:  # query head h -> key-value head h // group
        kv_head = torch.arange(query.shape[1], device=query.device) // group
        key_aug, value = key_aug.index_select(1, kv_head), value.index_select(1, kv_head)
    key, key_features = key_aug[..., :head_dim], key_aug[..., head_dim:]
    channels = key_features.shape[-1] // PHASE_FEATURES

    def unpack(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin, sx, sy, sz = features.split(channels, dim=-1)
        return torch.atan2(sin, cos), torch.stack((sx, sy, sz), dim=-1)

    phi_q, sphere_q = unpack(query_features)
    phi_k, sphere_k = unpack(key_features)

    content = torch.matmul(query, key.transpose(-1, -2)) * scaling
    angle = torch.cos(phi_q[:, :, :, None, :] - phi_k[:, :, None, :, :]).mean(dim=-1)
    sphere = (sphere_q[:, :, :, None, :, :] * sphere_k[:, :, None, :, :, :]).sum(dim=-1).mean(dim=-1)
    scores = content + lambda_angle * angle + lambda_sphere * sphere

    visible = visible_keys(query.shape[2], key.shape[2], causal, key_padding_mask, query.device, document_ids)
    if visible is not None:
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    weights = F.softmax(upcast(scores), dim=-1)
    if visible is not None:
        weights = weights * visible.any(dim=-1, keepdim=True)  # a row with no visible key: zeros
    weights = F.dropout(weights.to(query.dtype), p=dropout, training=dropout > 0)
    output = torch.matmul(weights, value)
    return output.transpose(1, 2).contiguous(), weights


__all__ = ["zpx_attention_naive"]
