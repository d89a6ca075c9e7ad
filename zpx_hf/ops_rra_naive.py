"""Recursive rotor accumulator, the readable reference (docs/design.md §5.5): one token at a time (kernel "naive").

    dR_t = exp(-B_t/2)                  matrix exponential in M4(C) (`rotor_exp_matrix`)
    R_t  = R_{t-1} dR_t                 R_{-1} = `initial`, else 1; R_{t-1} = 1 where a new document starts
    y_t  = T_t v_t ~T_t                 per value channel, grade-preserving

with T_t = R_t for `accumulate="full"`, and for `"compact"` (docs/design.md §5.5) R_t accumulating only the 6 rotation
bivectors while the 4 boosts A_t act per token: T_t = R_t exp(-A_t/2). The state is re-projected onto the
group every `RENORM_EVERY` steps and on return (straight-through: `ops_rra_base.project`).
"""

from __future__ import annotations

import torch

from .clifford_algebra import ROTATION_INDICES, complex_matmul, from_matrix, rotor_exp_matrix, sandwich, to_matrix
from .ops_rra_base import RENORM_EVERY, document_restarts, identity_matrix, project


def split_bivectors(bivectors: torch.Tensor, accumulate: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(accumulated, per-token) bivectors `[..., 10]`: compact keeps the rotations in the first and the boosts
    in the second; full accumulates everything."""
    if accumulate == "full":
        return bivectors, None
    rotation = torch.zeros(bivectors.shape[-1], device=bivectors.device, dtype=bivectors.dtype)
    rotation[list(ROTATION_INDICES)] = 1.0
    return bivectors * rotation, bivectors * (1.0 - rotation)


def rra_naive(
    bivectors: torch.Tensor,
    value: torch.Tensor,
    *,
    accumulate: str,
    initial: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ops_rra_base.RRAKernel`, the loop as written: `(y [B, L, H, c, 32], final rotor [B, H, 32])` in the
    inputs' dtype."""
    batch, _, heads = bivectors.shape[:3]
    restarts = document_restarts(document_ids)  # [B, L] bool: a document starts (None: one per row)
    accumulated, local = split_bivectors(bivectors, accumulate)
    one = identity_matrix(batch, heads, like=value)
    state = one if initial is None else to_matrix(initial)
    outputs = []
    # unbind (not x[:, t]): its backward is one stack; per-step indexing would cost O(L) each
    steps = rotor_exp_matrix(accumulated).unbind(1)
    per_token = rotor_exp_matrix(local).unbind(1) if local is not None else [None] * len(steps)
    for t, (step, local_rotor, v) in enumerate(zip(steps, per_token, value.unbind(1))):
        if restarts is not None and t > 0:
            state = torch.where(restarts[:, t, None, None, None, None], one, state)
        state = complex_matmul(state, step)
        if (t + 1) % RENORM_EVERY == 0:
            state = project(state)
        transform = state if local_rotor is None else complex_matmul(state, local_rotor)
        outputs.append(sandwich(transform[:, :, None], v))  # [B, H, c, 32]
    return torch.stack(outputs, dim=1), from_matrix(project(state))


__all__ = ["rra_naive", "split_bivectors"]
