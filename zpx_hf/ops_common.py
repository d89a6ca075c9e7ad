"""What every op shares: the compute dtype, the optional Triton import, kernel names, masks, and document ids.

Packed sequences (several documents in one row, as `DataCollatorWithFlattening` and TRL's packing make)
reach the ops as `document_ids`: an int64 [B, L] tensor, non-decreasing along each row, equal for tokens
of one document. Two tokens interact only when their ids are equal. `None` means each row is one
document (the unpacked case, which every op keeps on its unchanged fast path).

Masks are built per block of query rows (`query_panels`, `visible_block`) in the memory-lean kernels
(ZPX's and PCT's `panel`, GPA's `chunk`); a panel only reads the keys its rows can see (causality and
documents), and the Triton kernels mask inside their tiles. The whole [B, 1, Lq, Lk] mask (`visible_keys`)
is built by the `naive` kernels and by one fast path: GPA with `bivector=False` under `kernel="auto"`
(SDPA on the scalar part) builds it when padding or documents are given, or when a causal call has
1 < Lq < Lk queries.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

try:  # optional: the remote-code copy of this file must import without triton
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None
    HAS_TRITON = False

# One vocabulary for every op's kernels (each op's *_KERNELS is a subset), named by algorithm, not device
# (docs/design.md §6.1): the readable reference; the memory-lean PyTorch paths, one per op (`panel`: query panels
# against the keys they see, ZPX and PCT; `chunk`: query panels x key blocks with an online softmax, GPA; `scan`:
# a log-depth prefix scan, RRA); the fused Triton kernels; the one-token step of cached decoding; and the
# length-independent graph of torch.export / ONNX (RRA's).
KERNEL_NAMES = ("naive", "panel", "chunk", "scan", "triton", "decode", "export")
FAST_KERNEL_NAMES = ("panel", "chunk", "scan")  # an op has one of them: what `cpu` and its older names select
# Names earlier versions used (still accepted, with a FutureWarning naming today's): each maps to the candidates,
# of which the op's own kernel is chosen. `cpu` (before the kernels were named by algorithm) and its earlier
# names select each op's memory-lean PyTorch path; so does `scan` for the ops whose path is not a scan.
LEGACY_KERNEL_NAMES = {
    "cpu": FAST_KERNEL_NAMES,
    "tiled": FAST_KERNEL_NAMES,
    "chunked": FAST_KERNEL_NAMES,
    "scan": FAST_KERNEL_NAMES,
    "sdpa": FAST_KERNEL_NAMES,
    "sequential": ("naive",),
    "reference": ("naive",),
    "step": ("decode",),
    "recurrent": ("decode",),
}


def triton_interpreting() -> bool:
    """True when Triton runs through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when any input is float64, else float32 (fp32 / bf16 / fp16 accumulate in float32)."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x in at least float32: half precisions are raised, float64 stays exact (for float64 references)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()  # no dispatch when nothing changes


def autocast_off(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """Autocast disabled on `tensor`'s device (a no-op context when it is off already)."""
    if torch.is_autocast_enabled(tensor.device.type):
        return torch.autocast(tensor.device.type, enabled=False)
    return contextlib.nullcontext()


def constant_tables(build: Callable[..., Any]) -> Callable[..., Any]:
    """`build(*args)` (constant tensors that depend on hashable arguments only, never on parameters) kept per
    arguments in eager mode: small decoding steps pay per op, and a CUDA constant would be a host-to-device copy
    per call. Traced fresh inside compiled graphs; built outside inference mode so the kept tensors are normal."""
    kept: dict[tuple, Any] = {}

    @functools.wraps(build)
    def tables(*args: Any) -> Any:
        if torch.compiler.is_compiling():
            return build(*args)
        if args not in kept:  # a hit skips the inference-mode switch (~10 us, the cost of several small ops)
            if len(kept) >= 64:
                kept.clear()
            with torch.inference_mode(False):
                kept[args] = build(*args)
        return kept[args]

    return tables


def kernel_name(kernel: str, kernels: tuple[str, ...], op: str) -> str:
    """`kernel` in the shared vocabulary: "auto", one of `kernels`, or an earlier name mapped to it (warned)."""
    if kernel == "auto" or kernel in kernels:
        return kernel
    new = next((name for name in LEGACY_KERNEL_NAMES.get(kernel, ()) if name in kernels), None)
    if new is not None:
        warnings.warn(f"{op} kernel {kernel!r} is now called {new!r}; {kernel!r} still works.", FutureWarning, 3)
        return new
    raise ValueError(f"`kernel`={kernel!r} is not a {op} kernel: expected 'auto' or one of {list(kernels)}.")


def check_triton_kernel(op: str, tensor: torch.Tensor, dtypes: tuple[torch.dtype, ...], fallback: str) -> None:
    """Raise, naming the fix (`fallback`, the op's PyTorch kernel), when `tensor` cannot run on `op`'s Triton
    kernel."""
    if not HAS_TRITON:
        raise RuntimeError(
            f"the {op} kernel 'triton' needs the `triton` package; install it or use kernel={fallback!r}."
        )
    if not tensor.is_cuda and not triton_interpreting():
        raise RuntimeError(
            f"the {op} Triton kernel runs on CUDA tensors (or on CPU with TRITON_INTERPRET=1 set before import); "
            f"use kernel={fallback!r} here."
        )
    if tensor.dtype not in dtypes:
        raise ValueError(
            f"the {op} Triton kernel takes {[str(d) for d in dtypes]}; got {tensor.dtype}: use {fallback!r}."
        )


def check_key_masks(
    key_padding_mask: torch.Tensor | None, document_ids: torch.Tensor | None, batch: int, k_len: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Shape-check the per-key inputs [B, Lk] (ValueError naming the argument); return them as bool / int64."""
    for name, tensor in (("key_padding_mask", key_padding_mask), ("document_ids", document_ids)):
        if tensor is not None and tuple(tensor.shape) != (batch, k_len):
            raise ValueError(f"`{name}` must be [B={batch}, Lk={k_len}] (one per key); got {tuple(tensor.shape)}.")
    if key_padding_mask is not None and key_padding_mask.dtype != torch.bool:
        key_padding_mask = key_padding_mask.to(torch.bool)
    if document_ids is not None and document_ids.dtype != torch.long:
        document_ids = document_ids.to(torch.long)
    return key_padding_mask, document_ids


def decode_key_mask(key_padding_mask: torch.Tensor | None, document_ids: torch.Tensor | None) -> torch.Tensor | None:
    """For one query (the last position): the keys it may see, [B, Lk] bool; documents fold into the key mask."""
    if document_ids is None:
        return key_padding_mask
    same = document_ids == document_ids[:, -1:]
    return same if key_padding_mask is None else same & key_padding_mask


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


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, L] position of each token inside its document (0 at every document start)."""
    index = torch.arange(document_ids.shape[-1], device=document_ids.device).expand_as(document_ids)
    return index - document_spans(document_ids)[0]


def document_spans(document_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, end) [B, L]: index of the first token of each token's document, and one past its last."""
    length = document_ids.shape[-1]
    index = torch.arange(length, device=document_ids.device).expand_as(document_ids)
    change = document_ids[:, 1:] != document_ids[:, :-1]
    starts = torch.cat([torch.ones_like(change[:, :1]), change], dim=-1)
    first = torch.where(starts, index, 0).cummax(-1).values
    ends = torch.cat([change, torch.ones_like(change[:, :1])], dim=-1)  # last token of a document
    end = torch.where(ends, index + 1, length).flip(-1).cummin(-1).values.flip(-1)
    return first, end


def document_tables(document_ids: torch.Tensor) -> torch.Tensor:
    """[3, B, L] contiguous int32 (ids, first, end of each token's document, `document_spans`): what the Triton
    kernels read to skip the tiles of other documents (`document_window`)."""
    return torch.stack((document_ids, *document_spans(document_ids))).to(torch.int32).contiguous()


if HAS_TRITON:

    @triton.jit
    def document_window(DOC_FIRST, DOC_END, row, first, last):
        # [lo, hi): the tokens in one document with any of positions first..last of the row starting at `row`
        # (ids non-decreasing: from the first token of first's document to one past the last of last's). A
        # tile outside it holds only other documents: flash-attention's varlen skip, from two loads per tile.
        return tl.load(DOC_FIRST + row + first), tl.load(DOC_END + row + last)

    @triton.jit
    def key_tile_range(pid_m, q_len, k_len, q_offset, row, DOC_FIRST, DOC_END, CAUSAL: tl.constexpr,
                       HAS_DOCS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
        # [lo, hi): the keys query tile pid_m visits (query i at absolute position i + q_offset): none right of
        # its last query (causal); packed, from the key tile of its first document's start to its last's end
        lo = tl.full([], 0, tl.int32)
        hi = tl.full([], 0, tl.int32) + k_len
        if CAUSAL:
            hi = tl.minimum(hi, q_offset + (pid_m + 1) * BLOCK_M)
        if HAS_DOCS:
            first = tl.minimum(pid_m * BLOCK_M, q_len - 1) + q_offset
            last = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, q_len - 1) + q_offset
            doc_lo, doc_hi = document_window(DOC_FIRST, DOC_END, row, first, last)
            lo = doc_lo // BLOCK_N * BLOCK_N
            hi = tl.minimum(hi, doc_hi)
        return lo, hi

    @triton.jit
    def query_tile_range(pid_n, q_len, k_len, q_offset, row, DOC_FIRST, DOC_END, CAUSAL: tl.constexpr,
                         HAS_DOCS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
        # [lo, hi): the queries that can see key tile pid_n: none in query tiles above the diagonal (causal);
        # packed, only those of the tile's documents
        lo = tl.full([], 0, tl.int32)
        hi = tl.full([], 0, tl.int32) + q_len
        if CAUSAL:
            lo = tl.maximum(pid_n * BLOCK_N - q_offset, 0) // BLOCK_M * BLOCK_M
        if HAS_DOCS:
            first = tl.minimum(pid_n * BLOCK_N, k_len - 1)
            last = tl.minimum(pid_n * BLOCK_N + BLOCK_N - 1, k_len - 1)
            doc_lo, doc_hi = document_window(DOC_FIRST, DOC_END, row, first, last)
            lo = tl.maximum(lo, tl.maximum(doc_lo - q_offset, 0) // BLOCK_M * BLOCK_M)
            hi = tl.minimum(hi, doc_hi - q_offset)
        return lo, hi


def query_panels(
    l_q: int, l_k: int, causal: bool, rows: int, document_ids: torch.Tensor | None = None
) -> list[tuple[int, int, int, int]]:
    """(start, end, lo, hi): query rows [start, end) (absolute positions Lk - Lq + row) read keys [lo, hi) only.

    Causal rows see no key right of their last position; with documents, none left of the first row's
    document start (min over the batch) and, bidirectional, none right of the last row's document end.
    One host read for all panels (in compiled graphs documents do not narrow the window)."""
    offset = l_k - l_q
    starts = list(range(0, l_q, max(1, rows)))
    ends = [min(start + rows, l_q) for start in starts]
    his = [min(l_k, end + offset) if causal else l_k for end in ends]
    los = [0] * len(starts)
    if document_ids is not None and not torch.compiler.is_compiling() and starts:
        first, end = document_spans(document_ids)
        device = document_ids.device
        los = first[:, torch.tensor(starts, device=device) + offset].amin(0).tolist()
        if not causal:
            his = end[:, torch.tensor(ends, device=device) - 1 + offset].amax(0).tolist()
    return list(zip(starts, ends, los, his))


def visible_block(
    rows: tuple[int, int],
    keys: tuple[int, int],
    l_q: int,
    l_k: int,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor | None:
    """Bool [B|1, 1, rows, keys], True where query row r (absolute position Lk - Lq + r) may see key j, for
    the block rows [r0, r1) x keys [k0, k1); None = all visible."""
    (r0, r1), (k0, k1) = rows, keys
    offset = l_k - l_q
    visible = None
    if causal and k1 - 1 > r0 + offset:  # some key lies right of the first row's position
        q_pos = torch.arange(r0 + offset, r1 + offset, device=device)[:, None]
        visible = (torch.arange(k0, k1, device=device)[None, :] <= q_pos)[None, None]
    if key_padding_mask is not None:
        keep = key_padding_mask[:, None, None, k0:k1].to(device=device, dtype=torch.bool)
        visible = keep if visible is None else visible & keep
    if document_ids is not None:
        same = document_ids[:, r0 + offset : r1 + offset, None] == document_ids[:, None, k0:k1]
        visible = same[:, None] if visible is None else visible & same[:, None]
    return visible


def visible_keys(
    q_len: int,
    k_len: int,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    device: torch.device,
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Bool [B|1, 1, Lq, Lk], True where query i (absolute position Lk - Lq + i) may see key j; None = all.
    The whole block of `visible_block`: for references, which materialise every pair anyway."""
    return visible_block((0, q_len), (0, k_len), q_len, k_len, causal, key_padding_mask, document_ids, device)


__all__ = [
    "HAS_TRITON",
    "KERNEL_NAMES",
    "FAST_KERNEL_NAMES",
    "LEGACY_KERNEL_NAMES",
    "autocast_off",
    "check_key_masks",
    "check_triton_kernel",
    "compute_dtype",
    "constant_tables",
    "decode_key_mask",
    "document_ids_from_cu_seq_lens",
    "document_ids_from_position_ids",
    "document_positions",
    "document_spans",
    "document_tables",
    "kernel_name",
    "query_panels",
    "tl",
    "triton",
    "triton_interpreting",
    "upcast",
    "visible_block",
    "visible_keys",
]
