"""Rotary positions shared by every family: SRPE (spiral rotary, SPEC §1), plain RoPE, or none.

For head dim `d_h`, pair index `j in [0, d_h/2)` and position `p`:

    omega_j    = theta0 ** (-2j / d_h)
    Theta_j(p) = p * omega_j * (1 + 1/k_s)          second winding
    r_j(p)     = 1 + a_s * sin(p * f_s * omega_j)   radial modulation
    cos_j(p)   = r_j(p) cos Theta_j(p),   sin_j(p) = r_j(p) sin Theta_j(p)
    q'         = q * cos + rotate_half(q) * sin

With `a_s = 0` and `1/k_s = 0` this is exactly RoPE. The PCT family applies the same
tables in complex form (`q * r e^{i Theta}`), via `SpiralRotaryEmbedding.pair_tables`.
"""

from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] on the last dimension (the real form of multiplying by i)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` [B, H, L, d] with tables `cos`, `sin` [B, L, d] (broadcast over heads)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class SpiralRotaryEmbedding(nn.Module):
    """cos/sin tables for `rotary in {"srpe", "rope"}`, cached in float32 and extended on demand.

    The tables are plain attributes, not buffers: they are derived data, never saved, and must not
    be touched by meta-device initialisation or `from_pretrained` weight loading.
    """

    def __init__(
        self,
        head_dim: int,
        rotary: str = "srpe",
        theta0: float = 10000.0,
        k_s: float | None = 8.0,
        a_s: float = 0.1,
        f_s: float = 0.01,
        max_position_embeddings: int = 2048,
    ) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"`head_dim`={head_dim} must be even for rotary positions (they rotate pairs).")
        if rotary not in ("srpe", "rope"):
            raise ValueError(f"`rotary`={rotary!r}: SpiralRotaryEmbedding serves 'srpe' or 'rope'.")
        self.head_dim = head_dim
        self.rotary = rotary
        self.theta0 = float(theta0)
        if rotary == "rope":
            k_s, a_s = None, 0.0
        self.winding = 1.0 + (1.0 / k_s if k_s is not None else 0.0)
        self.a_s = float(a_s)
        self.f_s = float(f_s)
        self.initial_length = int(max_position_embeddings)
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """omega_j = theta0 ** (-2j / d_h), computed as Llama does (float32)."""
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        return 1.0 / (self.theta0**exponent)

    @torch.no_grad()
    def _build(self, length: int, device: torch.device) -> None:
        positions = torch.arange(length, device=device, dtype=torch.float32)
        base = positions[:, None] * self.inv_freq(device)[None, :]  # p * omega_j, [T, d_h/2]
        angle = base * self.winding if self.winding != 1.0 else base
        radius = 1.0 + self.a_s * torch.sin(base * self.f_s) if self.a_s != 0.0 else torch.ones_like(base)
        self._cos = radius * torch.cos(angle)
        self._sin = radius * torch.sin(angle)

    def pair_tables(self, position_ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """r cos Theta and r sin Theta per pair, float32 [B, L, d_h/2], gathered at `position_ids`."""
        if position_ids.numel() and int(position_ids.min()) < 0:
            raise ValueError("`position_ids` must be >= 0 (left padding? derive them from attention_mask).")
        needed = int(position_ids.max()) + 1 if position_ids.numel() else 1
        cached = 0 if self._cos is None else self._cos.shape[0]
        if self._cos is None or self._cos.device != device or needed > cached:
            # Grow geometrically so that token-by-token generation does not rebuild every step.
            self._build(max(needed, self.initial_length, 2 * cached if needed > cached else cached), device)
        ids = position_ids.to(device)
        return self._cos[ids], self._sin[ids]

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Llama-layout tables [B, L, d_h] (halves duplicated for `rotate_half`) in `x.dtype`."""
        cos, sin = self.pair_tables(position_ids, x.device)
        cos = torch.cat((cos, cos), dim=-1)
        sin = torch.cat((sin, sin), dim=-1)
        return cos.to(x.dtype), sin.to(x.dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rotary={self.rotary}, winding={self.winding}, a_s={self.a_s}, f_s={self.f_s}"


def build_rotary(config) -> SpiralRotaryEmbedding | None:
    """The rotary module a config asks for (`None` for `rotary="none"`)."""
    if config.rotary == "none":
        return None
    return SpiralRotaryEmbedding(
        head_dim=config.rotary_dim,
        rotary=config.rotary,
        theta0=config.rope_theta,
        k_s=config.srpe_k,
        a_s=config.srpe_a,
        f_s=config.srpe_f,
        max_position_embeddings=config.max_position_embeddings,
    )
