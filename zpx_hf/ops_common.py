"""What every op shares: the compute dtype, the optional Triton import, and document ids of packed rows.

Packed sequences (several documents in one row, as `DataCollatorWithFlattening` and TRL's packing make)
reach the ops as `document_ids`: an int64 [B, L] tensor, non-decreasing along each row, equal for tokens
of one document. Two tokens interact only when their ids are equal. `None` means each row is one
document (the unpacked case, which every op keeps on its unchanged fast path).
"""

from __future__ import annotations

import os

import torch

try:  # optional: the remote-code copy of this file must import without triton
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None
    HAS_TRITON = False


def triton_interpreting() -> bool:
    """True when Triton runs through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when any input is float64, else float32 (fp32 / bf16 / fp16 accumulate in float32)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def document_ids_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor | None:
    """[B, L] document ids where `position_ids` restart at 0 inside a row; None when no row restarts.

    A document starts at every position whose id is 0 after the row's first token. Left padding from
    `generate` (ids 1, 1, 0, 1, 2) would read as two documents, so callers derive ids from positions only
    when no padding mask is given (transformers' rule for packed batches); padding is the mask's job.
    """
    if position_ids.dim() != 2 or position_ids.shape[-1] < 2:
        return None
    starts = position_ids[:, 1:] == 0
    if not bool(starts.any()):
        return None
    zero = torch.zeros_like(position_ids[:, :1], dtype=torch.long)
    return torch.cat([zero, starts.long().cumsum(-1)], dim=-1)


def document_ids_from_cu_seq_lens(cu_seq_lens: torch.Tensor, batch_size: int, seq_len: int) -> torch.Tensor:
    """[B, L] document ids from flash-attention's cumulative lengths over the flattened B * L tokens."""
    cu = cu_seq_lens.to(torch.long).flatten()
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != batch_size * seq_len or bool((cu.diff() < 0).any()):
        raise ValueError(
            f"cu_seq_lens must rise from 0 to batch * sequence length ({batch_size * seq_len}); got "
            f"{cu.tolist()[:8]}{'...' if cu.numel() > 8 else ''}: pass the collator's cu_seq_lens_q unchanged"
        )
    flat = torch.searchsorted(cu[1:], torch.arange(batch_size * seq_len, device=cu.device), right=True)
    return flat.view(batch_size, seq_len)


def same_document(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, 1, L, L] bool: query i may see key j only inside its own document (combine with causality)."""
    return (document_ids[:, :, None] == document_ids[:, None, :])[:, None]


__all__ = [
    "HAS_TRITON",
    "compute_dtype",
    "document_ids_from_cu_seq_lens",
    "document_ids_from_position_ids",
    "same_document",
    "tl",
    "triton",
    "triton_interpreting",
]
