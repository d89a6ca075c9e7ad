"""ZPX angle-sphere attention, the readable reference (`attn_implementation="eager"`).

The score formula of docs/design.md §3.2 term by term:

    S_ij = q_i.k_j / sqrt(d) + la mean_c cos(phi_ic - phi_jc) + ls mean_c <s_ic, s_jc>

materialising the [.., Lq, Lk, C] angle and [.., Lq, Lk, C, 3] sphere tensors: O(L^2 C) memory. The fast
path in `ops_zpx.py` computes the same numbers as one SDPA call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .modeling_blocks import build_attention_mask, upcast

PHASE_FEATURES = 5  # cos phi, sin phi, X, Y, Z


def zpx_attention_naive(
    query: torch.Tensor,
    key_aug: torch.Tensor,
    value: torch.Tensor,
    query_features: torch.Tensor,
    padding_mask: torch.Tensor | None,
    *,
    causal: bool,
    scaling: float,
    lambda_angle: float,
    lambda_sphere: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [B, H, Lq, d], key_aug [B, H, Lk, d + 5C] (cached k^ = [k, cos, sin, s]), value [B, H, Lk, dv],
    query_features [B, H, Lq, 5C], padding_mask [B, Lk] bool (True = real token) or None; query i sits at
    position Lk - Lq + i. Returns (output [B, Lq, H, dv], attention weights [B, H, Lq, Lk])."""
    batch, _, q_len, head_dim = query.shape
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

    mask = build_attention_mask(padding_mask, batch, q_len, key.shape[2], causal, query.device, always=True)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = F.softmax(upcast(scores), dim=-1).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=dropout > 0)
    output = torch.matmul(weights, value)
    return output.transpose(1, 2).contiguous(), weights


__all__ = ["zpx_attention_naive"]
