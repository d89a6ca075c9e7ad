"""ZPX attention below its kernels: the key-feature layout, the augmented query and the kernel signature.

Every ZPX kernel (`ops_zpx_naive`, `ops_zpx_panel`, `ops_zpx_decode`) imports only this module, `ops_common`
and the algebra; the entry `ops_zpx.zpx_attention` imports the kernels (docs/design.md §6.1).

Keys are cached augmented, k^ = [k, cos phi (C), sin phi (C), X (C), Y (C), Z (C)] (`PHASE_FEATURES` = 5
features per phase channel), and with q^ = [q * scaling, (la/C) cos phi, (la/C) sin phi, (ls/C) s] the score
of docs/design.md §3.2 is S = q^ . k^ (§3.4).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .ops_common import constant_tables, upcast

PHASE_FEATURES = 5  # per-channel key features: cos phi, sin phi, X, Y, Z


class ZPXKernel(Protocol):
    """The signature of every ZPX kernel; inputs come checked from the entry (`ops_zpx.check_inputs`).

    query [B, H, Lq, d]; key_aug [B, Hkv, Lk, d + 5C] (k^); value [B, Hkv, Lk, dv]; query_features [B, H, Lq, 5C]
    (the queries' [cos, sin, X, Y, Z]); Hkv divides H and query head h reads key-value head h // (H / Hkv)
    (grouped-query attention; Hkv = H is multi-head); key_padding_mask [B, Lk] bool (True = real token) or None;
    document_ids [B, Lk] int64 (packed rows) or None. Query i sits at position Lk - Lq + i. Returns (output
    [B, Lq, H, dv], weights [B, H, Lq, Lk] where the kernel materialises them, else None)."""

    def __call__(
        self,
        query: torch.Tensor,
        key_aug: torch.Tensor,
        value: torch.Tensor,
        query_features: torch.Tensor,
        *,
        causal: bool,
        scaling: float,
        lambda_angle: float,
        lambda_sphere: float,
        dropout: float,
        key_padding_mask: torch.Tensor | None,
        document_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


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


__all__ = ["PHASE_FEATURES", "ZPXKernel", "augment_query", "query_coefficients"]
