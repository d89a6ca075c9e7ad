"""Geometric product attention (GPA, docs/design.md §5.4): the one entry point, its checks, dispatch and shared tables.

    S_ij = ( <Q_i ~K_j>_0 + gamma_h * sqrt(sum_C <Q_i ~K_j>_C^2 + eps) ) * scaling,   C over the 10 bivectors
    out_i = sum_j softmax_j(S_ij) V_j              (bivector=False: S_ij = <Q_i ~K_j>_0 * scaling)

Query i sees key j when j <= Lk - Lq + i (causal; query i sits at that absolute position when decoding
over a cache), j is not padding, and both lie in one document (`document_ids`, packed rows). A query row
with no visible key outputs zeros. Kernels (`GPA_KERNELS`, one signature `ops_gpa_base.GPAKernel`, compared in
the tests):

* `"naive"`  `ops_gpa_naive.gpa_naive`: the formula materialised, O(L^2) memory (the reference).
* `"chunk"`  `ops_gpa_chunk.gpa_chunk`: query panels, key blocks, online softmax and a recomputing
  backward in PyTorch, O(L) memory (earlier names: "cpu", "chunked").
* `"triton"` `ops_gpa_triton.gpa_triton`: fused flash-style kernels, O(L) memory (CUDA).

`geometric_product_attention` checks the inputs once, resolves the default scaling and `kernel="auto"`
(Triton for fp32/fp16/bf16 CUDA tensors when Triton imports, else "chunk"; with `bivector=False` SDPA on
Q . (sign_0 * K), the same numbers), turns autocast off and returns the query's dtype; kernels only compute. bf16/fp16
inputs: the norm and the softmax statistics are computed in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .clifford_algebra import NUM_BLADES
from .ops_common import HAS_TRITON, check_triton_kernel, compute_dtype, kernel_name, visible_keys
from .ops_gpa_base import NUM_FORMS, GPAKernel, form_tables
from .ops_gpa_chunk import gpa_chunk
from .ops_gpa_naive import gpa_naive, gpa_naive_weights, score_parts
from .ops_gpa_triton import KERNEL_DTYPES, gpa_triton

GPA_KERNELS = ("naive", "chunk", "triton")


def check_gpa_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    gamma: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
    scaling: float | None,
    eps: float,
) -> None:
    """ValueError naming the argument when shapes, dtypes or settings do not fit the contract."""
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(
            f"GPA expects query [B, H, Lq, D] and key [B, H, Lk, D]; got query {tuple(query.shape)}, "
            f"key {tuple(key.shape)}."
        )
    batch, heads, q_len, dim = query.shape
    k_len = key.shape[2]
    if dim == 0 or dim % NUM_BLADES != 0:
        raise ValueError(f"GPA head dim (query.shape[-1]) must be a positive multiple of 32; got {dim}.")
    if key.shape[0] != batch or heads % key.shape[1] or key.shape[-1] != dim:
        raise ValueError(
            f"key must be [B, Hkv, Lk, D] = [{batch}, Hkv, Lk, {dim}] with Hkv dividing H={heads} (grouped-query "
            f"attention); got {tuple(key.shape)}."
        )
    if value is not None and value.shape != key.shape:
        raise ValueError(f"value must have key's shape {tuple(key.shape)}; got {tuple(value.shape)}.")
    if q_len > k_len:
        raise ValueError(f"GPA needs Lq <= Lk (queries are the last Lq keys' positions); got Lq={q_len}, Lk={k_len}.")
    tensors = (query, key) if value is None else (query, key, value)
    if not query.is_floating_point() or any(t.dtype != query.dtype for t in tensors):
        raise ValueError(f"query, key and value must share one floating dtype; got {[str(t.dtype) for t in tensors]}.")
    if gamma is not None and tuple(gamma.shape) != (heads,):
        raise ValueError(f"gamma must be [H] = [{heads}]; got {tuple(gamma.shape)}.")
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (batch, k_len):
            raise ValueError(
                f"key_padding_mask must be [B, Lk] = [{batch}, {k_len}] (True = real token); "
                f"got {tuple(key_padding_mask.shape)}."
            )
        if key_padding_mask.dtype != torch.bool and not bool(((key_padding_mask == 0) | (key_padding_mask == 1)).all()):
            raise ValueError("key_padding_mask must hold only 0/1 (or bool) values; got other values.")
    if document_ids is not None and (
        tuple(document_ids.shape) != (batch, k_len) or document_ids.is_floating_point() or document_ids.is_complex()
    ):
        raise ValueError(
            f"document_ids must be an integer [B, Lk] = [{batch}, {k_len}] tensor (equal within a document, "
            f"ops_common.document_ids_from_position_ids); got {document_ids.dtype} {tuple(document_ids.shape)}."
        )
    if scaling is not None and not (float(scaling) > 0 and float(scaling) != float("inf")):
        raise ValueError(f"scaling must be a finite positive number or None (1/sqrt(D)); got {scaling}.")
    if not (float(eps) > 0 and float(eps) != float("inf")):
        raise ValueError(f"eps must be a finite positive number; got {eps}.")


def resolve_gpa_kernel(kernel: str, query: torch.Tensor, bivector: bool) -> str:
    """The kernel that runs: a name of `GPA_KERNELS` (old names mapped), or "scalar_sdpa" (`_scalar_sdpa`) for
    `kernel="auto"` with `bivector=False`."""
    kernel = kernel_name(kernel, GPA_KERNELS, "GPA")  # earlier names ("chunked", "reference") mapped, warned
    if kernel == "auto":
        if not bivector:
            return "scalar_sdpa"
        if torch.compiler.is_exporting():  # the chunks loop over the length; naive traces once
            return "naive"
        if torch.compiler.is_compiling() and query.shape[-2] == 1:
            # a compiled decode step: the chunks' Python loop over the keys would specialise the graph to the
            # cache length (one recompile per token); one query's naive form is O(Lk) memory too, and is the path
            # the CPU tests compile (the Triton launch under a dynamic key length is untested)
            return "naive"
        # float64 stays on the exact "chunk" path (the fused kernels keep float32 statistics)
        return "triton" if HAS_TRITON and query.is_cuda and query.dtype in KERNEL_DTYPES else "chunk"
    if kernel == "triton":  # the package, a CUDA tensor (or the interpreter) and a kernel dtype, else a clear error
        check_triton_kernel("GPA", query, KERNEL_DTYPES, "chunk")
    return kernel


def _scalar_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """bivector=False: S = <Q ~K>_0 * scaling = (Q . (sign_0 * K)) * scaling through SDPA."""
    q_len, k_len = query.shape[2], key.shape[2]
    dtype = compute_dtype(query)
    signed_key = key.to(dtype) * form_tables(query.device)[1][0].to(dtype).repeat(key.shape[-1] // NUM_BLADES)
    q, v = query.to(dtype), value.to(dtype)
    gqa = query.shape[1] != key.shape[1]  # grouped keys: SDPA's grouped mode, never repeated here
    sdpa_causal = key_padding_mask is None and document_ids is None and (not causal or q_len in (k_len, 1))
    visible = None if sdpa_causal else visible_keys(q_len, k_len, causal, key_padding_mask, query.device, document_ids)
    if visible is None:  # SDPA's own causal mask is the right one, or every key is visible (no query rows)
        return F.scaled_dot_product_attention(
            q, signed_key, v, is_causal=causal and q_len > 1, scale=scaling, enable_gqa=gqa
        )
    has_key = visible.any(-1, keepdim=True)  # empty rows: opened for SDPA, then zeroed
    out = F.scaled_dot_product_attention(q, signed_key, v, attn_mask=visible | ~has_key, scale=scaling, enable_gqa=gqa)
    return out * has_key


_KERNEL_FUNCTIONS: dict[str, GPAKernel] = {"naive": gpa_naive, "chunk": gpa_chunk, "triton": gpa_triton}


def geometric_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    scaling: float | None = None,
    eps: float = 1e-6,
    bivector: bool = True,
    kernel: str = "auto",
) -> torch.Tensor:
    """GPA output [B, H, Lq, D] for query [B, H, Lq, D], key/value [B, Hkv, Lk, D] (Hkv divides H: query head h
    reads key-value head h // (H / Hkv), never a repeated copy), gamma [H] (per query head).

    `key_padding_mask` [B, Lk] (True/1 = real token); `document_ids` [B, Lk] int (packed rows: equal within
    a document; None = one document per row); `scaling` defaults to 1/sqrt(D); `kernel` is "auto" or one of
    `GPA_KERNELS`."""
    check_gpa_inputs(query, key, value, gamma, key_padding_mask, document_ids, scaling, eps)
    name = resolve_gpa_kernel(kernel, query, bivector)
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    if document_ids is not None:
        document_ids = document_ids.to(query.device)
    causal, bivector = bool(causal), bool(bivector)
    masks = {"key_padding_mask": key_padding_mask, "document_ids": document_ids}
    with torch.autocast(query.device.type, enabled=False):
        if name == "scalar_sdpa":  # the scalar score alone: no gamma, no norm (so no eps)
            out = _scalar_sdpa(query, key, value, causal=causal, **masks, scaling=scaling)
        else:
            out = _KERNEL_FUNCTIONS[name](
                query, key, value, gamma, causal=causal, **masks, scaling=scaling, eps=float(eps), bivector=bivector
            )
    return out.to(query.dtype)


def _checked_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    gamma: torch.Tensor,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
    scaling: float | None,
    eps: float,
    bivector: bool,
) -> torch.Tensor:
    """The naive path's softmax weights [B, H, Lq, Lk] (float32, float64 for float64) after the entry's checks;
    call with autocast off."""
    check_gpa_inputs(query, key, value, gamma, key_padding_mask, document_ids, scaling, eps)
    return gpa_naive_weights(
        query,
        key,
        gamma,
        causal=bool(causal),
        key_padding_mask=key_padding_mask,
        document_ids=None if document_ids is None else document_ids.to(query.device),
        scaling=query.shape[-1] ** -0.5 if scaling is None else float(scaling),
        eps=float(eps),
        bivector=bool(bivector),
    )


def gpa_with_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    scaling: float | None = None,
    eps: float = 1e-6,
    bivector: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, softmax weights [B, H, Lq, Lk]) from the naive path, both in the query's dtype: the output is
    computed from the very weights returned (as transformers' eager attention does), so gradients reach them."""
    with torch.autocast(query.device.type, enabled=False):
        weights = _checked_weights(
            query, key, value, gamma, causal, key_padding_mask, document_ids, scaling, eps, bivector
        )
        # grouped: each key-value head's values serve its query heads' rows [group * Lq]
        batch, heads, l_q, l_k = weights.shape
        output = torch.matmul(weights.view(batch, value.shape[1], -1, l_k), value.to(weights.dtype))
    return output.view(batch, heads, l_q, -1).to(query.dtype), weights.to(query.dtype)


def gpa_attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    scaling: float | None = None,
    eps: float = 1e-6,
    bivector: bool = True,
) -> torch.Tensor:
    """softmax_j(S_ij) [B, H, Lq, Lk] from the naive path, in the query's dtype (empty rows are 0)."""
    with torch.autocast(query.device.type, enabled=False):
        weights = _checked_weights(
            query, key, None, gamma, causal, key_padding_mask, document_ids, scaling, eps, bivector
        )
    return weights.to(query.dtype)


def gpa_score_parts(
    query: torch.Tensor, key: torch.Tensor, *, scaling: float | None = None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(<P_ij>_0, sqrt(sum_C <P_ij>_C^2 + eps)), each [B, H, Lq, Lk] in float32 (float64 for float64
    inputs), for inspection; both are multiplied by `scaling` when it is given (None = unscaled)."""
    check_gpa_inputs(query, key, None, None, None, None, scaling, eps)
    dtype = compute_dtype(query)
    with torch.autocast(query.device.type, enabled=False):
        scalar, norm = score_parts(query.to(dtype), key.to(dtype), eps)
    if scaling is not None:
        scalar, norm = scalar * scaling, norm * scaling
    return scalar, norm


__all__ = [
    "GPA_KERNELS",
    "HAS_TRITON",
    "NUM_FORMS",
    "check_gpa_inputs",
    "form_tables",
    "geometric_product_attention",
    "gpa_attention_weights",
    "gpa_chunk",
    "gpa_naive",
    "gpa_score_parts",
    "gpa_triton",
    "gpa_with_weights",
    "resolve_gpa_kernel",
]
