"""Geometric product attention (GPA, docs/design.md §5.4): the entry point and the kernel dispatch.

    S_ij = ( <Q_i ~K_j>_0 + gamma_h * sqrt(sum_C <Q_i ~K_j>_C^2 + eps) ) * scaling,   C over the 10 bivectors
    out_i = sum_j softmax_j(S_ij) V_j              (bivector=False: S_ij = <Q_i ~K_j>_0 * scaling)

Three paths compute this one function (same signature, compared against each other in the tests):

* `"naive"`   `ops_gpa_naive.gpa_naive`: the formula materialised, O(L^2) memory; also the attention
  weights (`gpa_attention_weights`) and the score parts for inspection (`gpa_score_parts`).
* `"chunked"` `ops_gpa_chunked.gpa_chunked`: query panels, causal key blocks, online softmax and a
  recomputing backward in PyTorch, O(L) memory: the CPU path.
* `"triton"`  `ops_gpa_triton.gpa_triton`: the fused flash-style kernels, O(L) memory: the CUDA path.

`kernel="auto"` takes Triton for CUDA tensors when Triton imports, else "chunked"; with `bivector=False`
it takes SDPA on Q . (sign_0 * K) (the scalar part is one signed dot product), which gives the same
numbers. Query i sits at absolute position Lk - Lq + i (decoding with a cache); a query row with no
visible key (a left-padding row) outputs zeros on every path. bf16/fp16 inputs or autocast: the norm and
softmax statistics are computed in fp32 and the output has the query's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .clifford_algebra import NUM_BLADES
from .modeling_blocks import visible_keys
from .ops_gpa_chunked import gpa_chunked
from .ops_gpa_naive import (
    check_gpa_inputs,
    compute_dtype,
    form_tables,
    gpa_naive,
    gpa_naive_weights,
    score_parts,
)
from .ops_gpa_triton import HAS_TRITON, gpa_triton

GPA_KERNELS = ("naive", "chunked", "triton")
_KERNEL_FUNCTIONS = {"naive": gpa_naive, "chunked": gpa_chunked, "triton": gpa_triton}


def _scalar_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """bivector=False: S = <Q ~K>_0 * scaling = (Q . (sign_0 * K)) * scaling through SDPA."""
    q_len, k_len = query.shape[2], key.shape[2]
    dtype = compute_dtype(query)
    with torch.autocast(query.device.type, enabled=False):
        signed_key = key.to(dtype) * form_tables(query.device)[1][0].to(dtype).repeat(key.shape[-1] // NUM_BLADES)
        q, v = query.to(dtype), value.to(dtype)
        if key_padding_mask is None and (not causal or q_len == k_len or q_len == 1):
            out = F.scaled_dot_product_attention(q, signed_key, v, is_causal=causal and q_len > 1, scale=scaling)
        else:
            visible = visible_keys(q_len, k_len, causal, key_padding_mask, query.device)
            has_key = visible.any(-1, keepdim=True)  # empty rows: opened for SDPA, then zeroed
            out = F.scaled_dot_product_attention(q, signed_key, v, attn_mask=visible | ~has_key, scale=scaling)
            out = out * has_key
    return out.to(query.dtype)


def geometric_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    eps: float = 1e-6,
    bivector: bool = True,
    kernel: str = "auto",
) -> torch.Tensor:
    """GPA output [B, H, Lq, D] for query [B, H, Lq, D], key/value [B, H, Lk, D], gamma [H].

    `key_padding_mask` [B, Lk] (True/1 = real token); `scaling` defaults to 1/sqrt(D); `kernel` is
    "auto" or one of `GPA_KERNELS`."""
    if kernel != "auto" and kernel not in GPA_KERNELS:
        raise ValueError(f"kernel={kernel!r} is unknown; use 'auto' or one of {list(GPA_KERNELS)}.")
    check_gpa_inputs(query, key, value, gamma, key_padding_mask, scaling, eps)
    if kernel == "auto":
        if not bivector:
            scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
            return _scalar_sdpa(query, key, value, causal=causal, key_padding_mask=key_padding_mask, scaling=scaling)
        kernel = "triton" if HAS_TRITON and query.is_cuda else "chunked"
    return _KERNEL_FUNCTIONS[kernel](
        query,
        key,
        value,
        gamma,
        causal=causal,
        key_padding_mask=key_padding_mask,
        scaling=scaling,
        eps=eps,
        bivector=bivector,
    )


def gpa_attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    eps: float = 1e-6,
    bivector: bool = True,
) -> torch.Tensor:
    """softmax_j(S_ij) [B, H, Lq, Lk] from the naive path, in the query's dtype (empty rows are 0)."""
    weights = gpa_naive_weights(
        query, key, gamma, causal=causal, key_padding_mask=key_padding_mask, scaling=scaling, eps=eps, bivector=bivector
    )
    return weights.to(query.dtype)


def gpa_score_parts(
    query: torch.Tensor, key: torch.Tensor, *, scaling: float | None = None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(<P_ij>_0, sqrt(sum_C <P_ij>_C^2 + eps)), each [B, H, Lq, Lk] in float32 (float64 for float64
    inputs), for inspection; both are multiplied by `scaling` when it is given (None = unscaled)."""
    check_gpa_inputs(query, key, None, None, None, scaling, eps)
    dtype = compute_dtype(query)
    with torch.autocast(query.device.type, enabled=False):
        scalar, norm = score_parts(query.to(dtype), key.to(dtype), eps)
    if scaling is not None:
        scalar, norm = scalar * scaling, norm * scaling
    return scalar, norm


# Pre-redesign names, kept importable until modeling_versor.py has moved to the API above.
gpa_reference = gpa_naive

__all__ = [
    "GPA_KERNELS",
    "HAS_TRITON",
    "geometric_product_attention",
    "gpa_attention_weights",
    "gpa_chunked",
    "gpa_naive",
    "gpa_reference",
    "gpa_score_parts",
    "gpa_triton",
]
