"""ZPX angle-sphere attention (docs/design.md §3): the phase coordinates and the one entry point of the attention op.

Phase encoder output per head and channel c (pre-activations come from `to_log_r`, `to_theta`, `to_b`):

    log_r = R tanh(W_r h / R),  theta = pi tanh(W_theta h),  b = sigmoid(W_b h)
    phi   = theta + pi b,       x + iy = e^{log_r} e^{i phi}
    s     = (2x, 2y, x^2 + y^2 - 1) / (1 + x^2 + y^2)          (point on S^2)

Score:  S_ij = q_i.k_j / sqrt(d) + la mean_c cos(phi_ic - phi_jc) + ls mean_c <s_ic, s_jc>

`zpx_attention` is the only way into the attention kernels (`ZPX_KERNELS`, one signature: `ops_zpx_base.ZPXKernel`):

* `naive`   `ops_zpx_naive.py`: the score term by term, every [Lq, Lk, C] tensor materialised.
* `panel`   `ops_zpx_panel.py`: the exact fast form, SDPA on head dim d + 5C (any device; on CUDA SDPA picks
            its flash / memory-efficient kernels); one call unmasked, else query panels with masks per panel,
            never L x L (earlier names: `cpu`, `sdpa`).
* `decode`  `ops_zpx_decode.py`: one query row (cached decoding) as two batched GEMVs.

`kernel="auto"` picks `decode` for one query row without dropout, else `panel`. Keys are cached as k^.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .ops_common import check_key_masks, constant_tables, kernel_name, upcast
from .ops_zpx_base import PHASE_FEATURES, ZPXKernel, augment_query
from .ops_zpx_decode import zpx_attention_decode
from .ops_zpx_naive import zpx_attention_naive
from .ops_zpx_panel import zpx_attention_panel

ZPX_KERNELS = ("naive", "panel", "decode")

_IMPLEMENTATIONS: dict[str, ZPXKernel] = {
    "naive": zpx_attention_naive,
    "panel": zpx_attention_panel,
    "decode": zpx_attention_decode,
}


class PhaseState(NamedTuple):
    """Per-token phase of one layer, every tensor [..., C] in the layout of the encoder's outputs (the model's:
    [B, L, H, C]). Attention needs log_r, cos phi and sin phi; b, the Cartesian point (x, y) and the sphere point
    s [..., C, 3] are derived on demand (centre loss, `phase_tensor`)."""

    log_r: torch.Tensor
    phi: torch.Tensor
    cos_phi: torch.Tensor
    sin_phi: torch.Tensor
    pi_b: torch.Tensor  # pi b, the term phi adds to theta

    @property
    def b(self) -> torch.Tensor:
        """b = sigmoid(W_b h) in [0, 1]."""
        return self.pi_b / math.pi

    @property
    def x(self) -> torch.Tensor:
        """x = e^{log_r} cos phi."""
        return torch.exp(self.log_r) * self.cos_phi

    @property
    def y(self) -> torch.Tensor:
        """y = e^{log_r} sin phi."""
        return torch.exp(self.log_r) * self.sin_phi

    @property
    def sphere(self) -> torch.Tensor:
        """s = (X, Y, Z) [..., C, 3], the stereographic projection of x + iy (see `sphere_coordinates`)."""
        return torch.stack(sphere_coordinates(self), dim=-1)


def phase_coordinates(
    log_r_pre: torch.Tensor, theta_pre: torch.Tensor, b_pre: torch.Tensor, max_log_radius: float
) -> PhaseState:
    """Vector phase from the encoder's three linear outputs (any leading shape, last dim C)."""
    return phase_from_stacked(torch.stack((log_r_pre, theta_pre, b_pre)), max_log_radius, dim=0)


def phase_from_stacked(pre: torch.Tensor, max_log_radius: float, dim: int) -> PhaseState:
    """Vector phase from the three pre-activations (W_r h, W_theta h, W_b h) stacked on `dim` of `pre`, in
    tensor-by-tensor ops (few, and no Python-scalar arithmetic: on small decoding tensors the per-op cost
    is the whole cost). With sigmoid(x) = (1 + tanh(x/2)) / 2 one tanh serves all three:

        t = tanh(pre * (1/R, 1, 1/2)),   (log_r, theta, pi b) = (R, pi, pi/2) t + (0, 0, pi/2),   phi = theta + pi b

    Half-precision inputs are computed in float32."""
    trailing = pre.dim() - 1 - dim % pre.dim()
    scale_in, scale_out, shift_out = phase_constants(max_log_radius, trailing, upcast(pre).dtype, pre.device)
    log_r, theta, pi_b = torch.addcmul(shift_out, torch.tanh(pre * scale_in), scale_out).unbind(dim)
    phi = theta + pi_b
    return PhaseState(log_r=log_r, phi=phi, cos_phi=torch.cos(phi), sin_phi=torch.sin(phi), pi_b=pi_b)


def sphere_coordinates(state: PhaseState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X, Y, Z) of s, written in log_r so it never overflows: 2r / (1 + r^2) = sech(log_r) and
    (r^2 - 1) / (r^2 + 1) = tanh(log_r), so s = (cos phi / cosh log_r, sin phi / cosh log_r, tanh log_r)."""
    cosh = torch.cosh(state.log_r)
    return state.cos_phi / cosh, state.sin_phi / cosh, torch.tanh(state.log_r)


def phase_tensor(state: PhaseState) -> torch.Tensor:
    """Phi[..., c, :] = [log_r, cos phi, sin phi, X, Y, Z, b]  (7 values per channel)."""
    return torch.stack((state.log_r, state.cos_phi, state.sin_phi, *sphere_coordinates(state), state.b), dim=-1)


def phase_key_features(state: PhaseState) -> torch.Tensor:
    """[cos phi (C), sin phi (C), X (C), Y (C), Z (C)] -> [..., 5C], the part appended to keys."""
    return torch.cat((state.cos_phi, state.sin_phi, *sphere_coordinates(state)), dim=-1)


@constant_tables
def phase_constants(
    max_log_radius: float, trailing: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1/R, 1, 1/2), (R, pi, pi/2), (0, 0, pi/2) of `phase_from_stacked`, shaped [3] + [1] * trailing."""
    shape = (3,) + (1,) * trailing
    rows = ((1.0 / max_log_radius, 1.0, 0.5), (max_log_radius, math.pi, math.pi / 2), (0.0, 0.0, math.pi / 2))
    scale_in, scale_out, shift_out = (torch.tensor(row, dtype=dtype, device=device).view(shape) for row in rows)
    return scale_in, scale_out, shift_out


def center_cancellation_loss(
    state: PhaseState, token_mask: torch.Tensor | None, token_dim: int = 1, document_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """L_center = mean_{document, head, c} |sum_i r_i e^{i phi_i}|^2 over real (non-padding) tokens; the tokens
    lie on `token_dim` of the state (1 in the model's [B, L, H, C]), `token_mask` is [B, L]. Each row is one
    document, or packed rows name theirs in `document_ids` [B, L] (the state then is [B, L, ...])."""
    radius = torch.exp(upcast(state.log_r))
    x, y = radius * upcast(state.cos_phi), radius * upcast(state.sin_phi)
    if token_mask is not None:
        shape = [1] * x.dim()
        shape[0], shape[token_dim] = token_mask.shape
        weight = token_mask.to(x.dtype).view(shape)
        x, y = x * weight, y * weight
    if document_ids is None:
        x_sum, y_sum = x.sum(dim=token_dim), y.sum(dim=token_dim)
    else:  # one sum per document: a global index over the flattened B x L tokens
        starts = torch.ones_like(document_ids, dtype=torch.bool)
        starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
        index = starts.flatten().long().cumsum(0) - 1
        count = int(index[-1]) + 1
        x_sum = x.new_zeros(count, *x.shape[2:]).index_add_(0, index, x.flatten(0, 1))
        y_sum = y.new_zeros(count, *y.shape[2:]).index_add_(0, index, y.flatten(0, 1))
    return (x_sum * x_sum + y_sum * y_sum).mean()


def resolve_kernel(kernel: str, query: torch.Tensor, dropout: float = 0.0) -> str:
    """The kernel `kernel` runs for `query` [B, H, Lq, d]: "auto" -> "decode" for one row without dropout,
    else "panel"; earlier names map to today's (`ops_common.kernel_name`)."""
    kernel = kernel_name(kernel, ZPX_KERNELS, "ZPX attention")
    if kernel == "auto":
        return "decode" if query.shape[2] == 1 and dropout == 0.0 else "panel"
    if kernel == "decode" and (query.shape[2] != 1 or dropout != 0.0):
        raise ValueError(
            f"the ZPX kernel 'decode' takes one query row without dropout; got {query.shape[2]} rows, dropout "
            f"{dropout}: use 'panel'."
        )
    return kernel


def check_inputs(
    query: torch.Tensor,
    key_aug: torch.Tensor,
    value: torch.Tensor,
    query_features: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Shape checks (ValueError naming the argument; no host reads); returns the masks as bool / int64."""
    if query.dim() != 4 or key_aug.dim() != 4 or value.dim() != 4:
        raise ValueError(
            f"`query`, `key_aug` and `value` must be [B, H, L, D]; got {tuple(query.shape)}, "
            f"{tuple(key_aug.shape)} and {tuple(value.shape)}."
        )
    batch, heads, l_q, head_dim = query.shape
    l_k = key_aug.shape[2]
    width = query_features.shape[-1]
    if width % PHASE_FEATURES or tuple(query_features.shape) != (batch, heads, l_q, width):
        raise ValueError(
            f"`query_features` must be [B, H, Lq, 5C] = [{batch}, {heads}, {l_q}, 5C]; "
            f"got {tuple(query_features.shape)}."
        )
    key_heads = key_aug.shape[1]
    if key_aug.shape[0] != batch or key_heads < 1 or heads % key_heads or key_aug.shape[-1] != head_dim + width:
        raise ValueError(
            f"`key_aug` must be [B={batch}, Hkv, Lk, d + 5C = {head_dim + width}] (k^ = [k, cos, sin, s]) with Hkv "
            f"dividing H={heads} (grouped-query attention); got {tuple(key_aug.shape)}."
        )
    if value.shape[:3] != key_aug.shape[:3]:
        raise ValueError(f"`value` must be [B, H, Lk] = {tuple(key_aug.shape[:3])} + [dv]; got {tuple(value.shape)}.")
    if l_q > l_k:
        raise ValueError(f"`query` has more positions ({l_q}) than `key_aug` ({l_k}): queries are the last Lq <= Lk.")
    return check_key_masks(key_padding_mask, document_ids, batch, l_k)


def zpx_attention(
    query: torch.Tensor,
    key_aug: torch.Tensor,
    value: torch.Tensor,
    query_features: torch.Tensor,
    *,
    causal: bool,
    scaling: float,
    lambda_angle: float,
    lambda_sphere: float,
    dropout: float = 0.0,
    key_padding_mask: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ZPX attention by `kernel` ("auto" or one of `ZPX_KERNELS`; module doc).

    query [B, H, Lq, d], key_aug [B, Hkv, Lk, d + 5C] (k^ = [k, cos phi, sin phi, s]), value [B, Hkv, Lk, dv]
    (Hkv divides H: query head h reads key-value head h // (H / Hkv), never a repeated copy), query_features
    [B, H, Lq, 5C]; key_padding_mask [B, Lk] bool (True = real token) and document_ids [B, Lk]
    (packed rows: equal within a document) or None. Query i sits at position Lk - Lq + i; it sees key j
    when causality, padding and documents allow, and a row that sees no key outputs zeros.
    Returns (output [B, Lq, H, dv], attention weights [B, H, Lq, Lk] from `naive`, else None).
    """
    key_padding_mask, document_ids = check_inputs(query, key_aug, value, query_features, key_padding_mask, document_ids)
    fn = _IMPLEMENTATIONS[resolve_kernel(kernel, query, dropout)]
    return fn(
        query,
        key_aug,
        value,
        query_features,
        causal=causal,
        scaling=scaling,
        lambda_angle=lambda_angle,
        lambda_sphere=lambda_sphere,
        dropout=dropout,
        key_padding_mask=key_padding_mask,
        document_ids=document_ids,
    )


__all__ = [
    "ZPX_KERNELS",
    "PhaseState",
    "augment_query",
    "center_cancellation_loss",
    "phase_coordinates",
    "phase_from_stacked",
    "phase_key_features",
    "phase_tensor",
    "resolve_kernel",
    "sphere_coordinates",
    "zpx_attention",
]
