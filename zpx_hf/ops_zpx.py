"""ZPX angle-sphere attention (docs/design.md §3): phase coordinates and the fast attention path.

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

from .modeling_blocks import build_attention_mask, constant_tables, upcast, uses_is_causal
from .ops_zpx_naive import PHASE_FEATURES


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


def augment_query(
    query: torch.Tensor, query_features: torch.Tensor, scaling: float, lambda_angle: float, lambda_sphere: float
) -> torch.Tensor:
    """q^ = [q * scaling, (la/C) cos phi, (la/C) sin phi, (ls/C) s] = [q, features] * coefficients (one multiply;
    float32 coefficients for half precision)."""
    dtype = upcast(query).dtype
    coefficients = query_coefficients(
        query.shape[-1], query_features.shape[-1], scaling, lambda_angle, lambda_sphere, dtype, query.device
    )
    query_aug = torch.cat((query, query_features), dim=-1) * coefficients
    return query_aug if query_aug.dtype == query.dtype else query_aug.to(query.dtype)


@constant_tables
def query_coefficients(
    head_dim: int,
    feature_dim: int,
    scaling: float,
    lambda_angle: float,
    lambda_sphere: float,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """[scaling] * d + [la/C] * 2C + [ls/C] * 3C, the multipliers of [q, features] in `augment_query`."""
    channels = feature_dim // PHASE_FEATURES
    values = [scaling] * head_dim + [lambda_angle / channels] * (2 * channels)
    values += [lambda_sphere / channels] * (3 * channels)
    return torch.tensor(values, dtype=dtype, device=device)


@constant_tables
def phase_constants(
    max_log_radius: float, trailing: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1/R, 1, 1/2), (R, pi, pi/2), (0, 0, pi/2) of `phase_from_stacked`, shaped [3] + [1] * trailing."""
    shape = (3,) + (1,) * trailing
    rows = ((1.0 / max_log_radius, 1.0, 0.5), (max_log_radius, math.pi, math.pi / 2), (0.0, 0.0, math.pi / 2))
    return tuple(torch.tensor(row, dtype=dtype, device=device).view(shape) for row in rows)


def center_cancellation_loss(state: PhaseState, token_mask: torch.Tensor | None, token_dim: int = 1) -> torch.Tensor:
    """L_center = mean_{batch, head, c} |sum_i r_i e^{i phi_i}|^2 over real (non-padding) tokens; the tokens lie
    on `token_dim` of the state (1 in the model's [B, L, H, C]), `token_mask` is [B, L]."""
    radius = torch.exp(upcast(state.log_r))
    x, y = radius * upcast(state.cos_phi), radius * upcast(state.sin_phi)
    if token_mask is not None:
        shape = [1] * x.dim()
        shape[0], shape[token_dim] = token_mask.shape
        weight = token_mask.to(x.dtype).view(shape)
        x, y = x * weight, y * weight
    x_sum, y_sum = x.sum(dim=token_dim), y.sum(dim=token_dim)
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
    """Fast path, the signature of `zpx_attention_naive`: one SDPA call on the augmented head dim; returns
    output [B, Lq, H, dv] (a transposed view, not contiguous)."""
    batch, _, q_len, _ = query.shape
    query_aug = augment_query(query, query_features, scaling, lambda_angle, lambda_sphere)
    mask = build_attention_mask(padding_mask, batch, q_len, key_aug.shape[2], causal, query.device)
    if q_len == 1 and dropout == 0.0:
        # One query (cached decoding): softmax(q^ k^T) v as two batched GEMVs over [B*H] (cheaper than a fused
        # kernel's launch), and v keeps its own head dim (no padding of the whole cached value every step).
        heads, k_len = key_aug.shape[1], key_aug.shape[2]
        scores = torch.bmm(query_aug.flatten(0, 1), key_aug.flatten(0, 1).transpose(1, 2))  # [B*H, 1, Lk]
        if mask is not None:
            scores = scores.view(batch, heads, 1, k_len).masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = F.softmax(upcast(scores), dim=-1)
        if weights.dtype != value.dtype:
            weights = weights.to(value.dtype)
        weights = weights.view(batch * heads, 1, k_len)
        output = torch.bmm(weights, value.flatten(0, 1))  # [B*H, 1, dv]
        return output.view(batch, heads, 1, -1).transpose(1, 2), None
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
    return output[..., :value_dim].transpose(1, 2), None
