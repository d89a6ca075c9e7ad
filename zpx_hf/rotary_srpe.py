"""Rotary positions shared by every family: SRPE (spiral rotary, docs/design.md §2), plain RoPE, or none.

For head dim `d_h`, pair index `j in [0, d_h/2)` and position `p`:

    omega_j    = theta0 ** (-2j / d_h)
    Theta_j(p) = p * omega_j * (1 + 1/k_s)          second winding
    r_j(p)     = 1 + a_s * sin(p * f_s * omega_j)   radial modulation
    cos_j(p)   = r_j(p) cos Theta_j(p),   sin_j(p) = r_j(p) sin Theta_j(p)
    q'         = q * cos + rotate_half(q) * sin

With `a_s = 0` and `1/k_s = 0` this is exactly RoPE. The PCT family applies the same
tables in complex form (`q * r e^{i Theta}`), via `SpiralRotaryEmbedding.pair_tables`.

Plain RoPE also takes transformers' rope types (`config.rope_parameters["rope_type"]`: linear, dynamic, yarn,
longrope, llama3, ...): omega_j and the attention factor m come from transformers' own `ROPE_INIT_FUNCTIONS`,
the tables are `m cos(p omega_j)`, `m sin(p omega_j)`, and the length-dependent types update omega_j as
transformers' `dynamic_rope_update` does (docs/design.md §2.5).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


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
    when a sequence outgrows the training length, and `torch.compile` sees no data-dependent sizes (except the
    "dynamic" and "longrope" rope types, whose frequencies depend on the longest position, as in transformers).
    `config`: a config whose `rope_parameters` has a scaled `rope_type` (RoPE only); None for the default type.
    """

    def __init__(
        self,
        head_dim: int,
        rotary: str = "srpe",
        theta0: float = 10000.0,
        k_s: float | None = 8.0,
        a_s: float = 0.1,
        f_s: float = 0.01,
        config: Any = None,
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
        self.config = config
        self.rope_type = "default" if config is None else config.rope_parameters["rope_type"]
        self.attention_scaling = 1.0  # m, multiplies the tables (yarn, longrope)
        if self.rope_type != "default":
            if rotary != "rope":
                raise ValueError(f"rope_type={self.rope_type!r} scales plain RoPE only (rotary={rotary!r}).")
            if config.head_dim != head_dim:  # transformers' rope functions size omega from config.head_dim
                raise ValueError(
                    f"rope_type={self.rope_type!r} needs the rotary width to be head_dim={config.head_dim}."
                )
            _, self.attention_scaling = ROPE_INIT_FUNCTIONS[self.rope_type](config, None)
            # transformers' `dynamic_rope_update` state: the length the "dynamic" frequencies were grown for
            self.original_max_seq_len = self.max_seq_len_cached = config.max_position_embeddings
            self._scaled_inv_freq: torch.Tensor | None = None  # dynamic: grown; longrope: the long factors

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """omega_j = theta0 ** (-2j / d_h), computed as Llama does (float32), or transformers' `ROPE_INIT_FUNCTIONS`
        for a scaled rope type (at the original context length for the length-dependent ones). A function of the
        config only: kept per device after the first eager call (five ops fewer per decoding step); traced inside
        compiled graphs."""
        if not torch.compiler.is_compiling() and device in self._inv_freq:
            return self._inv_freq[device]
        if self.rope_type == "default":
            exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
            inv_freq = 1.0 / (self.theta0**exponent)
        else:
            inv_freq = ROPE_INIT_FUNCTIONS[self.rope_type](self.config, device)[0]
        if not torch.compiler.is_compiling():
            self._inv_freq[device] = inv_freq
        return inv_freq

    def frequencies(self, position_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """omega_j for these positions: `inv_freq`, or for "dynamic" and "longrope" what transformers'
        `dynamic_rope_update` sets from the longest position `seq_len = max(position_ids) + 1`."""
        if self.rope_type == "dynamic":
            seq_len = torch.max(position_ids) + 1
            if seq_len > self.max_seq_len_cached:  # growth: NTK base for this length, kept until a short call
                self._scaled_inv_freq = ROPE_INIT_FUNCTIONS["dynamic"](self.config, device, seq_len=seq_len)[0]
                self.max_seq_len_cached = int(seq_len)
            if seq_len < self.original_max_seq_len and self.max_seq_len_cached > self.original_max_seq_len:  # reset
                self._scaled_inv_freq = None
                self.max_seq_len_cached = self.original_max_seq_len
            if self._scaled_inv_freq is not None:
                return self._scaled_inv_freq.to(device)
        elif self.rope_type == "longrope":  # long factors past the original length, short ones within it
            original = self.config.rope_parameters["original_max_position_embeddings"]
            if self._scaled_inv_freq is None:
                self._scaled_inv_freq = ROPE_INIT_FUNCTIONS["longrope"](self.config, device, seq_len=original + 1)[0]
            seq_len = torch.max(position_ids) + 1
            return torch.where(seq_len > original, self._scaled_inv_freq.to(device), self.inv_freq(device))
        return self.inv_freq(device)

    def pair_tables(self, position_ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """r_j(p) cos Theta_j(p) and r_j(p) sin Theta_j(p) per pair (times m for scaled RoPE), float32
        [B, L, d_h/2]."""
        positions = position_ids.to(device=device, dtype=torch.float32)
        if positions.dim() == 1:
            positions = positions[None]
        inv_freq = self.inv_freq(device) if self.rope_type == "default" else self.frequencies(position_ids, device)
        base = positions[..., None] * inv_freq  # p * omega_j
        # Scalar factors through tensor methods (cheaper per call than the Python operators on small tables).
        angle = base.mul(self.winding) if self.winding != 1.0 else base
        if self.a_s == 0.0:
            if self.attention_scaling != 1.0:  # m cos, m sin in float32, as transformers' rotary embeddings
                return torch.cos(angle).mul_(self.attention_scaling), torch.sin(angle).mul_(self.attention_scaling)
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
        scaled = f", rope_type={self.rope_type}" if self.rope_type != "default" else ""
        return (
            f"head_dim={self.head_dim}, rotary={self.rotary}, winding={self.winding}, a_s={self.a_s}, f_s={self.f_s}"
            + scaled
        )


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
        config=config if config.rope_parameters["rope_type"] != "default" else None,
    )
