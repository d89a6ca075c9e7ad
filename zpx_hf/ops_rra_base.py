"""Recursive rotor accumulator below its kernels: group projection, document restarts, the structure-of-arrays
complex algebra the scan and Triton kernels share, and the kernel signature.

Every RRA kernel (`ops_rra_naive`, `ops_rra_scan`, `ops_rra_triton`, `ops_rra_decode`, `ops_rra_export`)
imports only this module, `ops_common` and the algebra; the entry `ops_rra.recursive_rotor_accumulator`
imports the kernels (docs/design.md §6.1).

Structure of arrays (`*_soa`): matrix entries and quaternion components lead, tokens (B, H, L) are the last,
long, contiguous axis, so every product is a few elementwise ops or one small-by-wide GEMM; complex entries use
torch's complex dtype (one multiply, not four real ones).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .clifford_algebra import (
    boost_rotor,
    boost_to_matrix,
    matrix_basis,
    reverse_signs_matrix,
    rotor_normalize,
    to_matrix,
)


class RRAKernel(Protocol):
    """The signature of every RRA kernel; inputs come checked from the entry (`ops_rra.check_rra_inputs`), cast to
    the compute dtype (float32, float64 when an input is float64), autocast off, L >= 1.

    bivectors [B, L, H, 10] (`BIVECTOR_MASKS` order), value [B, L, H, c, 32], accumulate "compact" or "full",
    initial [B, H, 32] (a previous call's state) or None (the rotor 1), document_ids [B, L] int (packed rows: the
    state restarts at each new document, `document_restarts`) or None. Returns (y [B, L, H, c, 32], state
    [B, H, 32])."""

    def __call__(
        self,
        bivectors: torch.Tensor,
        value: torch.Tensor,
        *,
        accumulate: str,
        initial: torch.Tensor | None,
        document_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


# the sequential kernels re-project the state onto the group every RENORM_EVERY steps
RENORM_EVERY = 64


def project(state: torch.Tensor) -> torch.Tensor:
    """Straight-through group projection of rotor matrices `[..., 2, 4, 4]`: the value of
    `rotor_normalize(state)`, the gradient of the identity (the correction is O(rounding) on the group)."""
    return state + (rotor_normalize(state) - state).detach()


def identity_matrix(*shape: int, like: torch.Tensor) -> torch.Tensor:
    """The rotor 1 as M4(C) real/imag parts `[*shape, 2, 4, 4]`."""
    one = torch.zeros(32, device=like.device, dtype=like.dtype)
    one[0] = 1.0
    return to_matrix(one).expand(*shape, 2, 4, 4)


def document_restarts(document_ids: torch.Tensor | None) -> torch.Tensor | None:
    """[B, L] bool, True at the first token of a document that is not the row's first token (None: none)."""
    if document_ids is None:
        return None
    # token t against token max(t - 1, 0) (itself at t = 0): no [B, L - 1] slices, on which export guards L != 2
    previous = torch.arange(document_ids.shape[1], device=document_ids.device).sub(1).clamp(min=0)
    return document_ids.index_select(1, previous) != document_ids


def segment_bounds(restarts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, last) [B, L] int64: the index of the first and of the last token of each token's document."""
    length = restarts.shape[-1]
    positions = torch.arange(length, device=restarts.device).expand_as(restarts)
    first = torch.where(restarts, positions, 0).cummax(-1).values
    ends = torch.ones_like(restarts)
    ends[:, :-1] = restarts[:, 1:]
    last = torch.where(ends, positions, length - 1).flip(-1).cummin(-1).values.flip(-1)
    return first, last


# ---- structure-of-arrays helpers: a matrix is [4, 4, *tokens] complex, a quaternion pair [4, 2, *tokens] ----


def to_soa(matrix: torch.Tensor) -> torch.Tensor:
    """Real/imag parts `[*tokens, 2, 4, 4]` -> complex `[4, 4, *tokens]`."""
    moved = matrix.movedim((-3, -2, -1), (0, 1, 2))
    return torch.complex(moved[0], moved[1])


def from_soa(matrix: torch.Tensor) -> torch.Tensor:
    """Complex `[4, 4, *tokens]` -> real/imag parts `[*tokens, 2, 4, 4]`."""
    return torch.stack((matrix.real, matrix.imag)).movedim((0, 1, 2), (-3, -2, -1))


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # (A B)[i, k] = sum_j A[i, j] B[j, k]: broadcast multiply-adds over the token axes, accumulated in place
    # (autograd never sees this: `_MatmulSoA` differentiates it)
    out = a[:, 0, None] * b[None, 0]
    for j in range(1, a.shape[1]):
        out.addcmul_(a[:, j, None], b[None, j])
    return out


class _MatmulSoA(torch.autograd.Function):
    """Matrix products `[n, n, ...]` with token axes last; the backward written out (dA = dC B^H,
    dB = A^H dC, summed over broadcast axes) costs two products, where autograd's broadcast-multiply backward
    costs several times the forward."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return _product(a, b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = _product(grad, b.conj().transpose(0, 1)).sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:
            grad_b = _product(a.conj().transpose(0, 1), grad).sum_to_size(b.shape)
        return grad_a, grad_b


def matmul_soa(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(A B)[i, k] = sum_j A[i, j] B[j, k] for `[4, 4, ...]` (token axes broadcast)."""
    return _MatmulSoA.apply(a, b)


def reverse_soa(matrix: torch.Tensor) -> torch.Tensor:
    """~M for `[4, 4, ...]`: the anti-diagonal transpose with signs of `matrix_reverse`."""
    signs = reverse_signs_matrix(matrix.device, matrix.real.dtype)
    return matrix.flip(0, 1).transpose(0, 1) * signs.reshape(4, 4, *([1] * (matrix.dim() - 2)))


def boost_matrices_soa(boost: torch.Tensor) -> torch.Tensor:
    """Per-token boost rotors exp(-A/2) from boost bivectors `[*tokens, 4]` -> complex `[4, 4, *tokens]`."""
    return to_soa(boost_to_matrix(boost_rotor(boost)))


def encode_values(value: torch.Tensor) -> torch.Tensor:
    """Values `[B, L, H, c, 32]` -> complex matrices `[4, 4, c, B, H, L]` (one GEMM with the basis)."""
    batch, length, heads, channels = value.shape[:4]
    basis = matrix_basis(value.device, value.dtype).reshape(32, 32)  # blade x (re/im, i, j)
    flat = value.permute(3, 0, 2, 1, 4).reshape(-1, 32)  # (c, B, H, L) x blade
    out = (basis.T @ flat.T).reshape(2, 4, 4, channels, batch, heads, length)
    return torch.complex(out[0], out[1])


def decode_values(matrix: torch.Tensor) -> torch.Tensor:
    """Complex `[4, 4, c, B, H, L]` -> multivectors `[B, L, H, c, 32]`: a_A = Re Tr(M E_A^dagger) / 4."""
    channels, batch, heads, length = matrix.shape[2:]
    basis = matrix_basis(matrix.device, matrix.real.dtype).reshape(32, 32)
    parts = torch.stack((matrix.real, matrix.imag)).reshape(32, -1)
    out = (basis @ parts / 4).reshape(32, channels, batch, heads, length)
    return out.permute(2, 4, 3, 1, 0)


def sandwich_values(transforms: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """y = T v ~T for transforms `[4, 4, B, H, L]` (complex) and values `[B, L, H, c, 32]`."""
    transforms = transforms.unsqueeze(2)  # broadcast over channels
    rotated = matmul_soa(matmul_soa(transforms, encode_values(value)), reverse_soa(transforms))
    return decode_values(rotated)


__all__ = [
    "RENORM_EVERY",
    "RRAKernel",
    "boost_matrices_soa",
    "decode_values",
    "document_restarts",
    "encode_values",
    "from_soa",
    "identity_matrix",
    "matmul_soa",
    "project",
    "reverse_soa",
    "sandwich_values",
    "segment_bounds",
    "to_soa",
]
