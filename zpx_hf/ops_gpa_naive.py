"""Geometric product attention (GPA, docs/design.md §5.4) as written: the readable formula, O(L^2) memory.

Query, key and value of one head are `c` Cl(4,1) multivectors flattened to `[B, H, L, D]`, `D = 32 c`,
column `ch * 32 + blade mask`. With P_ij = sum_ch Q_i,ch ~K_j,ch:

    S_ij = ( <P_ij>_0 + gamma_h * sqrt(sum_C <P_ij>_C^2 + eps) ) * scaling,   C over the 10 bivectors
    out_i = sum_j softmax_j(S_ij) V_j            (bivector=False: S_ij = <P_ij>_0 * scaling)

Each coefficient is a bilinear form with a signed permutation (`CliffordAlgebra.bilinear_forms`):
<P>_C = sum_A Q_A sign_C[A] K_{A xor C}, so a score is 1 + 10 dot products over D. Query i sits at
absolute position Lk - Lq + i (decoding with a cache); a query row with no visible key (a left-padding
row) outputs zeros. The other paths (`ops_gpa_chunked.py`, `ops_gpa_triton.py`) compute the same
function; the form tables and input checks they share live here.
"""

from __future__ import annotations

import torch

from .clifford_algebra import BIVECTOR_MASKS, NUM_BLADES, conformal_algebra
from .modeling_blocks import visible_keys

NUM_FORMS = 1 + len(BIVECTOR_MASKS)  # scalar + 10 bivector coefficients


def _build_form_tables() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    index, sign = conformal_algebra().bilinear_forms(torch.tensor((0,) + BIVECTOR_MASKS, device="cpu"))
    query_sign = torch.gather(sign, 1, index)
    return index, sign.float(), query_sign.float()


# Built at import: under torch.compile `form_tables` then reads constants (see clifford_algebra).
_FORM_TABLES = _build_form_tables()


def form_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[11, 32] tables: index[m, A] = A xor C_m, key-side sign[m, A] and query-side sign[m, A xor C_m].

    <P>_{C_m} = sum_A Q_A sign[m, A] K_{index[m, A]} = sum_B query_sign[m, B] Q_{index[m, B]} K_B."""
    index, sign, query_sign = _FORM_TABLES
    return index.to(device), sign.to(device), query_sign.to(device)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else (fp32, bf16, fp16) computes in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def check_gpa_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    gamma: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
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
    if key.shape[:2] != query.shape[:2] or key.shape[-1] != dim:
        raise ValueError(f"key must be [B, H, Lk, D] = [{batch}, {heads}, Lk, {dim}]; got {tuple(key.shape)}.")
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
    if scaling is not None and not (float(scaling) > 0 and float(scaling) != float("inf")):
        raise ValueError(f"scaling must be a finite positive number or None (1/sqrt(D)); got {scaling}.")
    if not (float(eps) > 0 and float(eps) != float("inf")):
        raise ValueError(f"eps must be a finite positive number; got {eps}.")


def score_parts(query: torch.Tensor, key: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(<P_ij>_0, sqrt(sum_C <P_ij>_C^2 + eps)), each [B, H, Lq, Lk], unscaled, in the inputs' dtype."""
    index, sign, _ = form_tables(query.device)
    batch, heads, k_len, dim = key.shape
    channels = dim // NUM_BLADES
    k = key.reshape(batch, heads, k_len, channels, NUM_BLADES)
    k_forms = k[..., index] * sign.to(key.dtype)  # [B, H, Lk, c, 11, 32]: sign_m[A] K_{A xor C_m}
    q = query.reshape(batch, heads, query.shape[2], channels, NUM_BLADES)
    products = torch.einsum("bhicx,bhjcmx->bhijm", q, k_forms)  # [B, H, Lq, Lk, 11]
    return products[..., 0], torch.sqrt(products[..., 1:].pow(2).sum(-1) + eps)


def gpa_naive_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    eps: float = 1e-6,
    bivector: bool = True,
) -> torch.Tensor:
    """softmax_j(S_ij): [B, H, Lq, Lk] in float32 (float64 for float64 inputs); rows with no visible key are 0."""
    check_gpa_inputs(query, key, None, gamma, key_padding_mask, scaling, eps)
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    dtype = compute_dtype(query)
    with torch.autocast(query.device.type, enabled=False):
        scalar, norm = score_parts(query.to(dtype), key.to(dtype), eps)
        scores = scalar + gamma.to(dtype).view(1, -1, 1, 1) * norm if bivector else scalar
        scores = scores * scaling
        visible = visible_keys(query.shape[2], key.shape[2], causal, key_padding_mask, query.device)
        if visible is None:
            return torch.softmax(scores, dim=-1)
        has_key = visible.any(-1, keepdim=True)
        # an empty row is opened to every key (finite softmax and gradients), then zeroed
        weights = torch.softmax(scores.masked_fill(~(visible | ~has_key), float("-inf")), dim=-1)
        return weights * has_key


def gpa_naive(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    eps: float = 1e-6,
    bivector: bool = True,
) -> torch.Tensor:
    """GPA materialised: [B, H, Lq, Lk, 11] products, softmax, weights @ V. Output in the query's dtype."""
    check_gpa_inputs(query, key, value, gamma, key_padding_mask, scaling, eps)
    weights = gpa_naive_weights(
        query, key, gamma, causal=causal, key_padding_mask=key_padding_mask, scaling=scaling, eps=eps, bivector=bivector
    )
    with torch.autocast(query.device.type, enabled=False):
        return torch.matmul(weights, value.to(weights.dtype)).to(query.dtype)


__all__ = [
    "NUM_FORMS",
    "check_gpa_inputs",
    "compute_dtype",
    "form_tables",
    "gpa_naive",
    "gpa_naive_weights",
    "score_parts",
]
