"""Recursive rotor accumulator (RRA, docs/design.md §5.5): entry point and dispatch.

Per token t and head, a bivector B_t gives the rotor dR_t = exp(-B_t/2); the state is the prefix product

    R_t = R_{t-1} dR_t      (R_{-1} = 1, or the state returned by the previous call)
    y_t = T_t v_t ~T_t      (per value channel; grade-preserving)

`accumulate="full"` is this formula as written (T_t = R_t). `"compact"` (the default) accumulates only the
6 rotation bivectors (e_i e_j, i, j <= 4) and applies the 4 boosts A_t (e_i e5) per token:
T_t = R_t exp(-A_t/2). Why: Spin(4,1) is not compact. Rotation rotors are unitary in the M4(C)
representation and their products stay bounded; a product of boosts grows without bound, and no float
format keeps R~R = 1 once |R|^2 eps is large, so "full" suits short sequences or small boosts.

Kernels, one signature and one function (`rra_naive` is the definition, the others are tested against it):

* `"sequential"` - `ops_rra_naive.py`: the loop as written, matrix exponentials (the readable reference).
* `"scan"` - `ops_rra_scan.py`: closed-form rotors, a log-depth scan, structure-of-arrays complex products.
* `"triton"` - `ops_rra_triton.py`: a Triton scan kernel (forward and backward), CUDA.
* `"recurrent"` - `ops_rra_step.py`: a loop of lean single-token steps (tables and matmuls, few ops): decode.
* `"auto"` - recurrent for a single token (generation with the cache), else triton for CUDA tensors when
  Triton imports, else scan.

Numerics: everything algebraic runs in float32 (float64 when an input is float64), with autocast disabled:
under bf16 the inputs are cast up and the output is cast back to `value.dtype`. Rounding drift off the
group is removed by re-projection (R <- R (3 - ~R R) / 2, or q / |q| for the compact scan's quaternions),
straight-through: the projected value, the gradient of the identity (the correction is O(rounding)).

State: the rotor R_{L-1} as multivector coefficients `[B, H, 32]` (float32; R~R = 1), re-projected on
return; passing it back as `initial` continues the sequence exactly as one uninterrupted call would.
"""

from __future__ import annotations

import torch

from .clifford_algebra import BIVECTOR_MASKS, NUM_BLADES, from_matrix
from .ops_rra_naive import rra_naive
from .ops_rra_scan import accumulated_rotors, from_soa, rra_scan
from .ops_rra_step import rra_recurrent, rra_step
from .ops_rra_triton import HAS_TRITON, rra_triton

RRA_KERNELS = ("sequential", "scan", "triton", "recurrent")
RRA_ACCUMULATE = ("compact", "full")
_IMPLEMENTATIONS = {"sequential": rra_naive, "scan": rra_scan, "triton": rra_triton, "recurrent": rra_recurrent}


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is unknown; use one of {list(choices)}.")


def _resolve_kernel(kernel: str, device: torch.device, length: int) -> str:
    _check_choice("kernel", kernel, ("auto", *RRA_KERNELS))
    if kernel == "auto":
        if length == 1:
            return "recurrent"
        return "triton" if HAS_TRITON and device.type == "cuda" else "scan"
    if kernel == "triton" and not HAS_TRITON:
        raise ValueError("kernel='triton' needs the `triton` package; install it or use kernel='scan'.")
    return kernel


def _check_inputs(bivectors: torch.Tensor, value: torch.Tensor | None, initial: torch.Tensor | None) -> None:
    if bivectors.dim() != 4 or bivectors.shape[-1] != len(BIVECTOR_MASKS):
        raise ValueError(f"bivectors must be [B, L, H, {len(BIVECTOR_MASKS)}]; got {tuple(bivectors.shape)}.")
    batch, length, heads = bivectors.shape[:3]
    if value is not None and (value.dim() != 5 or value.shape[:3] != bivectors.shape[:3] or value.shape[-1] != 32):
        raise ValueError(
            f"value must be [B, L, H, c, {NUM_BLADES}] with B, L, H of bivectors {tuple(bivectors.shape[:3])}; "
            f"got {tuple(value.shape)}."
        )
    if initial is not None and tuple(initial.shape) != (batch, heads, NUM_BLADES):
        raise ValueError(
            f"initial must be the returned state [B, H, {NUM_BLADES}] = {(batch, heads, NUM_BLADES)}; "
            f"got {tuple(initial.shape)}."
        )


def _identity_state(batch: int, heads: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    state = torch.zeros(batch, heads, NUM_BLADES, device=device, dtype=dtype)
    state[..., 0] = 1.0
    return state


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def recursive_rotor_accumulator(
    bivectors: torch.Tensor,
    value: torch.Tensor,
    *,
    accumulate: str = "compact",
    initial: torch.Tensor | None = None,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """RRA for bivectors `[B, L, H, 10]` (`BIVECTOR_MASKS` order) and values `[B, L, H, c, 32]`.

    Returns `(y [B, L, H, c, 32] in value.dtype, state [B, H, 32])`; `initial` is a previous call's state.
    """
    _check_choice("accumulate", accumulate, RRA_ACCUMULATE)
    _check_inputs(bivectors, value, initial)
    kernel = _resolve_kernel(kernel, bivectors.device, bivectors.shape[1])
    dtype = _compute_dtype(bivectors, value, initial)
    if bivectors.shape[1] == 0:  # nothing to accumulate: the state passes through
        batch, _, heads = bivectors.shape[:3]
        state = initial.to(dtype) if initial is not None else _identity_state(batch, heads, bivectors.device, dtype)
        return value.clone(), state
    inputs = (_cast(bivectors, dtype), _cast(value, dtype), None if initial is None else _cast(initial, dtype))
    if kernel == "recurrent" and bivectors.shape[1] == 1 and not torch.is_autocast_enabled(bivectors.device.type):
        # one token (decode): the step alone, without the loop's unbind/stack or an autocast context
        out, state = rra_step(inputs[0].select(1, 0), inputs[1].select(1, 0), accumulate, inputs[2])
        return _cast(out.unsqueeze(1), value.dtype), state
    with torch.autocast(device_type=bivectors.device.type, enabled=False):
        out, state = _IMPLEMENTATIONS[kernel](inputs[0], inputs[1], accumulate, inputs[2])
    return _cast(out, value.dtype), state


def rotor_trajectory(
    bivectors: torch.Tensor, *, accumulate: str = "compact", initial: torch.Tensor | None = None
) -> torch.Tensor:
    """The accumulated rotor R_t per token as multivector coefficients `[B, L, H, 32]` (for inspection;
    compact: the rotation part, the boosts are not accumulated)."""
    _check_choice("accumulate", accumulate, RRA_ACCUMULATE)
    _check_inputs(bivectors, None, initial)
    dtype = _compute_dtype(bivectors, initial)
    if bivectors.shape[1] == 0:
        return bivectors.new_zeros(*bivectors.shape[:3], NUM_BLADES, dtype=dtype)
    with torch.autocast(device_type=bivectors.device.type, enabled=False):
        rotors, _ = accumulated_rotors(
            bivectors.to(dtype), accumulate, None if initial is None else initial.to(dtype)
        )  # [4, 4, B, H, L]
        return from_matrix(from_soa(rotors)).transpose(1, 2)


__all__ = ["HAS_TRITON", "RRA_ACCUMULATE", "RRA_KERNELS", "recursive_rotor_accumulator", "rotor_trajectory"]
