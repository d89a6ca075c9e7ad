"""Geometric product attention below its kernels: the bilinear-form tables and the kernel signature.

Every GPA kernel (`ops_gpa_naive`, `ops_gpa_chunk`, `ops_gpa_triton`) imports only this module, `ops_common`
and the algebra; the entry `ops_gpa.geometric_product_attention` imports the kernels (docs/design.md §6.1).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .clifford_algebra import BIVECTOR_MASKS, conformal_algebra

NUM_FORMS = 1 + len(BIVECTOR_MASKS)  # scalar + 10 bivector coefficients


class GPAKernel(Protocol):
    """The signature of every GPA kernel; inputs come checked from the entry (`ops_gpa.check_gpa_inputs`),
    autocast off.

    query [B, H, Lq, D] and key / value [B, H, Lk, D] of one floating dtype (D = 32 c: c multivectors per head),
    gamma [H], key_padding_mask [B, Lk] (True / 1 = real token) or None, document_ids [B, Lk] int (packed rows)
    or None, `scaling` resolved (a float), `eps` > 0, `bivector` False for the scalar score only. Query i sits
    at position Lk - Lq + i. Returns out [B, H, Lq, D] (float32, float64 for float64; the entry casts back)."""

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        gamma: torch.Tensor,
        *,
        causal: bool,
        key_padding_mask: torch.Tensor | None,
        document_ids: torch.Tensor | None,
        scaling: float,
        eps: float,
        bivector: bool,
    ) -> torch.Tensor: ...


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


__all__ = ["NUM_FORMS", "GPAKernel", "form_tables"]
