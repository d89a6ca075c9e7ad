"""Recursive rotor accumulator (RRA, docs/design.md §5.5): the one entry point, its checks, dispatch and shared pieces.

Per token t and head, a bivector B_t gives the rotor dR_t = exp(-B_t/2); the state is the prefix product

    R_t = R_{t-1} dR_t      (R_{-1} = 1, or the state returned by the previous call)
    y_t = T_t v_t ~T_t      (per value channel; grade-preserving)

`accumulate="full"` is this formula as written (T_t = R_t). `"compact"` (the default) accumulates only the
6 rotation bivectors (e_i e_j, i, j <= 4) and applies the 4 boosts A_t (e_i e5) per token:
T_t = R_t exp(-A_t/2). Why: Spin(4,1) is not compact. Rotation rotors are unitary in the M4(C)
representation and their products stay bounded; a product of boosts grows without bound, and no float
format keeps R~R = 1 once |R|^2 eps is large, so "full" suits short sequences or small boosts.

Packed rows (`document_ids`, equal within a document): the state restarts at 1 at the first token of every
document after the row's first (which continues `initial`), so no document sees another's rotors.

Kernels (`RRA_KERNELS`), one signature (`ops_rra_base.RRAKernel`) and one function (`rra_naive` is the
definition, the others are tested against it); earlier names still select them, with a FutureWarning
(`ops_common.LEGACY_KERNEL_NAMES`):

* `"naive"` - `ops_rra_naive.py`: the loop as written, matrix exponentials (earlier: "sequential").
* `"scan"` - `ops_rra_scan.py`: closed-form rotors, a log-depth scan, structure-of-arrays complex products
  (earlier: "cpu").
* `"triton"` - `ops_rra_triton.py`: a Triton scan kernel (forward and backward), CUDA.
* `"export"` - `ops_rra_export.py`: real arithmetic and a scan traced independently of the length, for
  `torch.export` / ONNX (what "auto" picks while exporting).
* `"decode"` - `ops_rra_decode.py`: lean single-token steps (tables and matmuls, few ops): generation
  (earlier: "recurrent").
* `"auto"` - export while `torch.compiler.is_exporting()`, else decode for a single token (generation with
  the cache), else triton for CUDA tensors computed in float32 when Triton imports, else scan.

`recursive_rotor_accumulator` checks the inputs once and resolves the kernel once; kernels only compute.
Numerics: everything algebraic runs in float32 (float64 when an input is float64), with autocast disabled:
under bf16 the inputs are cast up and the output is cast back to `value.dtype`. Rounding drift off the
group is removed by re-projection (R <- R (3 - ~R R) / 2, or q / |q| for the compact scan's quaternions),
straight-through: the projected value, the gradient of the identity (the correction is O(rounding)).

State: the rotor R_{L-1} as multivector coefficients `[B, H, 32]` (float32; R~R = 1), re-projected on
return; passing it back as `initial` continues the sequence exactly as one uninterrupted call would.
"""

from __future__ import annotations

from functools import partial
from typing import overload

import torch

from .clifford_algebra import BIVECTOR_MASKS, NUM_BLADES, from_matrix
from .ops_common import HAS_TRITON, check_triton_kernel, compute_dtype, kernel_name
from .ops_rra_base import RRAKernel, document_restarts, from_soa, identity_matrix
from .ops_rra_decode import rra_decode
from .ops_rra_export import rra_export
from .ops_rra_naive import rra_naive
from .ops_rra_scan import accumulated_rotors, rra_scan
from .ops_rra_triton import rra_triton

RRA_KERNELS = ("naive", "scan", "triton", "decode", "export")
RRA_ACCUMULATE = ("compact", "full")
_KERNEL_FUNCTIONS: dict[str, RRAKernel] = {
    "naive": rra_naive,
    "scan": rra_scan,
    "triton": rra_triton,
    "decode": rra_decode,
    "export": rra_export,
}


def resolve_rra_kernel(kernel: str, device: torch.device, length: int, dtype: torch.dtype = torch.float32) -> str:
    """The kernel that runs, a name of `RRA_KERNELS` (old names mapped; "auto" resolved for this call, `dtype`
    the compute dtype); whether an explicit "triton" can run is `recursive_rotor_accumulator`'s check."""
    kernel = kernel_name(kernel, RRA_KERNELS, "RRA")  # earlier names mapped, warned (ops_common)
    if kernel == "auto":
        if torch.compiler.is_exporting():  # the scans loop over the length in Python; export traces once
            return "export"
        if length == 1:
            return "decode"
        # float64 stays on the exact "scan" kernel: the Triton scan computes in float32
        return "triton" if HAS_TRITON and device.type == "cuda" and dtype == torch.float32 else "scan"
    return kernel


def check_rra_inputs(
    bivectors: torch.Tensor,
    value: torch.Tensor | None,
    initial: torch.Tensor | None,
    accumulate: str,
    document_ids: torch.Tensor | None,
) -> None:
    """ValueError naming the argument when shapes or settings do not fit the contract."""
    if accumulate not in RRA_ACCUMULATE:
        raise ValueError(f"accumulate={accumulate!r} is unknown; use one of {list(RRA_ACCUMULATE)}.")
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
    if document_ids is not None and (
        tuple(document_ids.shape) != (batch, length) or document_ids.is_floating_point() or document_ids.is_complex()
    ):
        raise ValueError(
            f"document_ids must be an integer [B, L] = [{batch}, {length}] tensor (equal within a document, "
            f"ops_common.document_ids_from_position_ids); got {document_ids.dtype} {tuple(document_ids.shape)}."
        )


@overload
def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor: ...
@overload
def _cast(x: None, dtype: torch.dtype) -> None: ...
def _cast(x: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return x if x is None or x.dtype == dtype else x.to(dtype)


def recursive_rotor_accumulator(
    bivectors: torch.Tensor,
    value: torch.Tensor,
    *,
    accumulate: str = "compact",
    initial: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """RRA for bivectors `[B, L, H, 10]` (`BIVECTOR_MASKS` order) and values `[B, L, H, c, 32]`.

    `document_ids` [B, L] int: packed rows, the state restarts at each new document (None = one document per
    row). Returns `(y [B, L, H, c, 32] in value.dtype, state [B, H, 32])`; `initial` is a previous call's
    state (it continues the row's first document).
    """
    check_rra_inputs(bivectors, value, initial, accumulate, document_ids)
    dtype = compute_dtype(bivectors, value, initial)
    name = resolve_rra_kernel(kernel, bivectors.device, bivectors.shape[1], dtype)
    if name == "triton":  # the package and a CUDA tensor (or the interpreter), else a clear error
        check_triton_kernel("RRA", bivectors, (torch.float32, torch.float16, torch.bfloat16), "scan")
        if dtype != torch.float32:
            raise ValueError(
                "kernel='triton' computes in float32; pass float32 (or bf16/fp16) inputs or use kernel='scan'."
            )
    if bivectors.shape[1] == 0:  # nothing to accumulate: the state passes through
        batch, _, heads = bivectors.shape[:3]
        state = initial.to(dtype) if initial is not None else from_matrix(identity_matrix(batch, heads, like=value))
        return value.clone(), state.to(dtype)
    if document_ids is not None and document_ids.device != bivectors.device:
        document_ids = document_ids.to(bivectors.device)
    fn = partial(
        _KERNEL_FUNCTIONS[name],
        _cast(bivectors, dtype),
        _cast(value, dtype),
        accumulate=accumulate,
        initial=_cast(initial, dtype),
        document_ids=document_ids,
    )
    if torch.is_autocast_enabled(bivectors.device.type):
        with torch.autocast(device_type=bivectors.device.type, enabled=False):
            out, state = fn()
    else:  # decode runs one token per layer: no context manager when there is nothing to turn off
        out, state = fn()
    return _cast(out, value.dtype), state


def rotor_trajectory(
    bivectors: torch.Tensor,
    *,
    accumulate: str = "compact",
    initial: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The accumulated rotor R_t per token as multivector coefficients `[B, L, H, 32]` (for inspection;
    compact: the rotation part, the boosts are not accumulated)."""
    check_rra_inputs(bivectors, None, initial, accumulate, document_ids)
    dtype = compute_dtype(bivectors, initial)
    if bivectors.shape[1] == 0:
        return bivectors.new_zeros(*bivectors.shape[:3], NUM_BLADES, dtype=dtype)
    restarts = None if document_ids is None else document_restarts(document_ids.to(bivectors.device))
    with torch.autocast(device_type=bivectors.device.type, enabled=False):
        rotors, _ = accumulated_rotors(bivectors.to(dtype), accumulate, _cast(initial, dtype), restarts)
        return from_matrix(from_soa(rotors)).transpose(1, 2)  # [4, 4, B, H, L] -> [B, L, H, 32]


__all__ = [
    "HAS_TRITON",
    "RRA_ACCUMULATE",
    "RRA_KERNELS",
    "check_rra_inputs",
    "recursive_rotor_accumulator",
    "resolve_rra_kernel",
    "rotor_trajectory",
]
