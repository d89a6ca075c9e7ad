"""PCT sigmoid attention (docs/design.md §4, §6): the one entry point, its input checks and the kernel choice.

    a_ij = sigmoid(tau_h q_i.k_j + b_h) on visible pairs (else 0),   out_i = sum_j a_ij v_j

on the real head dim 2d ([re | im]), q and k already L2-normalised and rotated by the model. Four kernels
(`PCT_KERNELS`) of this one function, one signature (`ops_pct_base.PCTKernel`), inputs checked here once:

* `naive`   `ops_pct_naive.py`: the formula with every gate materialised (the spec in code; O(L^2)).
* `panel`   `ops_pct_panel.py`: query panels and a recomputing backward in PyTorch (O(L) memory).
* `triton`  `ops_pct_triton.py`: fused flash-style Triton kernels (CUDA; CPU under TRITON_INTERPRET=1).
* `decode`  `ops_pct_decode.py`: one query row (cached decoding) without panels.

`kernel="auto"` picks `triton` for CUDA tensors when Triton imports, else `decode` for one query row and
`panel` otherwise. `cpu` and `tiled` (earlier names of `panel`) still work, with a FutureWarning.
"""

from __future__ import annotations

import torch

from .ops_common import HAS_TRITON, check_key_masks, check_triton_kernel, constant_tables, kernel_name
from .ops_pct_base import PCTKernel
from .ops_pct_decode import pct_attention_decode
from .ops_pct_naive import pct_attention_naive, pct_gates
from .ops_pct_panel import pct_attention_panel
from .ops_pct_triton import KERNEL_DTYPES, pct_attention_triton

PCT_KERNELS = ("naive", "panel", "triton", "decode")

_IMPLEMENTATIONS: dict[str, PCTKernel] = {
    "naive": pct_attention_naive,
    "panel": pct_attention_panel,
    "triton": pct_attention_triton,
    "decode": pct_attention_decode,
}


def resolve_kernel(kernel: str, query: torch.Tensor) -> str:
    """The kernel `kernel` runs for `query` [B, H, Lq, D]: "auto" -> "triton" on CUDA with Triton, else "decode"
    for one row and "panel" otherwise; an explicit "triton" must be able to run here."""
    kernel = kernel_name(kernel, PCT_KERNELS, "PCT attention")
    if kernel == "auto" and torch.compiler.is_exporting():  # panels loop over the length; naive traces once
        return "naive"
    if kernel == "auto":
        if HAS_TRITON and query.is_cuda and query.dtype in KERNEL_DTYPES:
            return "triton"
        return "decode" if query.shape[2] == 1 else "panel"
    if kernel == "triton":
        check_triton_kernel("PCT attention", query, KERNEL_DTYPES, "panel")
    if kernel == "decode" and query.shape[2] != 1:
        raise ValueError(f"the PCT kernel 'decode' takes one query row; got {query.shape[2]}: use 'panel'.")
    return kernel


@constant_tables
def _number_per_head(number: int | float, num_heads: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A Python tau or bias as a [H] tensor (the default dtype, raised to float32 at least), kept per value."""
    value = torch.as_tensor(number, dtype=dtype if isinstance(number, float) else None, device=device)
    return value.to(torch.promote_types(value.dtype, torch.float32)).reshape(1).expand(num_heads)


def per_head(value: torch.Tensor | float, name: str, num_heads: int, device: torch.device) -> torch.Tensor:
    """`tau` or `bias` as a vector [H] of at least float32 precision (a scalar is broadcast to every head)."""
    if (
        isinstance(value, torch.Tensor)
        and value.shape == (num_heads,)
        and value.dtype in (torch.float32, torch.float64)
    ):
        return value if value.device == device else value.to(device)  # the common case (a parameter)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number_per_head(value, num_heads, torch.get_default_dtype(), device)
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
    document_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Check shapes (ValueError naming the argument) and return (tau [H], bias [H], key_padding_mask [B, Lk]
    bool or None, document_ids [B, Lk] int64 or None), on the query's device."""
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(f"`query` and `key` must be [B, H, L, D]; got {tuple(query.shape)} and {tuple(key.shape)}.")
    if not query.is_floating_point():
        raise ValueError(f"`query` must be a float tensor; got {query.dtype}.")
    if value is not None and value.shape != key.shape:
        raise ValueError(f"`value` must have the shape of `key` {tuple(key.shape)}; got {tuple(value.shape)}.")
    if query.shape[0] != key.shape[0] or query.shape[1] % key.shape[1] or query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"`query` {tuple(query.shape)} and `key` {tuple(key.shape)} disagree on B or D, or key's heads (Hkv) do "
            "not divide the query's (H): grouped-query attention reads key-value head h // (H / Hkv)."
        )
    if query.shape[2] > key.shape[2]:
        raise ValueError(
            f"`query` has more positions ({query.shape[2]}) than `key` ({key.shape[2]}): queries are the last "
            "Lq <= Lk positions."
        )
    batch, heads, _, _ = query.shape
    key_padding_mask, document_ids = check_key_masks(key_padding_mask, document_ids, batch, key.shape[2])
    if key_padding_mask is not None and key_padding_mask.device != query.device:
        key_padding_mask = key_padding_mask.to(query.device)
    if document_ids is not None and document_ids.device != query.device:
        document_ids = document_ids.to(query.device)
    return (
        per_head(tau, "tau", heads, query.device),
        per_head(bias, "bias", heads, query.device),
        key_padding_mask,
        document_ids,
    )


def pct_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor | float,
    bias: torch.Tensor | float,
    *,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    kernel: str = "auto",
) -> torch.Tensor:
    """PCT sigmoid attention (module doc) by `kernel` ("auto" or one of `PCT_KERNELS`).

    query [B, H, Lq, 2d], key/value [B, Hkv, Lk, 2d] with Lq <= Lk (query i sits at position Lk - Lq + i) and
    Hkv dividing H (query head h reads key-value head h // (H / Hkv), never a repeated copy); tau and bias [H]
    (per query head) or scalars; key_padding_mask [B, Lk] bool (True = real token) or None; document_ids
    [B, Lk] (packed rows: a query sees only keys of its own document) or None.
    """
    tau, bias, key_padding_mask, document_ids = prepare_inputs(
        query, key, value, tau, bias, key_padding_mask, document_ids
    )
    fn = _IMPLEMENTATIONS[resolve_kernel(kernel, query)]
    return fn(
        query, key, value, tau, bias, causal=bool(causal), key_padding_mask=key_padding_mask, document_ids=document_ids
    )


def pct_attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    tau: torch.Tensor | float,
    bias: torch.Tensor | float,
    *,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gates a_ij [B, H, Lq, Lk] (exactly 0 where masked), float32 at least: for `output_attentions`."""
    tau, bias, key_padding_mask, document_ids = prepare_inputs(
        query, key, None, tau, bias, key_padding_mask, document_ids
    )
    return pct_gates(query, key, tau, bias, bool(causal), key_padding_mask, document_ids)


__all__ = ["HAS_TRITON", "PCT_KERNELS", "pct_attention", "pct_attention_weights", "per_head", "resolve_kernel"]
