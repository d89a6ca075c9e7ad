"""ZPX angle-sphere attention (SPEC §2): phase coordinates and the fast attention path.

Phase encoder output per head and channel c (pre-activations come from `to_log_r`, `to_theta`, `to_b`):

    log_r = R tanh(W_r h / R),  theta = pi tanh(W_theta h),  b = sigmoid(W_b h)
    phi   = theta + pi b,       x + iy = e^{log_r} e^{i phi}
    s     = (2x, 2y, x^2 + y^2 - 1) / (1 + x^2 + y^2)          (point on S^2)

Score:  S_ij = q_i.k_j / sqrt(d) + la mean_c cos(phi_ic - phi_jc) + ls mean_c <s_ic, s_jc>

`zpx_attention_sdpa` is the exact fast form: cos(a - b) = cos a cos b + sin a sin b, so with
q^ = [q/sqrt(d), (la/C) cos phi, (la/C) sin phi, (ls/C) s] and k^ = [k, cos phi, sin phi, s], S = q^ . k^:
ordinary scaled-dot-product attention (scale 1) on head dim d + 5C with O(L) memory. Keys are cached as
k^. The term-by-term reference is `ops_zpx_naive.zpx_attention_naive` (same signature).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .modeling_blocks import build_attention_mask, upcast, uses_is_causal
from .ops_zpx_naive import PHASE_FEATURES


class PhaseState(NamedTuple):
    """Per-token phase of one layer; every field is [B, H, L, C] except `sphere` [B, H, L, C, 3]."""

    log_r: torch.Tensor
    phi: torch.Tensor
    b: torch.Tensor
    cos_phi: torch.Tensor
    sin_phi: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    sphere: torch.Tensor


def phase_coordinates(
    log_r_pre: torch.Tensor, theta_pre: torch.Tensor, b_pre: torch.Tensor, max_log_radius: float
) -> PhaseState:
    """Vector phase from the encoder's three linear outputs (any leading shape, last dim C)."""
    log_r = max_log_radius * torch.tanh(log_r_pre / max_log_radius)
    theta = math.pi * torch.tanh(theta_pre)
    b = torch.sigmoid(b_pre)
    phi = theta + math.pi * b
    cos_phi, sin_phi = torch.cos(phi), torch.sin(phi)
    r = torch.exp(log_r)
    # Stereographic projection written in log_r so it never overflows:
    # 2r / (1 + r^2) = sech(log_r),  (r^2 - 1) / (r^2 + 1) = tanh(log_r).
    sech = 1.0 / torch.cosh(log_r)
    sphere = torch.stack((sech * cos_phi, sech * sin_phi, torch.tanh(log_r)), dim=-1)
    return PhaseState(
        log_r=log_r, phi=phi, b=b, cos_phi=cos_phi, sin_phi=sin_phi, x=r * cos_phi, y=r * sin_phi, sphere=sphere
    )


def phase_tensor(state: PhaseState) -> torch.Tensor:
    """Phi[..., c, :] = [log_r, cos phi, sin phi, X, Y, Z, b]  (7 values per channel)."""
    return torch.cat(
        (
            state.log_r[..., None],
            state.cos_phi[..., None],
            state.sin_phi[..., None],
            state.sphere,
            state.b[..., None],
        ),
        dim=-1,
    )


def phase_key_features(state: PhaseState) -> torch.Tensor:
    """[cos phi (C), sin phi (C), X (C), Y (C), Z (C)] -> [B, H, L, 5C], the part appended to keys."""
    sphere = state.sphere
    return torch.cat((state.cos_phi, state.sin_phi, sphere[..., 0], sphere[..., 1], sphere[..., 2]), dim=-1)


def augment_query(
    query: torch.Tensor, query_features: torch.Tensor, scaling: float, lambda_angle: float, lambda_sphere: float
) -> torch.Tensor:
    """q^ = [q * scaling, (la/C) cos phi, (la/C) sin phi, (ls/C) s]."""
    channels = query_features.shape[-1] // PHASE_FEATURES
    angle, sphere = query_features.split((2 * channels, 3 * channels), dim=-1)
    return torch.cat((query * scaling, angle * (lambda_angle / channels), sphere * (lambda_sphere / channels)), dim=-1)


def center_cancellation_loss(state: PhaseState, token_mask: torch.Tensor | None) -> torch.Tensor:
    """L_center = mean_{batch, head, c} |sum_i r_i e^{i phi_i}|^2 over real (non-padding) tokens."""
    x, y = upcast(state.x), upcast(state.y)
    if token_mask is not None:
        weight = token_mask.to(x.dtype)[:, None, :, None]  # [B, 1, L, 1]
        x, y = x * weight, y * weight
    x_sum, y_sum = x.sum(dim=2), y.sum(dim=2)
    return (x_sum * x_sum + y_sum * y_sum).mean()


def zpx_attention_sdpa(
    query: torch.Tensor,
    key_aug: torch.Tensor,
    value: torch.Tensor,
    query_features: torch.Tensor,
    padding_mask: torch.Tensor | None,
    *,
    causal: bool,
    scaling: float,
    lambda_angle: float,
    lambda_sphere: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """Fast path, the signature of `zpx_attention_naive`: one SDPA call on the augmented head dim."""
    batch, _, q_len, _ = query.shape
    query_aug = augment_query(query, query_features, scaling, lambda_angle, lambda_sphere)
    mask = build_attention_mask(padding_mask, batch, q_len, key_aug.shape[2], causal, query.device)
    value_dim = value.shape[-1]
    if value_dim != query_aug.shape[-1]:
        # Fused SDPA kernels (flash on CPU and GPU) need one head dim for q, k and v: pad v with zeros
        # and drop the padding from the output.
        value = F.pad(value, (0, query_aug.shape[-1] - value_dim))
    output = F.scaled_dot_product_attention(
        query_aug,
        key_aug,
        value,
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=uses_is_causal(mask, causal, q_len),
        scale=1.0,
    )
    return output[..., :value_dim].transpose(1, 2).contiguous(), None
