"""Complex-valued building blocks stored as real tensors.

A complex tensor `z = x + iy` with `n` features is stored as one real tensor of width `2n`
laid out `[re | im]` = `[x_1..x_n, y_1..y_n]` on the last dimension. Torch complex dtypes are
avoided on purpose: they break bf16, autocast, SDPA and `torch.compile`.

* `ComplexLinear`      W z + c with W = A + iB as two real `nn.Linear` sub-modules `real` (A)
                       and `imag` (B), so PEFT/LoRA can target them by name; computed by
                       `complex_linear` (Gauss's three GEMMs, or one stacked-row GEMM when decoding).
* `ComplexEmbedding`   token -> complex vector (one `nn.Embedding` row `[re | im]`).
* `ComplexRMSNorm`     z * w / sqrt(mean_m |z_m|^2 + eps), real gain w: rescales, keeps phases.
* `ModReLU`            relu(|z| + b) z / |z|: a phase-preserving nonlinearity (`mod_relu`: closed-form
                       backward; `mod_relu_naive`: the same formula through autograd, the reference).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .modeling_blocks import derived_weight, plain_linears, row_major_transpose
from .ops_common import upcast


def complex_parts(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., 2n] laid out [re | im] -> (re, im), each [..., n]."""
    half = z.shape[-1] // 2
    return z[..., :half], z[..., half:]


def complex_pairs(z: torch.Tensor) -> torch.Tensor:
    """[..., 2n] -> the view [..., 2, n] (row 0 re, row 1 im): reshapes instead of slices, whose backward
    would zero-fill a full-size gradient per slice."""
    return z.unflatten(-1, (2, -1))


GAUSS_MIN_ROWS = 64  # from this many input rows (float32/64), three GEMMs beat the block weight's four
_GAUSS_DTYPES = (torch.float32, torch.float64)  # half precisions keep the one-rounding block GEMM


class _GaussComplexMatmul(torch.autograd.Function):
    """z [M, 2n] = [x | y] times W = A + iB (A, B [N, n]) -> [M, 2N] = [Ax - By | Bx + Ay] in three real GEMMs
    (Gauss's trick):  k = (x + y) A^T,  re = k - y (A + B)^T,  im = k + x (B - A)^T.

    Backward, g = [g_re | g_im], gs = g_re + g_im, the same trick on W^H g and on g^T conj(z):
        dz = [k' - g_im (A - B) | k' - g_re (A + B)],   k' = gs A
        dA = kk - g_im^T (x - y),   dB = kk - g_re^T (x + y),   kk = gs^T x
    Nine GEMMs per step where the block weight [[A, -B], [B, A]] costs twelve GEMMs' worth.
    """

    @staticmethod
    def forward(ctx, z, a, b):
        n = a.shape[1]
        x, y = z[:, :n], z[:, n:]
        s = x + y
        k = torch.mm(s, a.t())
        # re and im written straight into the two halves of the output (no concatenation copy)
        out = z.new_empty(z.shape[0], 2 * a.shape[0])
        torch.addmm(k, y, (a + b).t(), alpha=-1, out=out[:, : a.shape[0]])
        torch.addmm(k, x, (b - a).t(), out=out[:, a.shape[0] :])
        ctx.save_for_backward(z, a, b, s)
        return out

    @staticmethod
    def backward(ctx, grad):
        z, a, b, s = ctx.saved_tensors
        n, n_out = a.shape[1], a.shape[0]
        g_re, g_im = grad[:, :n_out], grad[:, n_out:]
        gs = g_re + g_im
        dz = da = db = None
        if ctx.needs_input_grad[0]:
            k = torch.mm(gs, a)
            dz = grad.new_empty(grad.shape[0], 2 * n)
            torch.addmm(k, g_im, a - b, alpha=-1, out=dz[:, :n])
            torch.addmm(k, g_re, a + b, alpha=-1, out=dz[:, n:])
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            x, y = z[:, :n], z[:, n:]
            kk = torch.mm(gs.t(), x)
            da = torch.addmm(kk, g_im.t(), x - y, alpha=-1)
            db = torch.addmm(kk, g_re.t(), s, alpha=-1)
        return dz, da, db


def complex_matmul_gauss(z: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[..., 2n] = [x | y] -> [..., 2N] = [Ax - By | Bx + Ay] in three GEMMs (`_GaussComplexMatmul`)."""
    out = _GaussComplexMatmul.apply(z.reshape(-1, z.shape[-1]), a, b)
    return out.view(*z.shape[:-1], out.shape[-1])


def complex_matmul_stacked(z: torch.Tensor, weight_t: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """The same map for few rows (decoding): the rows x, y share one GEMM with weight_t = [A; B]^T [n, 2N], so
    A and B are read once (a GEMV on the block weight reads 4 n N values, this 2 n N); a 2 x 4 GEMM then mixes
    the four products (exact: its entries are 0 and +-1):

        [x; y] [A; B]^T = [[Ax, Bx], [Ay, By]],   out = mix [Ax; Bx; Ay; By] = [Ax - By; Bx + Ay],
        mix = [[1, 0, 0, -1], [0, 1, 1, 0]]
    """
    n, n_out = weight_t.shape[0], weight_t.shape[1] // 2
    r = torch.mm(z.view(-1, n) if z.is_contiguous() else z.reshape(-1, n), weight_t)  # [M * (x, y), (A, B) * N]
    out = torch.mm(mix, r.view(4, n_out)) if r.shape[0] == 2 else torch.matmul(mix, r.view(-1, 4, n_out))
    return out.view(*z.shape[:-1], 2 * n_out)


def _complex_bias(layers: tuple[ComplexLinear, ...]) -> torch.Tensor | None:
    """c = (a - b) + i(a + b) of every layer, laid out [re_1 re_2 ... | im_1 im_2 ...]; None without biases."""
    if layers[0].real.bias is None:
        return None
    a = torch.cat([m.real.bias for m in layers]) if len(layers) > 1 else layers[0].real.bias
    b = torch.cat([m.imag.bias for m in layers]) if len(layers) > 1 else layers[0].imag.bias
    return torch.cat((a - b, a + b))


def _stacked_weights(layers: tuple[ComplexLinear, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """([A_1; A_2; ...; B_1; B_2; ...]^T [n, 2N], mix [[1, 0, 0, -1], [0, 1, 1, 0]]) for `complex_matmul_stacked`.
    The transpose is stored row-major (`row_major_transpose`, which says why)."""
    weight_t = row_major_transpose([m.real.weight for m in layers] + [m.imag.weight for m in layers])
    mix = torch.tensor([[1.0, 0.0, 0.0, -1.0], [0.0, 1.0, 1.0, 0.0]], dtype=dtype, device=weight_t.device)
    return weight_t, mix


def complex_linear(z: torch.Tensor, layers: tuple[ComplexLinear, ...]) -> torch.Tensor:
    """Plain `ComplexLinear`s with one input width as one map: [..., 2n] -> [..., 2 (N_1 + N_2 + ...)] laid out
    [re_1 re_2 ... | im_1 im_2 ...] (one layer: `layer(z)`; q, k, v: one projection, keys unchanged).

    Many rows in float32/64: Gauss's three GEMMs. Few rows: one GEMM on the stacked rows (x, y) against
    [A; B]^T, built on every call, or once per `generate` call (`derived_weight`). Under autocast or in half
    precision: the block weight [[A, -B], [B, A]] in one autocast-aware `F.linear`.
    """
    rows = z.numel() // z.shape[-1]
    # torch.export (dynamic batch / sequence) traces one path for every shape: the block weight, not a branch on rows
    if torch.is_autocast_enabled(z.device.type) or z.dtype not in _GAUSS_DTYPES or torch.compiler.is_exporting():
        a = torch.cat([m.real.weight for m in layers]) if len(layers) > 1 else layers[0].real.weight
        b = torch.cat([m.imag.weight for m in layers]) if len(layers) > 1 else layers[0].imag.weight
        weight = torch.cat((torch.cat((a, -b), dim=1), torch.cat((b, a), dim=1)))  # [[A, -B], [B, A]]
        return F.linear(z, weight, _complex_bias(layers))
    if rows >= GAUSS_MIN_ROWS:
        a = torch.cat([m.real.weight for m in layers]) if len(layers) > 1 else layers[0].real.weight
        b = torch.cat([m.imag.weight for m in layers]) if len(layers) > 1 else layers[0].imag.weight
        out, bias = complex_matmul_gauss(z, a, b), _complex_bias(layers)
        return out if bias is None else out + bias
    weight_t, mix, bias = derived_weight(
        ("complex_linear", *map(id, layers), z.dtype),
        lambda: (*_stacked_weights(layers, z.dtype), _complex_bias(layers)),
    )
    out = complex_matmul_stacked(z, weight_t, mix)
    return out if bias is None else out + bias


class ComplexLinear(nn.Module):
    """Complex affine map W z + c with W = A + iB.

    (A + iB)(x + iy) = (Ax - By) + i(Bx + Ay) on z = [x | y]. `real` holds A, `imag` holds B (plain
    `nn.Linear`s, so checkpoints and PEFT target names stay `real` / `imag`). With `bias=True` the complex
    bias is c = (a - b) + i(a + b) for the sub-modules' real biases a, b (a bijective parameterisation of C^n).
    The map runs through `complex_linear` (three GEMMs for many rows, one stacked-row GEMM for few).

    When a sub-module is no longer a plain hook-free `nn.Linear` (a PEFT/LoRA layer, a parametrisation,
    an FSDP unit, a hook), the forward calls the sub-modules instead, each on x and on y (inputs of z's rank),
    so whatever wraps them sees every input: the same function, four GEMMs of half the rows each.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.real = nn.Linear(in_features, out_features, bias=bias)
        self.imag = nn.Linear(in_features, out_features, bias=bias)

    def plain(self) -> bool:
        """Both sub-modules plain `nn.Linear`s (`modeling_blocks.plain_linears`; else `forward_submodules` runs)."""
        return plain_linears((self._modules["real"], self._modules["imag"]))  # dicts read directly: no lookups

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if not self.plain():
            return self.forward_submodules(z)
        return complex_linear(z, (self,))

    def forward_submodules(self, z: torch.Tensor) -> torch.Tensor:
        """The same map through the sub-modules' own forwards: what adapters and hooks see. Each gets x and y
        separately, shaped as z is (`[B, L, in]`, the rank an `nn.Linear` normally sees: adapters that read the
        rank, such as OFT, or index the batch, such as mixed-adapter batches, need that)."""
        x, y = complex_parts(z)
        re = self.real(x) - self.imag(y)  # (Ax + a) - (By + b)
        im = self.imag(x) + self.real(y)  # (Bx + b) + (Ay + a)
        return torch.cat((re, im), dim=-1)

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

    @classmethod
    def from_config(cls, config: Any) -> ComplexEmbedding:
        """The token table of a PCT config: `hidden_size / 2` complex features per token."""
        return cls(config.vocab_size, config.complex_hidden_size, config.pad_token_id)


class ComplexRMSNorm(nn.Module):
    """z_m -> w_m z_m / sqrt(mean_m |z_m|^2 + eps), computed in at least float32; w real, so phases
    are kept."""

    def __init__(self, complex_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(complex_dim))
        self.variance_epsilon = eps

    @classmethod
    def from_config(cls, config: Any) -> ComplexRMSNorm:
        return cls(config.complex_hidden_size, eps=config.rms_norm_eps)

    def gain(self, dtype: torch.dtype) -> torch.Tensor:
        """[w | w] / sqrt(2) in `dtype`, built on every call or once per `generate` call (`derived_weight`)."""

        def build() -> torch.Tensor:
            weight = self.weight if self.weight.dtype == dtype else self.weight.to(dtype)
            return torch.cat((weight, weight)) * 2**-0.5

        return derived_weight(("rms_gain", id(self), dtype), build)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z32 = upcast(z)
        # mean_m |z_m|^2 = 2 mean over the 2n parts, so this is the real RMS norm of [re | im] with eps / 2 and
        # the gain [w | w] / sqrt(2) (one fused op): w z / sqrt(2 (mean + eps / 2)) = w z / sqrt(mean_m |z_m|^2 + eps)
        out = F.rms_norm(z32, (z32.shape[-1],), self.gain(z32.dtype), self.variance_epsilon / 2)
        return out if out.dtype == z.dtype else out.to(z.dtype)

    def extra_repr(self) -> str:
        return f"complex_dim={self.weight.shape[0]}, eps={self.variance_epsilon}"


def _mod_relu_parts(z: torch.Tensor, bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    """(out, 1 / |z|, s) with out = s z and s = relu(1 + b / |z|) = relu(|z| + b) / |z|; 1 / |z| and s
    [..., 1, n] in float32 at least."""
    pairs = complex_pairs(z)
    inverse = torch.rsqrt(upcast(pairs).square().sum(-2, keepdim=True) + eps)  # 1 / |z|, [..., 1, n]
    scale = (inverse * upcast(bias)).add_(1.0).relu_()
    out = (pairs * (scale if scale.dtype == z.dtype else scale.to(z.dtype))).flatten(-2)
    return out, inverse, scale


def mod_relu_naive(z: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """modReLU through autograd (the reference for `mod_relu`'s backward)."""
    return _mod_relu_parts(z, bias, eps)[0]


class _ModReLUFunction(torch.autograd.Function):
    """modReLU with its backward in closed form. With t = <g, z> per complex feature (re g_re + im g_im) and
    u = t [s > 0] / |z|:
        db = sum u,   dz = s g - z (u b / |z|^2)     (d s / d z = -[s > 0] b z / |z|^3)
    four passes over z where autograd's chain of the forward's elementwise ops takes about a dozen."""

    @staticmethod
    def forward(ctx, z, bias, eps):
        out, inverse, scale = _mod_relu_parts(z, bias, eps)
        ctx.save_for_backward(z, bias, inverse, scale)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        z, bias, inverse, scale = ctx.saved_tensors
        pairs, g = upcast(complex_pairs(z)), upcast(complex_pairs(grad))
        u = (g * pairs).sum(-2, keepdim=True).mul_(inverse).masked_fill_(scale == 0, 0.0)  # [..., 1, n]
        dbias = u.reshape(-1, u.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        dz = None
        if ctx.needs_input_grad[0]:
            dz = torch.addcmul(g * scale, pairs, u.mul_(upcast(bias)).mul_(inverse.square()), value=-1.0)
            dz = dz.flatten(-2).to(z.dtype)
        return dz, None if dbias is None else dbias.to(bias.dtype), None


def mod_relu(z: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """relu(|z| + b) z / |z| per complex feature of z [..., 2n] ([re | im]); bias [n]. With gradients the
    closed-form backward (`_ModReLUFunction`), else the forward alone; `mod_relu_naive` is the reference."""
    if torch.is_grad_enabled() and (z.requires_grad or bias.requires_grad):
        return _ModReLUFunction.apply(z, bias, eps)
    return mod_relu_naive(z, bias, eps)  # no gradient recorded: the forward alone


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
        return mod_relu(z, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"complex_dim={self.bias.shape[0]}"


__all__ = [
    "ComplexEmbedding",
    "ComplexLinear",
    "complex_linear",
    "ComplexRMSNorm",
    "ModReLU",
    "mod_relu",
    "mod_relu_naive",
    "complex_pairs",
    "complex_parts",
]
