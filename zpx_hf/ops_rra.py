"""Recursive rotor accumulator (RRA, SPEC §4): rotor prefix products and the sandwich output.

Per token t and head a bivector B_t gives the rotor dR_t = exp(-B_t/2); the state is the prefix product

    R_t = R_{t-1} dR_t      (R_{-1} = 1, or the cached state during generation)
    y_t = R_t v_t ~R_t      (per value channel; grade-preserving)

Rotors are carried in the Cl(4,1) = M4(C) representation as real/imag parts `[..., 2, 4, 4]`, in float32:
a product is one complex 4x4 matmul, exact in the algebra up to float rounding.

Stability. Two separate effects:

* Drift off the group. Rounding in a long product drifts linearly (measured: |R~R - 1| ~ 1.5e-3 after
  16,384 unnormalised fp32 steps). Every scan re-projects the state with one Newton step
  R <- R (3 - ~R R) / 2 (`rotor_normalize`): the sequential and Triton scans every `RENORM_EVERY` = 64
  steps, the chunked scan at chunk boundaries. The projection is straight-through (value projected,
  gradient of the identity): on the group it changes R by O(rounding), so gradients are unaffected
  beyond that order. Measured after 16,384 steps of random rotations (tests): 6e-8 (sequential),
  1.3e-5 (chunked).
* Growth. Spin(4,1) is not compact. In this representation e1..e4 are Hermitian and e5 anti-Hermitian,
  so the 6 rotation bivectors e_i e_j (i, j <= 4) are anti-Hermitian and their rotors unitary, while the 4
  boosts e_i e5 are Hermitian with positive-definite exponentials. A product of boosts grows without
  bound and no float format keeps R~R = 1 once |R|^2 eps is large (measured: boost coefficients of std
  0.02 give |R~R - 1| ~ 0.3 after 16,384 steps, std 0.1 overflows). `local_bivectors` lets the model
  accumulate the compact part and apply the rest per token (Versor's default,
  `rra_accumulate="compact"`); passing all 10 components as `bivectors` is the paper's RRA as written.

Scan paths, same signature `(rotors [N, L, 2, 4, 4], initial [N, 2, 4, 4] | None) -> [N, L, 2, 4, 4]`:

* `rotor_scan_sequential` - the loop as written (reference).
* `rotor_scan_chunked` - chunked parallel scan: prefix products inside chunks of size c (vectorised over
  chunks), a scan over the chunk totals, one combining product. O(L) work, ~2 sqrt(L) Python steps.
* `rotor_scan_triton` - Triton kernel: each program carries BLOCK_S sequences through time (forward),
  and runs the reverse recursion for the backward: with G_t = dL/dR_t and
  Gbar_t = G_t + Gbar_{t+1} dR_{t+1}^H:  dL/d dR_t = R_{t-1}^H Gbar_t,  dL/dR_{-1} = Gbar_0 dR_0^H.

`rotor_scan` is the one dispatch function; `recursive_rotor_accumulator` is the full op.
"""

from __future__ import annotations

import math

import torch

from .clifford_algebra import (
    complex_matmul,
    from_matrix,
    matrix_reverse,
    rotor_exp_matrix,
    rotor_normalize,
    to_matrix,
)

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # remote-code copies and CPU-only installs run the PyTorch scans
    triton = None
    tl = None
    HAS_TRITON = False

RRA_KERNELS = ("auto", "sequential", "chunked", "triton")
# the sequential and Triton scans re-project the state onto the group every RENORM_EVERY steps
RENORM_EVERY = 64


def identity_rotor(*shape: int, device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The rotor 1 as `[*shape, 2, 4, 4]`."""
    eye = torch.eye(4, device=device, dtype=dtype)
    return torch.stack((eye, torch.zeros_like(eye))).expand(*shape, 2, 4, 4).contiguous()


def _project(state: torch.Tensor) -> torch.Tensor:
    """Straight-through group projection: the value of `rotor_normalize(state)`, the gradient of identity
    (the correction is O(rounding); see the module docstring)."""
    return state + (rotor_normalize(state) - state).detach()


def rotor_scan_sequential(
    rotors: torch.Tensor, initial: torch.Tensor | None = None, renorm_every: int = RENORM_EVERY
) -> torch.Tensor:
    """R_t = R_{t-1} dR_t, one step at a time; the state is re-projected after every `renorm_every` steps."""
    state = identity_rotor(rotors.shape[0], device=rotors.device, dtype=rotors.dtype) if initial is None else initial
    outputs = []
    # unbind (not rotors[:, t]): its backward is one stack; per-step indexing would cost O(L) each
    for t, rotor in enumerate(rotors.unbind(1)):
        state = complex_matmul(state, rotor)
        if renorm_every and (t + 1) % renorm_every == 0:
            state = _project(state)
        outputs.append(state)
    return torch.stack(outputs, dim=1)


def rotor_scan_chunked(
    rotors: torch.Tensor, initial: torch.Tensor | None = None, chunk_size: int | None = None
) -> torch.Tensor:
    """Chunked parallel prefix product (the loop's result up to rounding, O(L) work). Chunk-boundary states
    are re-projected onto the group (straight-through)."""
    num_seq, length = rotors.shape[:2]
    if length == 0:
        return rotors
    chunk = chunk_size or max(1, math.isqrt(length))
    num_chunks = -(-length // chunk)
    pad = num_chunks * chunk - length
    if pad:
        filler = identity_rotor(num_seq, pad, device=rotors.device, dtype=rotors.dtype)
        rotors = torch.cat((rotors, filler), dim=1)
    blocks = rotors.reshape(num_seq, num_chunks, chunk, 2, 4, 4)
    # prefix products inside every chunk at once
    steps = blocks.unbind(2)
    local = [steps[0]]
    for step in steps[1:]:
        local.append(complex_matmul(local[-1], step))
    local = torch.stack(local, dim=2)  # [N, n, c, 2, 4, 4]
    # exclusive scan over the chunk totals
    carry = identity_rotor(num_seq, device=rotors.device, dtype=rotors.dtype) if initial is None else initial
    carries = [carry]
    for total in local[:, :-1, -1].unbind(1):
        carries.append(_project(complex_matmul(carries[-1], total)))
    carries = torch.stack(carries, dim=1)  # [N, n, 2, 4, 4]
    out = complex_matmul(carries[:, :, None].expand_as(local), local)
    return out.reshape(num_seq, num_chunks * chunk, 2, 4, 4)[:, :length]


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
        ROTORS, INITIAL, OUT, num_seq, seq_len, renorm_every, BLOCK_S: tl.constexpr, RENORM: tl.constexpr
    ):
        offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
        entry = tl.arange(0, 4)[:, None] * 4 + tl.arange(0, 4)[None, :]
        mask = (offs_s < num_seq)[:, None, None]
        state = offs_s[:, None, None] * 32 + entry[None, :, :]
        rr = tl.load(INITIAL + state, mask=mask, other=0.0).to(tl.float32)
        ri = tl.load(INITIAL + state + 16, mask=mask, other=0.0).to(tl.float32)
        seq = offs_s[:, None, None] * (seq_len * 32) + entry[None, :, :]
        for t in range(seq_len):
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
        ROTORS, INITIAL, OUT, GRAD, GRAD_ROTORS, GRAD_INITIAL, num_seq, seq_len, BLOCK_S: tl.constexpr
    ):
        offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
        entry = tl.arange(0, 4)[:, None] * 4 + tl.arange(0, 4)[None, :]
        mask = (offs_s < num_seq)[:, None, None]
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
            dr, di = _cmul_adjoint_left(pr, pi, gr, gi)
            tl.store(GRAD_ROTORS + seq + t * 32, dr, mask=mask)
            tl.store(GRAD_ROTORS + seq + t * 32 + 16, di, mask=mask)
            rr = tl.load(ROTORS + seq + t * 32, mask=mask, other=0.0).to(tl.float32)
            ri = tl.load(ROTORS + seq + t * 32 + 16, mask=mask, other=0.0).to(tl.float32)
            cr, ci = _cmul_adjoint_right(gr, gi, rr, ri)
        tl.store(GRAD_INITIAL + state, cr, mask=mask)
        tl.store(GRAD_INITIAL + state + 16, ci, mask=mask)


def _scan_block(device: torch.device) -> int:
    return 16 if device.type != "cuda" else 32


class _RotorScanTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rotors, initial, renorm_every):  # type: ignore[override]
        rotors = rotors.contiguous()
        initial = initial.contiguous()
        num_seq, length = rotors.shape[:2]
        out = torch.empty_like(rotors)
        block = _scan_block(rotors.device)
        _rotor_scan_fwd_kernel[(triton.cdiv(num_seq, block),)](
            rotors, initial, out, num_seq, length, max(renorm_every, 1), BLOCK_S=block, RENORM=renorm_every > 0
        )
        ctx.save_for_backward(rotors, initial, out)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        rotors, initial, out = ctx.saved_tensors
        num_seq, length = rotors.shape[:2]
        grad_rotors = torch.empty_like(rotors)
        grad_initial = torch.empty_like(initial)
        block = _scan_block(rotors.device)
        _rotor_scan_bwd_kernel[(triton.cdiv(num_seq, block),)](
            rotors, initial, out, grad.contiguous(), grad_rotors, grad_initial, num_seq, length, BLOCK_S=block
        )
        return grad_rotors, grad_initial, None


def rotor_scan_triton(
    rotors: torch.Tensor, initial: torch.Tensor | None = None, renorm_every: int = RENORM_EVERY
) -> torch.Tensor:
    """Triton scan (float32); same result and gradients as `rotor_scan_sequential`."""
    if not HAS_TRITON:
        raise RuntimeError("rotor_scan_triton needs `triton`; install it or use rra_kernel='chunked'.")
    if rotors.dtype != torch.float32:
        raise ValueError(f"rotor_scan_triton works in float32; got {rotors.dtype}.")
    if initial is None:
        initial = identity_rotor(rotors.shape[0], device=rotors.device, dtype=rotors.dtype)
    return _RotorScanTriton.apply(rotors, initial.to(rotors.dtype), int(renorm_every))


def rotor_scan(rotors: torch.Tensor, initial: torch.Tensor | None = None, kernel: str = "auto") -> torch.Tensor:
    """Prefix products of rotors `[N, L, 2, 4, 4]`; `kernel="auto"` runs Triton on CUDA when importable,
    else the chunked scan."""
    if kernel not in RRA_KERNELS:
        raise ValueError(f"RRA kernel {kernel!r} is unknown; use one of {list(RRA_KERNELS)}.")
    if kernel == "auto":
        kernel = "triton" if HAS_TRITON and rotors.is_cuda else "chunked"
    if kernel == "triton":
        return rotor_scan_triton(rotors, initial)
    if kernel == "sequential":
        return rotor_scan_sequential(rotors, initial)
    return rotor_scan_chunked(rotors, initial)


def recursive_rotor_accumulator(
    bivectors: torch.Tensor,
    values: torch.Tensor,
    initial: torch.Tensor | None = None,
    kernel: str = "auto",
    local_bivectors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RRA for bivectors `[B, L, H, 10]` and values `[B, L, H, c, 32]`.

    y_t = T_t v_t ~T_t with T_t = R_t exp(-A_t/2), R_t = R_{t-1} exp(-B_t/2), R_{-1} = `initial` (identity
    if None) and A_t = `local_bivectors` (a per-token rotor that is not accumulated; omitted if None).
    Returns `(y [B, L, H, c, 32], final state R_{L-1} [B, H, 2, 4, 4])`. Computed in float32.
    """
    batch, length, heads = bivectors.shape[:3]
    rotors = rotor_exp_matrix(bivectors.float())  # [B, L, H, 2, 4, 4]
    rotors = rotors.transpose(1, 2).reshape(batch * heads, length, 2, 4, 4)
    start = None if initial is None else initial.float().reshape(batch * heads, 2, 4, 4)
    prefix = rotor_scan(rotors, start, kernel=kernel).reshape(batch, heads, length, 2, 4, 4).transpose(1, 2)
    if length:
        final = prefix[:, -1]
    elif initial is not None:
        final = initial.float()
    else:
        final = identity_rotor(batch, heads, device=bivectors.device)
    transform = prefix
    if local_bivectors is not None:
        transform = complex_matmul(prefix, rotor_exp_matrix(local_bivectors.float()))
    # y = T v ~T, per channel
    shape = (*values.shape[:4], 2, 4, 4)
    left = transform.unsqueeze(3).expand(shape)
    right = matrix_reverse(transform).unsqueeze(3).expand(shape)
    out = from_matrix(complex_matmul(complex_matmul(left, to_matrix(values.float())), right))
    return out.to(values.dtype), final


__all__ = [
    "HAS_TRITON",
    "RRA_KERNELS",
    "identity_rotor",
    "recursive_rotor_accumulator",
    "rotor_scan",
    "rotor_scan_chunked",
    "rotor_scan_sequential",
    "rotor_scan_triton",
]
