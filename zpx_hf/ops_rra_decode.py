"""Recursive rotor accumulator, one token at a time with few tensor ops (kernel "decode": generation).

Same function as `ops_rra_naive.rra_naive`, written for the per-token cost of generation, where a step is a few
thousand multiply-adds and the time goes to per-op overhead. Every multivector lives in the real 8x8 form of its
M4(C) matrix (M = X + iY -> [[X, -Y], [Y, X]], an algebra isomorphism onto its image): a geometric product is
one 8x8 matmul, reversion and encoding are matmuls with constant tables. Per token and head:

    z = B K                                              rotation angles w (two SU(2) halves) and boost u = A/2
    x_s^2 = sum_{m in block s} z_m^2                     s = 0, 1 (rotations), 2 (boost)
    Q = (cos x_0, sinc x_0 w_0, cos x_1, sinc x_1 w_1)   exp(-B_rot/2) as a quaternion pair (`rotation_rotor`)
    D = (cosh x_2, -sinhc x_2 u)                         exp(-A/2) on `BOOST_ROTOR_MASKS` (`boost_rotor`)
    R_t = N(R_{t-1} dR_t)                                dR = Q (compact) or exp(-B/2) (full, matrix exponential)
    T_t = R_t D (compact) or R_t (full);   y = T v ~T

N is the straight-through Newton projection R (3 - ~R R) / 2 of `rotor_normalize` (value projected, gradient of
the identity), applied every step: a decode call of one token re-projects its state as every sequence call does.
Tables are float64 constants built at import, cached per device and dtype.
"""

from __future__ import annotations

import torch

from .clifford_algebra import (
    BIVECTOR_MASKS,
    BOOST_INDICES,
    BOOST_ROTOR_MASKS,
    NUM_BLADES,
    ROTATION_INDICES,
    conformal_algebra,
    from_matrix,
    matrix_basis,
    rotor_exp_matrix,
    spin4_table,
)
from .ops_rra_base import document_restarts

# squared angles below this are clamped (sqrt and x / x stay finite; the gradient 2 w vanishes there anyway)
_TINY_ANGLE2 = 1e-30


def _build_tables() -> dict[str, torch.Tensor]:
    cpu = torch.device("cpu")
    basis = matrix_basis(cpu, torch.float64)  # [32, 2, 4, 4]
    x, y = basis[:, 0], basis[:, 1]
    encode = torch.cat((torch.cat((x, -y), -1), torch.cat((y, x), -1)), -2).reshape(NUM_BLADES, 64)
    decode = encode.T / 8  # a_A = <M8, E8_A> / 8 (= Re Tr(M E_A^dagger) / 4)
    reverse = conformal_algebra().reverse_signs.to(torch.float64)
    pair = spin4_table("multivector", cpu, torch.float64).reshape(8, NUM_BLADES)
    boost = torch.zeros(len(BOOST_ROTOR_MASKS), NUM_BLADES, dtype=torch.float64)
    boost[range(len(BOOST_ROTOR_MASKS)), list(BOOST_ROTOR_MASKS)] = 1.0
    # z = B K: [0, w_0, 0, w_1, 0, u] (13 = quaternion, quaternion, boost-rotor layout; scalars stay 0)
    generator = spin4_table("generator", cpu, torch.float64)  # [2, 3, 6]
    angles = torch.zeros(len(BIVECTOR_MASKS), 13, dtype=torch.float64)
    for s in range(2):
        angles[list(ROTATION_INDICES), 4 * s + 1 : 4 * s + 4] = generator[s].T
    angles[list(BOOST_INDICES), 9:] = 0.5 * torch.eye(len(BOOST_INDICES), dtype=torch.float64)
    block = torch.zeros(13, 3, dtype=torch.float64)  # sums the squares of each block's vector part
    cosine = torch.zeros(3, 13, dtype=torch.float64)  # cos x_s -> the block's scalar slot
    sinc = torch.zeros(3, 13, dtype=torch.float64)  # sinc x_s -> the block's vector slots (boost: -sinhc)
    for s, (start, stop) in enumerate(((0, 4), (4, 8), (8, 13))):
        block[start + 1 : stop, s] = 1.0
        cosine[s, start] = 1.0
        sinc[s, start + 1 : stop] = -1.0 if s == 2 else 1.0
    forms = torch.zeros(13, 2, 64, dtype=torch.float64)  # (Q, D) -> their 8x8 forms
    forms[:8, 0] = pair @ encode
    forms[8:, 1] = boost @ encode
    return {
        "angles": angles,
        "block": block,
        "cosine": cosine,
        "sinc": sinc,
        "is_boost": torch.tensor([False, False, True]),
        "forms": forms.reshape(13, 128),
        "encode": encode,
        "decode": decode,
        "reverse": decode @ (reverse[:, None] * encode),  # M8 -> (~M)8
    }


_TABLES = _build_tables()
_CACHE: dict[tuple, torch.Tensor] = {}


def step_table(name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A constant of this module on `device` in `dtype` (boolean tables stay boolean), cached in eager mode."""
    key = (name, device, dtype)
    table = _CACHE.get(key)
    if table is None:
        table = _TABLES[name]
        table = table.to(device=device, dtype=dtype if table.is_floating_point() else table.dtype)
        if not torch.compiler.is_compiling():
            _CACHE[key] = table
    return table


def _forms(x: torch.Tensor, table: str) -> torch.Tensor:
    """`[n, k]` -> 8x8 forms `[n, 8, 8]` through a `[k, 64]` table (`encode` or `reverse`)."""
    return (x @ step_table(table, x.device, x.dtype)).view(-1, 8, 8)  # `view`: no Python `unflatten` wrapper


def _closed_form_rotors(bivectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """8x8 forms `[n, 8, 8]` of exp(-B_rot/2) and exp(-A/2) from the closed forms, for bivectors `[n, 10]`."""
    device, dtype = bivectors.device, bivectors.dtype
    z = bivectors @ step_table("angles", device, dtype)
    x = ((z * z) @ step_table("block", device, dtype)).clamp_min(_TINY_ANGLE2).sqrt()
    boost = step_table("is_boost", device, dtype)
    cos = torch.where(boost, torch.cosh(x), torch.cos(x))
    sinc = torch.where(boost, torch.sinh(x), torch.sin(x)) / x
    rotors = torch.addcmul(cos @ step_table("cosine", device, dtype), sinc @ step_table("sinc", device, dtype), z)
    forms = (rotors @ step_table("forms", device, dtype)).view(-1, 2, 8, 8)
    return forms[:, 0], forms[:, 1]


def _project(rotor: torch.Tensor) -> torch.Tensor:
    """Straight-through N(R) = R (3 - ~R R) / 2 = 1.5 R - 0.5 R (~R R) on 8x8 forms `[n, 8, 8]`."""
    norm = torch.bmm(_forms(rotor.view(-1, 64), "reverse"), rotor)
    projected = torch.baddbmm(rotor, rotor, norm, beta=1.5, alpha=-0.5)
    return rotor + (projected - rotor).detach() if rotor.requires_grad else projected


def rra_step(
    bivectors: torch.Tensor, value: torch.Tensor, accumulate: str, state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: bivectors `[B, H, 10]`, values `[B, H, c, 32]`, state `[B, H, 32]` or None (the rotor 1)
    -> `(y [B, H, c, 32], state [B, H, 32])`."""
    batch, heads, channels = value.shape[:3]
    bivectors = bivectors.reshape(-1, bivectors.shape[-1])  # [n = B H, 10]
    if accumulate == "compact":
        step, boost = _closed_form_rotors(bivectors)
    else:
        step, boost = _forms(from_matrix(rotor_exp_matrix(bivectors)), "encode"), None
    rotor = step if state is None else torch.bmm(_forms(state.reshape(-1, NUM_BLADES), "encode"), step)
    rotor = _project(rotor)
    transform = rotor if boost is None else torch.bmm(rotor, boost)
    # T (v ~T): v ~T for every channel in one bmm (channels stacked as rows), then T from the left (broadcast)
    encoded = (value.reshape(-1, channels, NUM_BLADES) @ step_table("encode", value.device, value.dtype)).view(
        -1, channels * 8, 8
    )
    right = torch.bmm(encoded, _forms(transform.view(-1, 64), "reverse")).view(-1, channels, 8, 8)
    rotated = (transform.unsqueeze(1) @ right).view(batch, heads, channels, 64)
    decode = step_table("decode", value.device, value.dtype)
    return rotated @ decode, (rotor.view(batch, heads, 64) @ decode)


def rra_decode(
    bivectors: torch.Tensor,
    value: torch.Tensor,
    *,
    accumulate: str,
    initial: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ops_rra_base.RRAKernel`: `rra_naive`'s result (up to rounding) as `rra_step` per token: one token
    (generation) is one step; a short chunk is a loop of steps, the state reset to 1 where a document starts."""
    if bivectors.shape[1] == 1:  # the decode step alone, without the loop's unbind/stack
        out, state = rra_step(bivectors.select(1, 0), value.select(1, 0), accumulate, initial)
        return out.unsqueeze(1), state
    restarts = document_restarts(document_ids)
    steps, values = bivectors.unbind(1), value.unbind(1)
    out, state = rra_step(steps[0], values[0], accumulate, initial)  # the first token continues `initial`
    outputs = [out]
    one = torch.zeros(NUM_BLADES, device=value.device, dtype=value.dtype)
    one[0] = 1.0
    for t in range(1, len(steps)):
        if restarts is not None:
            state = torch.where(restarts[:, t, None, None], one, state)
        out, state = rra_step(steps[t], values[t], accumulate, state)
        outputs.append(out)
    return torch.stack(outputs, dim=1), state


__all__ = ["rra_decode", "rra_step", "step_table"]
