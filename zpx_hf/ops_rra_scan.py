"""Recursive rotor accumulator by a log-depth scan in PyTorch (kernel "scan": CPU, and any device without Triton).

Same function as `ops_rra_naive.rra_naive`, written for the hardware:

* Closed-form rotors (`clifford_algebra.rotation_rotor`, `boost_rotor`) instead of matrix exponentials.
  "compact" accumulates rotations only, so the state lives in Spin(4) = SU(2) x SU(2) and a product is two
  quaternion products (32 multiplies, not the 256 of a complex 4x4 product).
* A log-depth (Hillis-Steele) scan: round d combines x[t - d] x[t], log2(L) rounds of whole-sequence ops
  instead of a Python loop over time. The result is re-projected onto the group once (a quaternion pair is
  normalised exactly; a general rotor by one Newton step), straight-through as in the reference. Packed
  rows scan segmented: round d combines x[t - d] x[t] only when t - d lies in t's document.
* Structure-of-arrays layout (`ops_rra_base`, shared with the Triton kernel): matrix entries and quaternion
  components lead, tokens (B, H, L) are the last, long, contiguous axis. The reverse is an index permutation
  with signs (`clifford_algebra.matrix_reverse`).

"full" (every bivector accumulated, boosts included) has no closed form here: its per-token rotors are
matrix exponentials and its scan multiplies complex 4x4 matrices.
"""

from __future__ import annotations

import torch

from .clifford_algebra import (
    BOOST_INDICES,
    ROTATION_INDICES,
    from_matrix,
    rotation_rotor,
    rotor_exp_matrix,
    spin4_table,
    spin4_to_multivector,
    to_matrix,
)
from .ops_rra_base import (
    boost_matrices_soa,
    document_restarts,
    from_soa,
    matmul_soa,
    project,
    reverse_soa,
    sandwich_values,
    segment_bounds,
    to_soa,
)


def quaternion_product_soa(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Products of SU(2) blocks `[4, ...]`: an outer product and one [4, 16] x [16, n] GEMM."""
    table = spin4_table("product", a.device, a.dtype).reshape(16, 4)
    outer = a.unsqueeze(1) * b.unsqueeze(0)  # [4, 4, ...]
    return (table.T @ outer.reshape(16, -1)).reshape(4, *outer.shape[2:])


def prefix_scan(x: torch.Tensor, product, first: torch.Tensor | None = None) -> torch.Tensor:
    """Inclusive prefix products along the last axis, earlier factors on the left (Hillis-Steele).

    `first` [B, 1, L] (broadcast against x's token axes): the index where each token's segment starts; the
    products then restart there (None: one segment)."""
    shift = 1
    length = x.shape[-1]
    while shift < length:
        combined = product(x[..., :-shift], x[..., shift:])
        if first is not None:  # x[t - shift] covers tokens of t's segment only when t - shift >= first[t]
            inside = torch.arange(length - shift, device=x.device) >= first[..., shift:]
            combined = torch.where(inside, combined, x[..., shift:])
        x = torch.cat((x[..., :shift], combined), dim=-1)
        shift *= 2
    return x


def suffix_sum(x: torch.Tensor, first: torch.Tensor | None, last: torch.Tensor | None) -> torch.Tensor:
    """S_t = sum_{s >= t} x_s along the last axis, within t's segment when `first`/`last` are given."""
    if first is None or last is None:  # one segment (`segment_bounds` gives both or neither)
        return x.flip(-1).cumsum(-1).flip(-1)
    length = x.shape[-1]
    reversed_first = (length - 1 - last).flip(-1)  # segment starts of the reversed sequence
    return prefix_scan(x.flip(-1), torch.add, reversed_first).flip(-1)


def _conjugate(pairs: torch.Tensor) -> torch.Tensor:
    """q^H = (q0, -q1, -q2, -q3): the inverse of a unit block and the adjoint of multiplying by it."""
    return torch.cat((pairs[:1], -pairs[1:]))


class _Spin4Scan(torch.autograd.Function):
    """Prefix products P_t = dR_s ... dR_t of SU(2) blocks `[4, ..., L]` from each segment's start s,
    normalised (q / |q|).

    Backward without re-running the scan: with G_t = dL/dP_t the reverse recursion
    Gbar_t = G_t + Gbar_{t+1} dR_{t+1}^H (inside a segment) unrolls, for unit P (P^-1 = P^H), to
    Gbar_t = S_t P_t with the segment's suffix sum S_t = sum_{s >= t} G_s P_s^H; then
    dL/d dR_t = P_{t-1}^H Gbar_t (P_{t-1} = 1 at a segment's start). The normalisation is straight-through
    (its gradient is the identity's), as in the reference.
    """

    @staticmethod
    def forward(ctx, steps, first, last):
        prefix = prefix_scan(steps, quaternion_product_soa, first)
        prefix = prefix / prefix.square().sum(0, keepdim=True).sqrt()
        ctx.save_for_backward(prefix)
        ctx.segments = (first, last)
        return prefix

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (prefix,) = ctx.saved_tensors
        first, last = ctx.segments
        suffix = suffix_sum(quaternion_product_soa(grad, _conjugate(prefix)), first, last)
        carried = quaternion_product_soa(suffix, prefix)  # Gbar_t
        one = torch.zeros_like(prefix[..., :1])
        one[0] = 1.0
        previous = torch.cat((one, prefix[..., :-1]), dim=-1)  # P_{-1} = 1
        if first is not None:  # P_{t-1} = 1 where a segment starts
            previous = torch.where(first == torch.arange(prefix.shape[-1], device=prefix.device), one, previous)
        return quaternion_product_soa(_conjugate(previous), carried), None, None


def _newton_soa(matrix: torch.Tensor) -> torch.Tensor:
    """Straight-through R <- R (3 - ~R R) / 2 on `[4, 4, ...]` (`clifford_algebra.rotor_normalize`)."""
    n = matmul_soa(reverse_soa(matrix), matrix)
    eye = torch.eye(4, device=matrix.device, dtype=matrix.dtype).reshape(4, 4, *([1] * (matrix.dim() - 2)))
    return matrix + (0.5 * matmul_soa(matrix, 3 * eye - n) - matrix).detach()


def _spin4_matrix_soa(pairs: torch.Tensor) -> torch.Tensor:
    """Quaternion pairs `[4, 2, *tokens]` -> complex matrices `[4, 4, *tokens]` (one GEMM)."""
    table = spin4_table("matrix", pairs.device, pairs.dtype).reshape(8, 32)  # (s, a) x (re/im, i, j)
    out = table.T @ pairs.transpose(0, 1).reshape(8, -1)
    out = out.reshape(2, 4, 4, *pairs.shape[2:])
    return torch.complex(out[0], out[1])


def accumulated_rotors(
    bivectors: torch.Tensor, accumulate: str, initial: torch.Tensor | None, restarts: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The accumulated rotors R_t as complex `[4, 4, B, H, L]` and, for compact, the quaternion pairs of the
    scan from 1 (`[4, 2, B, H, L]`, before `initial`; None for full). `restarts` [B, L]: documents."""
    tokens = bivectors.transpose(1, 2)  # [B, H, L, 10]: time is the last token axis
    first = last = None
    if restarts is not None:
        first, last = (bound[:, None] for bound in segment_bounds(restarts))  # [B, 1, L]: over heads
    if accumulate == "compact":
        pairs = rotation_rotor(tokens[..., list(ROTATION_INDICES)]).movedim((-2, -1), (1, 0))  # [4, 2, B, H, L]
        pairs = _Spin4Scan.apply(pairs, first, last)
        rotors = _spin4_matrix_soa(pairs)
        if initial is not None:  # `initial` continues the row's first document only
            continued = matmul_soa(to_soa(to_matrix(initial))[..., None], rotors)
            rotors = continued if first is None else torch.where(first == 0, continued, rotors)
        return rotors, pairs
    steps = to_soa(rotor_exp_matrix(tokens))  # [4, 4, B, H, L]
    if initial is not None:  # R_{-1} dR_0 as the first factor
        first_step = matmul_soa(to_soa(to_matrix(initial)), steps[..., 0])
        steps = torch.cat((first_step[..., None], steps[..., 1:]), dim=-1)
    return _newton_soa(prefix_scan(steps, matmul_soa, first)), None


def final_state(rotors: torch.Tensor, pairs: torch.Tensor | None, initial: torch.Tensor | None) -> torch.Tensor:
    """The last accumulated rotor as multivector coefficients `[B, H, 32]`, re-projected."""
    if pairs is not None and initial is None:  # already exactly normalised
        return spin4_to_multivector(pairs[..., -1].movedim((0, 1), (-1, -2)))
    return from_matrix(project(from_soa(rotors[..., -1])))


def rra_scan(
    bivectors: torch.Tensor,
    value: torch.Tensor,
    *,
    accumulate: str,
    initial: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ops_rra_base.RRAKernel`: `rra_naive`'s result (up to rounding) through closed forms and a log-depth scan."""
    rotors, pairs = accumulated_rotors(bivectors, accumulate, initial, document_restarts(document_ids))
    transforms = rotors
    if accumulate == "compact":
        boosts = bivectors.transpose(1, 2)[..., list(BOOST_INDICES)]
        transforms = matmul_soa(rotors, boost_matrices_soa(boosts))
    return sandwich_values(transforms, value), final_state(rotors, pairs, initial)


__all__ = ["accumulated_rotors", "final_state", "prefix_scan", "quaternion_product_soa", "rra_scan", "suffix_sum"]
