"""PCT sigmoid attention below its kernels: the kernel signature.

Every PCT kernel (`ops_pct_naive`, `ops_pct_panel`, `ops_pct_triton`, `ops_pct_decode`) imports only this
module and `ops_common`; the entry `ops_pct.pct_attention` imports the kernels (docs/design.md §6.1).
"""

from __future__ import annotations

from typing import Protocol

import torch


class PCTKernel(Protocol):
    """The signature of every PCT kernel; inputs come checked from the entry (`ops_pct.prepare_inputs`).

    query [B, H, Lq, 2d] and key / value [B, Hkv, Lk, 2d] (real head dim [re | im], q and k L2-normalised and
    rotated; Hkv divides H and query head h reads key-value head h // (H / Hkv): grouped-query attention), tau
    and bias [H] tensors (float32 at least), key_padding_mask [B, Lk] bool (True = real token) or
    None, document_ids [B, Lk] int64 (packed rows) or None. Query i sits at position Lk - Lq + i. Returns
    out [B, H, Lq, 2d] in the query's dtype."""

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        tau: torch.Tensor,
        bias: torch.Tensor,
        *,
        causal: bool,
        key_padding_mask: torch.Tensor | None,
        document_ids: torch.Tensor | None,
    ) -> torch.Tensor: ...


__all__ = ["PCTKernel"]
