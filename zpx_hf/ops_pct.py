"""PCT sigmoid attention (docs/design.md §4, §6): the entry point and kernel dispatch.

    a_ij = sigmoid(tau_h q_i.k_j + b_h) on visible pairs (else 0),   out_i = sum_j a_ij v_j

on the real head dim 2d ([re | im]), q and k already L2-normalised and rotated by the model.
Three implementations of this one function, each `fn(query, key, value, tau, bias, *, causal,
key_padding_mask)`:

* `naive`   `ops_pct_naive.py`: the formula with every gate materialised (the spec in code; O(L^2)).
* `tiled`   `ops_pct_tiled.py`: query panels and a recomputing backward in PyTorch (O(L) memory;
            the CPU path).
* `triton`  `ops_pct_triton.py`: fused flash-style Triton kernels (CUDA).

`kernel="auto"` picks `triton` for CUDA tensors when Triton imports, else `tiled`.
"""

from __future__ import annotations

import torch

from .ops_pct_naive import gates, pct_attention_naive, prepare_inputs
from .ops_pct_tiled import pct_attention_tiled
from .ops_pct_triton import HAS_TRITON, KERNEL_DTYPES, pct_attention_triton

PCT_KERNELS = ("naive", "tiled", "triton")

_IMPLEMENTATIONS = {"naive": pct_attention_naive, "tiled": pct_attention_tiled, "triton": pct_attention_triton}


def resolve_kernel(kernel: str, query: torch.Tensor) -> str:
    """The implementation `kernel` runs for `query`: "auto" -> "triton" on CUDA with Triton, else "tiled"."""
    if kernel == "auto":
        return "triton" if HAS_TRITON and query.is_cuda and query.dtype in KERNEL_DTYPES else "tiled"
    if kernel not in PCT_KERNELS:
        raise ValueError(
            f"`kernel`={kernel!r} is not a PCT attention kernel: expected 'auto' or one of {list(PCT_KERNELS)}."
        )
    return kernel


def pct_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor | float,
    bias: torch.Tensor | float,
    *,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    kernel: str = "auto",
) -> torch.Tensor:
    """PCT sigmoid attention (module doc) by `kernel` ("auto" or one of `PCT_KERNELS`).

    query [B, H, Lq, 2d], key/value [B, H, Lk, 2d] with Lq <= Lk (query i sits at position Lk - Lq + i);
    tau and bias [H] or scalars; key_padding_mask [B, Lk] bool (True = real token) or None.
    """
    fn = _IMPLEMENTATIONS[resolve_kernel(kernel, query)]
    return fn(query, key, value, tau, bias, causal=causal, key_padding_mask=key_padding_mask)


def pct_attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    tau: torch.Tensor | float,
    bias: torch.Tensor | float,
    *,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gates a_ij [B, H, Lq, Lk] (exactly 0 where masked), float32 at least: for `output_attentions`."""
    tau, bias, key_padding_mask = prepare_inputs(query, key, None, tau, bias, key_padding_mask)
    return gates(query, key, tau, bias, causal, key_padding_mask)


__all__ = ["HAS_TRITON", "PCT_KERNELS", "pct_attention", "pct_attention_weights", "resolve_kernel"]
