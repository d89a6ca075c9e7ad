"""Recursive rotor accumulator, the readable reference (docs/design.md §5.5): one token at a time.

    dR_t = exp(-B_t/2)                  matrix exponential in M4(C) (`rotor_exp_matrix`)
    R_t  = R_{t-1} dR_t                 R_{-1} = `initial`, else 1
    y_t  = T_t v_t ~T_t                 per value channel, grade-preserving

with T_t = R_t for `accumulate="full"`, and for `"compact"` (docs/design.md §5.5) R_t accumulating only the 6 rotation
bivectors while the 4 boosts A_t act per token: T_t = R_t exp(-A_t/2). The state is re-projected onto the
group every `RENORM_EVERY` steps and on return (straight-through: `project`).
"""

from __future__ import annotations

import torch

from .clifford_algebra import (
    ROTATION_INDICES,
    complex_matmul,
    from_matrix,
    rotor_exp_matrix,
    rotor_normalize,
    sandwich,
    to_matrix,
)

# the loop re-projects the state onto the group every RENORM_EVERY steps
RENORM_EVERY = 64


def split_bivectors(bivectors: torch.Tensor, accumulate: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(accumulated, per-token) bivectors `[..., 10]`: compact keeps the rotations in the first and the boosts
    in the second; full accumulates everything."""
    if accumulate == "full":
        return bivectors, None
    rotation = torch.zeros(bivectors.shape[-1], device=bivectors.device, dtype=bivectors.dtype)
    rotation[list(ROTATION_INDICES)] = 1.0
    return bivectors * rotation, bivectors * (1.0 - rotation)


def project(state: torch.Tensor) -> torch.Tensor:
    """Straight-through group projection of rotor matrices `[..., 2, 4, 4]`: the value of
    `rotor_normalize(state)`, the gradient of the identity (the correction is O(rounding) on the group)."""
    return state + (rotor_normalize(state) - state).detach()


def identity_matrix(*shape: int, like: torch.Tensor) -> torch.Tensor:
    """The rotor 1 as M4(C) real/imag parts `[*shape, 2, 4, 4]`."""
    one = torch.zeros(32, device=like.device, dtype=like.dtype)
    one[0] = 1.0
    return to_matrix(one).expand(*shape, 2, 4, 4)


def rra_naive(
    bivectors: torch.Tensor, value: torch.Tensor, accumulate: str = "compact", initial: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bivectors `[B, L, H, 10]`, values `[B, L, H, c, 32]`, initial rotor `[B, H, 32]` (multivector
    coefficients) or None -> `(y [B, L, H, c, 32], final rotor [B, H, 32])`, in the inputs' dtype."""
    batch, _, heads = bivectors.shape[:3]
    accumulated, local = split_bivectors(bivectors, accumulate)
    state = identity_matrix(batch, heads, like=value) if initial is None else to_matrix(initial)
    outputs = []
    # unbind (not x[:, t]): its backward is one stack; per-step indexing would cost O(L) each
    steps = rotor_exp_matrix(accumulated).unbind(1)
    per_token = rotor_exp_matrix(local).unbind(1) if local is not None else [None] * len(steps)
    for t, (step, local_rotor, v) in enumerate(zip(steps, per_token, value.unbind(1))):
        state = complex_matmul(state, step)
        if (t + 1) % RENORM_EVERY == 0:
            state = project(state)
        transform = state if local_rotor is None else complex_matmul(state, local_rotor)
        outputs.append(sandwich(transform[:, :, None], v))  # [B, H, c, 32]
    out = torch.stack(outputs, dim=1) if outputs else value.clone()
    return out, from_matrix(project(state))


__all__ = ["RENORM_EVERY", "identity_matrix", "project", "rra_naive", "split_bivectors"]
