"""PCT sigmoid attention, the readable formula (kernel `naive`, docs/design.md §4.1): every gate materialised,
plain autograd.

After the complex L2 normalisation and rotation (done by the model), a PCT head is real sigmoid
attention on the real head dim D = 2d, with q, k, v laid out [re | im]:

    raw_ij = q_i . k_j                    (= Re sum_m q_im conj(k_jm))
    a_ij   = sigmoid(tau_h raw_ij + b_h)  if key j is visible to query i, else exactly 0
    out_i  = sum_j a_ij v_j               (no row max, no normaliser)

Key j is visible to query i iff `key_padding_mask[b, j]` (when given), both lie in one document (when
`document_ids` are given) and, when causal, j <= i + (Lk - Lq) (the Lq queries are the last positions).
Grouped-query attention by its definition: query head h reads key-value head h // group (keys and values
indexed per query head). Gates are computed in float32 at least (float64 stays float64) with autocast off.
Memory O(B H Lq Lk).
"""

from __future__ import annotations

import torch

from .ops_common import autocast_off, visible_keys


def per_query_head(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Key-value heads [B, Hkv, ...] indexed per query head h -> h // (H / Hkv): [B, H, ...] (the definition)."""
    group = heads // x.shape[1]
    if group == 1:
        return x
    return x.index_select(1, torch.arange(heads, device=x.device) // group)


def pct_gates(
    query: torch.Tensor,
    key: torch.Tensor,
    tau: torch.Tensor,
    bias: torch.Tensor,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> torch.Tensor:
    """a_ij = sigmoid(tau_h q_i.k_j + b_h) on visible pairs, exactly 0 elsewhere; [B, H, Lq, Lk], >= float32."""
    key = per_query_head(key, query.shape[1])
    acc = torch.promote_types(query.dtype, torch.float32)
    with autocast_off(query):
        raw = query.to(acc) @ key.to(acc).transpose(-1, -2)
        gate = torch.sigmoid(tau.to(acc)[:, None, None] * raw + bias.to(acc)[:, None, None])
    mask = visible_keys(query.shape[2], key.shape[2], causal, key_padding_mask, query.device, document_ids)
    return gate if mask is None else gate.masked_fill(~mask, 0.0)


def pct_attention_naive(
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
    """`ops_pct_base.PCTKernel`: out_i = sum_j sigmoid(tau q_i.k_j + b) v_j over visible pairs, every gate
    materialised (module doc)."""
    gate = pct_gates(query, key, tau, bias, causal, key_padding_mask, document_ids)
    value = per_query_head(value, query.shape[1])
    with autocast_off(query):
        return (gate @ value.to(gate.dtype)).to(query.dtype)


__all__ = ["pct_attention_naive", "pct_gates", "per_query_head"]
