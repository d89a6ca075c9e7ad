"""Recursive rotor accumulator, Triton path (kernel "triton"; CUDA, the interpreter runs it on CPU in tests).

The scan kernel carries BLOCK_S sequences of M4(C) rotors `[N, L, 2, 4, 4]` (real/imag parts) through time,
re-projecting the state every `RENORM_EVERY` steps (R <- R (3 - ~R R) / 2, straight-through) and resetting
it to 1 where a packed document starts. Its backward runs the reverse recursion: with G_t = dL/dR_t and
Gbar_t = G_t + Gbar_{t+1} dR_{t+1}^H (no carry across a document start), dL/d dR_t = R_{t-1}^H Gbar_t
(R_{t-1} = 1 at a document start) and dL/dR_{-1} = Gbar_0 dR_0^H. Per-token rotors (closed forms for compact,
matrix exponentials for full) and the sandwich come from `ops_rra_base` (shared with the scan kernel).
"""

from __future__ import annotations

import torch

from .clifford_algebra import (
    BOOST_INDICES,
    ROTATION_INDICES,
    from_matrix,
    rotation_rotor,
    rotor_exp_matrix,
    spin4_to_matrix,
    to_matrix,
)
from .ops_common import HAS_TRITON, tl, triton
from .ops_rra_base import (
    RENORM_EVERY,
    boost_matrices_soa,
    document_restarts,
    identity_matrix,
    matmul_soa,
    project,
    sandwich_values,
    to_soa,
)

if HAS_TRITON:

    @triton.jit
    def _cmul(ar, ai, br, bi):
        # (A B)[s, i, k] = sum_j A[s, i, j] B[s, j, k] on real/imag parts
        rr = tl.sum(ar[:, :, :, None] * br[:, None, :, :], 2) - tl.sum(ai[:, :, :, None] * bi[:, None, :, :], 2)
        ri = tl.sum(ar[:, :, :, None] * bi[:, None, :, :], 2) + tl.sum(ai[:, :, :, None] * br[:, None, :, :], 2)
        return rr, ri

    @triton.jit
    def _cmul_adjoint_left(ar, ai, br, bi):
        # A^H B = (Ar^T - i Ai^T)(Br + i Bi); (A^T B)[s, i, k] = sum_j A[s, j, i] B[s, j, k]
        rr = tl.sum(ar[:, :, :, None] * br[:, :, None, :], 1) + tl.sum(ai[:, :, :, None] * bi[:, :, None, :], 1)
        ri = tl.sum(ar[:, :, :, None] * bi[:, :, None, :], 1) - tl.sum(ai[:, :, :, None] * br[:, :, None, :], 1)
        return rr, ri

    @triton.jit
    def _cmul_adjoint_right(ar, ai, br, bi):
        # A B^H = (Ar + i Ai)(Br^T - i Bi^T); (A B^T)[s, i, k] = sum_j A[s, i, j] B[s, k, j]
        rr = tl.sum(ar[:, :, None, :] * br[:, None, :, :], 3) + tl.sum(ai[:, :, None, :] * bi[:, None, :, :], 3)
        ri = tl.sum(ai[:, :, None, :] * br[:, None, :, :], 3) - tl.sum(ar[:, :, None, :] * bi[:, None, :, :], 3)
        return rr, ri

    @triton.jit
    def _reverse(rr, ri):
        # ~R = C R^T C^-1 = -C R^T C with C = E_{e2 e4}, a real signed anti-diagonal: C[i, 3 - i] = (-1)^i
        i = tl.arange(0, 4)[:, None]
        a = tl.arange(0, 4)[None, :]
        c = tl.where(a == 3 - i, tl.where(i % 2 == 0, 1.0, -1.0), 0.0)
        # (R^T C)[s, a, j] = sum_b R[s, b, a] C[b, j];  (C X)[s, i, j] = sum_a C[i, a] X[s, a, j]
        tr = tl.sum(rr[:, :, :, None] * c[None, :, None, :], 1)
        ti = tl.sum(ri[:, :, :, None] * c[None, :, None, :], 1)
        out_r = tl.sum(c[None, :, :, None] * tr[:, None, :, :], 2)
        out_i = tl.sum(c[None, :, :, None] * ti[:, None, :, :], 2)
        return -out_r, -out_i

    @triton.jit
    def _normalize(rr, ri):
        # R <- R (3 - ~R R) / 2
        vr, vi = _reverse(rr, ri)
        nr, ni = _cmul(vr, vi, rr, ri)
        eye = tl.where(tl.arange(0, 4)[:, None] == tl.arange(0, 4)[None, :], 3.0, 0.0)
        pr, pi = _cmul(rr, ri, eye[None, :, :] - nr, -ni)
        return 0.5 * pr, 0.5 * pi

    @triton.jit
    def _rotor_scan_fwd_kernel(
        ROTORS, INITIAL, OUT, RESTARTS, num_seq, seq_len, renorm_every,
        BLOCK_S: tl.constexpr, RENORM: tl.constexpr, HAS_RESTARTS: tl.constexpr,
    ):  # fmt: skip
        offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
        entry = tl.arange(0, 4)[:, None] * 4 + tl.arange(0, 4)[None, :]
        eye = tl.where(tl.arange(0, 4)[:, None] == tl.arange(0, 4)[None, :], 1.0, 0.0)[None, :, :]
        seq_mask = offs_s < num_seq
        mask = seq_mask[:, None, None]
        state = offs_s[:, None, None] * 32 + entry[None, :, :]
        rr = tl.load(INITIAL + state, mask=mask, other=0.0).to(tl.float32)
        ri = tl.load(INITIAL + state + 16, mask=mask, other=0.0).to(tl.float32)
        seq = offs_s[:, None, None] * (seq_len * 32) + entry[None, :, :]
        for t in range(seq_len):
            if HAS_RESTARTS:  # a document starts: R_{t-1} = 1
                restart = (tl.load(RESTARTS + offs_s * seq_len + t, mask=seq_mask, other=0) != 0)[:, None, None]
                rr = tl.where(restart, eye, rr)
                ri = tl.where(restart, 0.0, ri)
            dr = tl.load(ROTORS + seq + t * 32, mask=mask, other=0.0).to(tl.float32)
            di = tl.load(ROTORS + seq + t * 32 + 16, mask=mask, other=0.0).to(tl.float32)
            rr, ri = _cmul(rr, ri, dr, di)
            if RENORM:
                if (t + 1) % renorm_every == 0:
                    rr, ri = _normalize(rr, ri)
            tl.store(OUT + seq + t * 32, rr, mask=mask)
            tl.store(OUT + seq + t * 32 + 16, ri, mask=mask)

    @triton.jit
    def _rotor_scan_bwd_kernel(
        ROTORS, INITIAL, OUT, GRAD, GRAD_ROTORS, GRAD_INITIAL, RESTARTS, num_seq, seq_len,
        BLOCK_S: tl.constexpr, HAS_RESTARTS: tl.constexpr,
    ):  # fmt: skip
        offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
        entry = tl.arange(0, 4)[:, None] * 4 + tl.arange(0, 4)[None, :]
        eye = tl.where(tl.arange(0, 4)[:, None] == tl.arange(0, 4)[None, :], 1.0, 0.0)[None, :, :]
        seq_mask = offs_s < num_seq
        mask = seq_mask[:, None, None]
        state = offs_s[:, None, None] * 32 + entry[None, :, :]
        seq = offs_s[:, None, None] * (seq_len * 32) + entry[None, :, :]
        # carry = Gbar_{t+1} dR_{t+1}^H
        cr = tl.zeros([BLOCK_S, 4, 4], tl.float32)
        ci = tl.zeros([BLOCK_S, 4, 4], tl.float32)
        for step in range(seq_len):
            t = seq_len - 1 - step
            gr = tl.load(GRAD + seq + t * 32, mask=mask, other=0.0).to(tl.float32) + cr
            gi = tl.load(GRAD + seq + t * 32 + 16, mask=mask, other=0.0).to(tl.float32) + ci
            if t > 0:
                pr = tl.load(OUT + seq + (t - 1) * 32, mask=mask, other=0.0).to(tl.float32)
                pi = tl.load(OUT + seq + (t - 1) * 32 + 16, mask=mask, other=0.0).to(tl.float32)
            else:
                pr = tl.load(INITIAL + state, mask=mask, other=0.0).to(tl.float32)
                pi = tl.load(INITIAL + state + 16, mask=mask, other=0.0).to(tl.float32)
            restart = tl.zeros([BLOCK_S, 1, 1], tl.int1)
            if HAS_RESTARTS:  # R_{t-1} = 1 here, and nothing flows back past the document start
                restart = (tl.load(RESTARTS + offs_s * seq_len + t, mask=seq_mask, other=0) != 0)[:, None, None]
                pr = tl.where(restart, eye, pr)
                pi = tl.where(restart, 0.0, pi)
            dr, di = _cmul_adjoint_left(pr, pi, gr, gi)
            tl.store(GRAD_ROTORS + seq + t * 32, dr, mask=mask)
            tl.store(GRAD_ROTORS + seq + t * 32 + 16, di, mask=mask)
            rr = tl.load(ROTORS + seq + t * 32, mask=mask, other=0.0).to(tl.float32)
            ri = tl.load(ROTORS + seq + t * 32 + 16, mask=mask, other=0.0).to(tl.float32)
            cr, ci = _cmul_adjoint_right(gr, gi, rr, ri)
            if HAS_RESTARTS:
                cr = tl.where(restart, 0.0, cr)
                ci = tl.where(restart, 0.0, ci)
        tl.store(GRAD_INITIAL + state, cr, mask=mask)
        tl.store(GRAD_INITIAL + state + 16, ci, mask=mask)


def _scan_block(device: torch.device) -> int:
    return 16 if device.type != "cuda" else 32


class _RotorScanTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rotors, initial, restarts, renorm_every):
        rotors = rotors.contiguous()
        initial = initial.contiguous()
        num_seq, length = rotors.shape[:2]
        out = torch.empty_like(rotors)
        block = _scan_block(rotors.device)
        flags = restarts if restarts is not None else torch.zeros(1, dtype=torch.int8, device=rotors.device)
        _rotor_scan_fwd_kernel[(triton.cdiv(num_seq, block),)](
            rotors, initial, out, flags, num_seq, length, max(renorm_every, 1),
            BLOCK_S=block, RENORM=renorm_every > 0, HAS_RESTARTS=restarts is not None,
        )  # fmt: skip
        ctx.save_for_backward(rotors, initial, out, flags)
        ctx.has_restarts = restarts is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        rotors, initial, out, flags = ctx.saved_tensors
        num_seq, length = rotors.shape[:2]
        grad_rotors = torch.empty_like(rotors)
        grad_initial = torch.empty_like(initial)
        block = _scan_block(rotors.device)
        _rotor_scan_bwd_kernel[(triton.cdiv(num_seq, block),)](
            rotors, initial, out, grad.contiguous(), grad_rotors, grad_initial, flags, num_seq, length,
            BLOCK_S=block, HAS_RESTARTS=ctx.has_restarts,
        )  # fmt: skip
        return grad_rotors, grad_initial, None, None


def rotor_scan_triton(
    rotors: torch.Tensor,
    initial: torch.Tensor,
    restarts: torch.Tensor | None = None,
    renorm_every: int = RENORM_EVERY,
) -> torch.Tensor:
    """Prefix products R_t = R_{t-1} dR_t of float32 rotors `[N, L, 2, 4, 4]` from `initial` `[N, 2, 4, 4]`,
    restarting from 1 where `restarts` `[N, L]` int8 is nonzero."""
    return _RotorScanTriton.apply(rotors, initial.to(rotors.dtype), restarts, int(renorm_every))


def rra_triton(
    bivectors: torch.Tensor,
    value: torch.Tensor,
    *,
    accumulate: str,
    initial: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ops_rra_base.RRAKernel`: `rra_naive`'s result (up to rounding) with the Triton scan; float32."""
    batch, length, heads = bivectors.shape[:3]
    restarts = document_restarts(document_ids)
    tokens = bivectors.transpose(1, 2)  # [B, H, L, 10]
    if accumulate == "compact":
        steps = spin4_to_matrix(rotation_rotor(tokens[..., list(ROTATION_INDICES)]))
    else:
        steps = rotor_exp_matrix(tokens)
    start = identity_matrix(batch, heads, like=value) if initial is None else to_matrix(initial)
    flags = None
    if restarts is not None:  # one row of flags per (batch, head) sequence
        flags = restarts[:, None].expand(batch, heads, length).to(torch.int8).reshape(batch * heads, length)
    prefix = rotor_scan_triton(steps.reshape(batch * heads, length, 2, 4, 4), start.reshape(-1, 2, 4, 4), flags)
    prefix = prefix.reshape(batch, heads, length, 2, 4, 4)
    transforms = to_soa(prefix)  # [4, 4, B, H, L]
    if accumulate == "compact":
        transforms = matmul_soa(transforms, boost_matrices_soa(tokens[..., list(BOOST_INDICES)]))
    return sandwich_values(transforms, value), from_matrix(project(prefix[:, :, -1]))


__all__ = ["rotor_scan_triton", "rra_triton"]
