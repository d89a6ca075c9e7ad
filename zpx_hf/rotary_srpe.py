"""Rotary positions shared by every family: SRPE (spiral rotary, docs/design.md §2), plain RoPE, or none.

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
    """cos/sin of SRPE (or RoPE) computed from `position_ids` on the fly, as Llama's rotary does.

    No table is cached: the cost is a few trig ops per (token, pair), there is nothing to grow or rebuild
    when a sequence outgrows the training length, and `torch.compile` sees no data-dependent sizes.
    """

    def __init__(
        self,
        head_dim: int,
        rotary: str = "srpe",
        theta0: float = 10000.0,
        k_s: float | None = 8.0,
        a_s: float = 0.1,
        f_s: float = 0.01,
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
        self._inv_freq: dict[torch.device | None, torch.Tensor] = {}  # per device, see `inv_freq`

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """omega_j = theta0 ** (-2j / d_h), computed as Llama does (float32). A function of the config only: kept
        per device after the first eager call (five ops fewer per decoding step); traced inside compiled graphs."""
        if not torch.compiler.is_compiling() and device in self._inv_freq:
            return self._inv_freq[device]
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        inv_freq = 1.0 / (self.theta0**exponent)
        if not torch.compiler.is_compiling():
            self._inv_freq[device] = inv_freq
        return inv_freq

    def pair_tables(self, position_ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """r_j(p) cos Theta_j(p) and r_j(p) sin Theta_j(p) per pair, float32 [B, L, d_h/2]."""
        positions = position_ids.to(device=device, dtype=torch.float32)
        if positions.dim() == 1:
            positions = positions[None]
        base = positions[..., None] * self.inv_freq(device)  # p * omega_j
        # Scalar factors through tensor methods (cheaper per call than the Python operators on small tables).
        angle = base.mul(self.winding) if self.winding != 1.0 else base
        if self.a_s == 0.0:
            return torch.cos(angle), torch.sin(angle)
        radius = torch.sin(base.mul(self.f_s)).mul_(self.a_s).add_(1.0)  # 1 + a_s sin(p f_s omega_j)
        return radius * torch.cos(angle), radius * torch.sin(angle)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Llama-layout tables [B, L, d_h] (halves duplicated for `rotate_half`) in `x.dtype`."""
        cos, sin = self.pair_tables(position_ids, x.device)
        cos = torch.cat((cos, cos), dim=-1)
        sin = torch.cat((sin, sin), dim=-1)
        if cos.dtype != x.dtype:
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return cos, sin

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
    )
