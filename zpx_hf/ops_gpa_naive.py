"""Geometric product attention (GPA, docs/design.md §5.4) as written: the readable formula, O(L^2) memory.

Query, key and value of one head are `c` Cl(4,1) multivectors flattened to `[B, H, L, D]`, `D = 32 c`,
column `ch * 32 + blade mask`. With P_ij = sum_ch Q_i,ch ~K_j,ch:

    S_ij = ( <P_ij>_0 + gamma_h * sqrt(sum_C <P_ij>_C^2 + eps) ) * scaling,   C over the 10 bivectors
    out_i = sum_j softmax_j(S_ij) V_j            (bivector=False: S_ij = <P_ij>_0 * scaling)

Each coefficient is a bilinear form with a signed permutation (`CliffordAlgebra.bilinear_forms`):
<P>_C = sum_A Q_A sign_C[A] K_{A xor C}, so a score is 1 + 10 dot products over D. Which keys a query sees
(causal, padding, documents) is `ops_common.visible_keys`; a query row with no visible key outputs zeros.
Grouped keys by the definition: query head h reads key-value head h // group (indexed per query head).
Called through `ops_gpa.geometric_product_attention` (checked inputs, resolved scaling, autocast off).
"""

from __future__ import annotations

import torch

from .clifford_algebra import NUM_BLADES
from .ops_common import compute_dtype, visible_keys
from .ops_gpa_base import form_tables


def per_query_head(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Key-value heads [B, Hkv, ...] indexed per query head h -> h // (H / Hkv): [B, H, ...] (the definition)."""
    group = heads // x.shape[1]
    if group == 1:
        return x
    return x.index_select(1, torch.arange(heads, device=x.device) // group)


def score_parts(query: torch.Tensor, key: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(<P_ij>_0, sqrt(sum_C <P_ij>_C^2 + eps)), each [B, H, Lq, Lk], unscaled, in the inputs' dtype."""
    key = per_query_head(key, query.shape[1])
    index, sign, _ = form_tables(query.device)
    batch, heads, k_len, dim = key.shape
    channels = dim // NUM_BLADES
    k = key.reshape(batch, heads, k_len, channels, NUM_BLADES)
    k_forms = k[..., index] * sign.to(key.dtype)  # [B, H, Lk, c, 11, 32]: sign_m[A] K_{A xor C_m}
    q = query.reshape(batch, heads, query.shape[2], channels, NUM_BLADES)
    products = torch.einsum("bhicx,bhjcmx->bhijm", q, k_forms)  # [B, H, Lq, Lk, 11]
    return products[..., 0], torch.sqrt(products[..., 1:].pow(2).sum(-1) + eps)


def gpa_naive_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
    scaling: float,
    eps: float,
    bivector: bool,
) -> torch.Tensor:
    """softmax_j(S_ij): [B, H, Lq, Lk] in float32 (float64 for float64 inputs); rows with no visible key are 0."""
    dtype = compute_dtype(query)
    scalar, norm = score_parts(query.to(dtype), key.to(dtype), eps)
    scores = scalar + gamma.to(dtype).view(1, -1, 1, 1) * norm if bivector else scalar
    scores = scores * scaling
    visible = visible_keys(query.shape[2], key.shape[2], causal, key_padding_mask, query.device, document_ids)
    if visible is None:
        return torch.softmax(scores, dim=-1)
    has_key = visible.any(-1, keepdim=True)
    # an empty row is opened to every key (finite softmax and gradients), then zeroed
    weights = torch.softmax(scores.masked_fill(~(visible | ~has_key), float("-inf")), dim=-1)
    return weights * has_key


def gpa_naive(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
    scaling: float,
    eps: float,
    bivector: bool,
) -> torch.Tensor:
    """`ops_gpa_base.GPAKernel` materialised: [B, H, Lq, Lk, 11] products, softmax, weights @ V (float32,
    float64 for float64)."""
    weights = gpa_naive_weights(
        query,
        key,
        gamma,
        causal=causal,
        key_padding_mask=key_padding_mask,
        document_ids=document_ids,
        scaling=scaling,
        eps=eps,
        bivector=bivector,
    )
    return torch.matmul(weights, per_query_head(value, query.shape[1]).to(weights.dtype))


__all__ = ["gpa_naive", "gpa_naive_weights", "per_query_head", "score_parts"]
