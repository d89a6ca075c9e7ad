"""Recursive rotor accumulator for graph export (kernel "export": what "auto" runs under `torch.export` / ONNX).

Same function as `ops_rra_naive.rra_naive`, written so one traced graph serves every sequence length and
holds only real tensors:

* Real arithmetic only: rotors and values are M4(C) matrices as (real, imag) pairs `[..., 2, 4, 4]`
  (`clifford_algebra.complex_matmul`); compact's scan multiplies quaternion pairs `[..., 2, 4]` through the
  structure constants. The ONNX exporter has no complex dtypes.
* A scan whose trace does not depend on the length L: Hillis-Steele round r combines x[t - 2^r] x[t] where
  t - 2^r >= 0 lies in t's document (a gather with clamped indices and a `where`, no slicing by L), for a
  fixed number of rounds, ceil(log2(EXPORT_MAX_LENGTH)) when L is symbolic (rounds with 2^r >= L leave x
  unchanged), ceil(log2(L)) when it is a plain int. Longer sequences fail the exported graph's
  `torch._check`.
* Documents by segment ids (a cumulative sum of the restarts): t - 2^r is in t's document iff the ids match,
  which exports where `segment_bounds`' cummax does not.

Eager users never run this: "auto" keeps the "scan" kernel (fewer rounds, SoA products, its own backward)
outside export. "full" takes the per-token matrix exponential by scaling and squaring with a fixed trace
(`clifford_algebra.matrix_exp_series`: ONNX has no matrix-exponential operator); "compact" (the default) is
closed form throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .clifford_algebra import (
    BOOST_INDICES,
    ROTATION_INDICES,
    boost_rotor,
    boost_to_matrix,
    complex_matmul,
    from_matrix,
    quaternion_product,
    rotation_rotor,
    rotor_exp_matrix,
    sandwich,
    spin4_to_matrix,
    spin4_to_multivector,
    to_matrix,
)
from .ops_rra_base import document_restarts, project

# the longest sequence an exported graph accepts when its length is symbolic: 2^16 tokens, 16 scan rounds
EXPORT_MAX_LENGTH = 2**16


def scan_rounds(length: int | torch.SymInt) -> int:
    """Hillis-Steele rounds covering `length` tokens: ceil(log2(L)) for an int, the bound's for a SymInt."""
    if isinstance(length, int):
        return max(0, (length - 1).bit_length())
    torch._check(length <= EXPORT_MAX_LENGTH, lambda: f"RRA export: sequence length > {EXPORT_MAX_LENGTH}")
    return math.ceil(math.log2(EXPORT_MAX_LENGTH))


def prefix_scan_tokens(
    x: torch.Tensor, product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], segments: torch.Tensor | None
) -> torch.Tensor:
    """Inclusive prefix products along dim 1 (tokens) of `x` [B, L, ...], earlier factors on the left,
    restarting where `segments` [B, L] (segment ids, non-decreasing) changes (None: one segment)."""
    length = x.shape[1]
    positions = torch.arange(length, device=x.device)
    trailing = [1] * (x.dim() - 2)
    for r in range(scan_rounds(length)):
        source = positions - 2**r
        earlier = x.index_select(1, source.clamp(min=0))
        inside = source >= 0  # [L]
        if segments is not None:  # and x[t - 2^r] lies in t's document
            inside = inside & (segments.index_select(1, source.clamp(min=0)) == segments)  # [B, L]
        inside = inside.reshape(*inside.shape[:-1], length, *trailing)
        x = torch.where(inside, product(earlier, x), x)
    return x


def rra_export(
    bivectors: torch.Tensor,
    value: torch.Tensor,
    *,
    accumulate: str,
    initial: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ops_rra_base.RRAKernel`: `rra_naive`'s result (up to rounding), real tensors and a length-independent
    trace."""
    restarts = document_restarts(document_ids)
    segments = None if restarts is None else restarts.long().cumsum(-1)  # [B, L] document ids, 0 = the first
    if accumulate == "compact":
        pairs = rotation_rotor(bivectors[..., list(ROTATION_INDICES)])  # [B, L, H, 2, 4]
        pairs = prefix_scan_tokens(pairs, quaternion_product, segments)  # the two halves independently
        pairs = pairs / pairs.square().sum(-1, keepdim=True).sqrt()  # exact re-projection, as "scan"
        rotors = spin4_to_matrix(pairs)  # [B, L, H, 2, 4, 4]
        if initial is not None:  # `initial` continues the row's first document only
            continued = complex_matmul(to_matrix(initial)[:, None], rotors)
            if segments is not None:
                continued = torch.where(segments[..., None, None, None, None] == 0, continued, rotors)
            rotors = continued
            state = from_matrix(project(rotors[:, -1]))
        else:
            state = spin4_to_multivector(pairs[:, -1])
        boosts = boost_to_matrix(boost_rotor(bivectors[..., list(BOOST_INDICES)]))
        transforms = complex_matmul(rotors, boosts)
    else:
        steps = rotor_exp_matrix(bivectors, traceable=True)  # [B, L, H, 2, 4, 4], matmuls only
        if initial is not None:  # R_{-1} dR_0 as the first factor
            first = complex_matmul(to_matrix(initial)[:, None], steps[:, :1])
            steps = torch.cat((first, steps[:, 1:]), dim=1)
        rotors = prefix_scan_tokens(steps, complex_matmul, segments)
        transforms = project(rotors)  # one straight-through Newton step, as the "scan" kernel
        state = from_matrix(project(transforms[:, -1]))
    return sandwich(transforms[:, :, :, None], value), state


__all__ = ["EXPORT_MAX_LENGTH", "prefix_scan_tokens", "rra_export", "scan_rounds"]
