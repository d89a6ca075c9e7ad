"""Complex-valued building blocks stored as real tensors.

A complex tensor `z = x + iy` with `n` features is stored as one real tensor of width `2n`
laid out `[re | im]` = `[x_1..x_n, y_1..y_n]` on the last dimension. Torch complex dtypes are
avoided on purpose: they break bf16, autocast, SDPA and `torch.compile`.

* `ComplexLinear`      W z + c with W = A + iB as two real `nn.Linear` sub-modules `real` (A)
                       and `imag` (B), so PEFT/LoRA can target them by name; computed as one GEMM
                       with the real block weight [[A, -B], [B, A]].
* `ComplexEmbedding`   token -> complex vector (one `nn.Embedding` row `[re | im]`).
* `ComplexRMSNorm`     z * w / sqrt(mean_m |z_m|^2 + eps), real gain w: rescales, keeps phases.
* `ModReLU`            relu(|z| + b) z / |z|: a phase-preserving nonlinearity.
* `complex_rotate`     z * r e^{i Theta} per complex feature (complex-native RoPE/SRPE).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .modeling_blocks import upcast


def complex_parts(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., 2n] laid out [re | im] -> (re, im), each [..., n]."""
    half = z.shape[-1] // 2
    return z[..., :half], z[..., half:]


def complex_pairs(z: torch.Tensor) -> torch.Tensor:
    """[..., 2n] -> the view [..., 2, n] (row 0 re, row 1 im): reshapes instead of slices, whose backward
    would zero-fill a full-size gradient per slice."""
    return z.unflatten(-1, (2, -1))


def complex_abs2(z: torch.Tensor) -> torch.Tensor:
    """|z_m|^2 = re_m^2 + im_m^2, [..., n]."""
    return complex_pairs(z.square()).sum(-2)


def complex_rotate(z: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """z_m * (cos_m + i sin_m): with SRPE tables cos = r cos Theta, sin = r sin Theta this is z r e^{i Theta}.

    `z` is [B, H, L, 2d] ([re | im] per head); `cos`, `sin` are [B, L, d] (broadcast over heads).
    """
    cos = cos.unsqueeze(1).unsqueeze(-2).to(z.dtype)  # [B, 1, L, 1, d]
    sin = sin.unsqueeze(1).to(z.dtype)
    signed_sin = torch.stack((-sin, sin), dim=-2)  # [B, 1, L, 2, d]
    pairs = complex_pairs(z)
    # [re, im] cos + [im, re] [-sin, sin] = [re cos - im sin, im cos + re sin]
    return (pairs * cos + pairs.flip(-2) * signed_sin).flatten(-2)


BLOCK_GEMM_MIN_TOKENS = 64  # with gradients, fewer rows: two GEMMs on A, B beat building [[A, -B], [B, A]]


class ComplexLinear(nn.Module):
    """Complex affine map W z + c with W = A + iB.

    (A + iB)(x + iy) = (Ax - By) + i(Bx + Ay): on z = [x | y] that is one real GEMM with the block
    weight [[A, -B], [B, A]]. `real` holds A, `imag` holds B (plain `nn.Linear`s, so checkpoints and
    PEFT target names stay `real` / `imag`). With `bias=True` the complex bias is c = (a - b) + i(a + b)
    for the sub-modules' real biases a, b (a bijective parameterisation of C^n).

    With gradients on, the block weight is built per call (autograd sums its four blocks back into A and
    B); below `BLOCK_GEMM_MIN_TOKENS` input rows that costs more than the GEMM, so two GEMMs on A and B
    run instead. With gradients off (generation) the block weight is kept and reused until A, B or the
    biases change (in-place updates or new tensors), so a decoding step is one GEMM; that copy doubles
    these layers' weight memory while in use.

    When a sub-module is no longer a plain hook-free `nn.Linear` (a PEFT/LoRA layer, a parametrisation,
    an FSDP unit, a hook), the forward calls the sub-modules instead, each applied once to the stacked
    (x, y), so whatever wraps them sees every input: the same function, two GEMMs.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.real = nn.Linear(in_features, out_features, bias=bias)
        self.imag = nn.Linear(in_features, out_features, bias=bias)
        self._inference_block = None  # (key, weight, bias) of the last no-grad block weight

    def _plain_linears(self) -> bool:
        return all(
            type(m) is nn.Linear and not (m._forward_hooks or m._forward_pre_hooks) for m in (self.real, self.imag)
        )

    def _build_block(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, b = self.real.weight, self.imag.weight
        weight = torch.cat((torch.cat((a, -b), dim=1), torch.cat((b, a), dim=1)))  # [[A, -B], [B, A]]
        bias = None
        if self.real.bias is not None:
            bias = torch.cat((self.real.bias - self.imag.bias, self.real.bias + self.imag.bias))
        return weight, bias

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if not self._plain_linears():
            return self.forward_submodules(z)
        params = [p for p in (self.real.weight, self.imag.weight, self.real.bias, self.imag.bias) if p is not None]
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            if z.numel() < BLOCK_GEMM_MIN_TOKENS * z.shape[-1]:
                return self.forward_submodules(z)
            return F.linear(z, *self._build_block())
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        if self._inference_block is None or self._inference_block[0] != key:
            with torch.no_grad():
                self._inference_block = (key, *self._build_block())
        return F.linear(z, *self._inference_block[1:])

    def forward_submodules(self, z: torch.Tensor) -> torch.Tensor:
        """The same map through the sub-modules' own forwards (two GEMMs): what adapters and hooks see."""
        parts = torch.stack(complex_parts(z))  # [2, ..., in]: (x, y)
        a_parts = self.real(parts)  # (Ax + a, Ay + a)
        b_parts = self.imag(parts)  # (Bx + b, By + b)
        return torch.cat((a_parts[0] - b_parts[1], b_parts[0] + a_parts[1]), dim=-1)

    def extra_repr(self) -> str:
        return f"complex in={self.in_features}, out={self.out_features}"


class ComplexEmbedding(nn.Embedding):
    """Token -> complex vector of `complex_dim` features; each row is stored as `[re | im]` (width 2n).

    A plain `nn.Embedding` underneath, so resizing, tying and weight loading work unchanged. Tied to a
    real LM head on `[re | im]`, the logit of token v is Re sum_m conj(e_vm) z_m.
    """

    def __init__(self, num_embeddings: int, complex_dim: int, padding_idx: int | None = None) -> None:
        super().__init__(num_embeddings, 2 * complex_dim, padding_idx=padding_idx)
        self.complex_dim = complex_dim


class ComplexRMSNorm(nn.Module):
    """z_m -> w_m z_m / sqrt(mean_m |z_m|^2 + eps), computed in at least float32; w real, so phases
    are kept."""

    def __init__(self, complex_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(complex_dim))
        self.variance_epsilon = eps

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        input_dtype = z.dtype
        z = upcast(z)
        variance = 2 * z.square().mean(-1, keepdim=True)  # mean_m |z_m|^2 over n = 2 x mean over the 2n parts
        z = z * torch.rsqrt(variance + self.variance_epsilon)
        return (complex_pairs(z) * self.weight.to(z.dtype)).flatten(-2).to(input_dtype)  # same gain on re, im

    def extra_repr(self) -> str:
        return f"complex_dim={self.weight.shape[0]}, eps={self.variance_epsilon}"


class ModReLU(nn.Module):
    """modReLU (Arjovsky et al., 2016): z -> relu(|z| + b) z / |z| per complex feature, b learnable.

    Changes magnitudes only; the phase of every surviving feature is unchanged. `|z|` carries `eps`
    inside the square root so the map and its gradient stay finite at z = 0.
    """

    def __init__(self, complex_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(complex_dim))
        self.eps = eps

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        inverse = torch.rsqrt(complex_abs2(upcast(z)) + self.eps)  # 1 / |z|
        scale = (inverse * upcast(self.bias)).add_(1.0).relu_()  # relu(|z| + b) / |z| = relu(1 + b / |z|)
        return (complex_pairs(z) * scale.unsqueeze(-2).to(z.dtype)).flatten(-2)

    def extra_repr(self) -> str:
        return f"complex_dim={self.bias.shape[0]}"


__all__ = [
    "ComplexEmbedding",
    "ComplexLinear",
    "ComplexRMSNorm",
    "ModReLU",
    "complex_abs2",
    "complex_pairs",
    "complex_parts",
    "complex_rotate",
]
