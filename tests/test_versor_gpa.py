"""Geometric product attention: reference vs a per-pair transcription; Triton kernel vs reference."""

import math

import pytest
import torch

from zpx_hf.clifford_algebra import conformal_algebra
from zpx_hf.modeling_blocks import build_attention_mask
from zpx_hf.ops_gpa import (
    HAS_TRITON,
    geometric_product_attention,
    gpa_reference,
    gpa_scalar_sdpa,
    gpa_triton,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def gpa_direct(query, key, value, gamma, causal, eps=1e-6):
    """Per pair (i, j): P = sum_ch Q_i,ch ~K_j,ch with the full geometric product, then the SPEC formula."""
    algebra = conformal_algebra()
    batch, heads, q_len, dim = query.shape
    k_len = key.shape[2]
    q = query.reshape(batch, heads, q_len, dim // 32, 32)
    k = key.reshape(batch, heads, k_len, dim // 32, 32)
    bivectors = algebra.blades_of_grade(2)
    scores = torch.empty(batch, heads, q_len, k_len, dtype=query.dtype)
    for i in range(q_len):
        for j in range(k_len):
            p = algebra.geometric_product(q[:, :, i], algebra.reverse(k[:, :, j])).sum(-2)  # [B, H, 32]
            norm = torch.sqrt(p[..., bivectors].pow(2).sum(-1) + eps)
            scores[:, :, i, j] = (p[..., 0] + gamma * norm) / math.sqrt(dim)
    if causal:
        visible = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, -1) @ value


def _inputs(batch, heads, q_len, k_len, channels, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    dim = 32 * channels
    q, k, v = (torch.randn(batch, heads, n, dim, generator=generator, dtype=dtype) for n in (q_len, k_len, k_len))
    gamma = torch.tensor([0.7, -0.4, 1.3][:heads], dtype=torch.float32)
    return [t.requires_grad_(True) for t in (q, k, v, gamma)]


@pytest.mark.parametrize("causal", [True, False])
def test_reference_equals_direct_geometric_product(causal):
    q, k, v, gamma = (t.detach().double() for t in _inputs(1, 2, 5, 5, 2))
    expected = gpa_direct(q, k, v, gamma.double(), causal)
    out, weights = gpa_reference(q, k, v, gamma, is_causal=causal)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights[..., 0]))


def test_reference_padding_mask_and_scalar_sdpa():
    q, k, v, gamma = (t.detach() for t in _inputs(2, 2, 7, 7, 1))
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool).tril()
    mask[0, ..., :2] = False
    mask[0, :, :2, :] = True  # rows that would be empty open to every key (as build_attention_mask does)
    out, _ = gpa_reference(q, k, v, torch.zeros_like(gamma), attention_mask=mask)
    torch.testing.assert_close(gpa_scalar_sdpa(q, k, v, attention_mask=mask), out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        gpa_scalar_sdpa(q, k, v, is_causal=True),
        gpa_reference(q, k, v, torch.zeros_like(gamma), is_causal=True)[0],
        rtol=1e-5,
        atol=1e-5,
    )
    # CPU dispatch without a forced kernel runs the reference (Triton only for CUDA tensors)
    out_auto, _ = geometric_product_attention(q, k, v, gamma, is_causal=True)
    torch.testing.assert_close(out_auto, gpa_reference(q, k, v, gamma, is_causal=True)[0])


@needs_triton
@pytest.mark.parametrize(
    "q_len,k_len,channels,causal",
    [(19, 19, 2, True), (13, 13, 1, False), (5, 23, 2, True), (1, 9, 2, True), (7, 30, 3, False)],
)
def test_triton_equals_reference_fp32(q_len, k_len, channels, causal):
    q, k, v, gamma = _inputs(2, 2, q_len, k_len, channels, seed=q_len)
    expected, _ = gpa_reference(q, k, v, gamma, is_causal=causal)
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (q, k, v, gamma), grad_out)
    out, _ = gpa_triton(q, k, v, gamma, is_causal=causal)
    grads = torch.autograd.grad(out, (q, k, v, gamma), grad_out)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for name, got, want in zip("qkv", grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"d{name}")
    torch.testing.assert_close(grads[3], expected_grads[3], rtol=1e-3, atol=1e-4, msg="dgamma")


@needs_triton
def test_triton_equals_reference_fp16():
    q, k, v, gamma = _inputs(1, 2, 17, 17, 2, dtype=torch.float16, seed=3)
    expected, _ = gpa_reference(q, k, v, gamma, is_causal=True)
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (q, k, v, gamma), grad_out)
    out, _ = gpa_triton(q, k, v, gamma, is_causal=True)
    grads = torch.autograd.grad(out, (q, k, v, gamma), grad_out)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
    for got, want in zip(grads, expected_grads):
        scale = float(want.abs().max())
        assert float((got.float() - want.float()).abs().max()) < 3e-2 * max(scale, 1.0)


@needs_triton
@pytest.mark.parametrize(
    "q_len,k_len,causal,padding",
    [
        (37, 37, True, [(20, 0), (0, 5)]),  # left padding longer than a key block, right padding
        (37, 37, False, [(20, 0), (0, 5)]),
        (1, 37, True, [(20, 0), (3, 0)]),  # decoding step over a padded cache
        (5, 37, True, [(37, 0), (0, 0)]),  # a sequence that is all padding
    ],
)
def test_triton_key_padding_equals_reference_with_built_mask(q_len, k_len, causal, padding):
    q, k, v, gamma = _inputs(2, 2, q_len, k_len, 2, seed=k_len + q_len)
    padding_mask = torch.ones(2, k_len, dtype=torch.long)
    for b, (left, right) in enumerate(padding):
        padding_mask[b, :left] = 0
        padding_mask[b, k_len - right :] = 0
    mask = build_attention_mask(padding_mask, 2, q_len, k_len, causal, q.device)
    expected, _ = gpa_reference(q, k, v, gamma, attention_mask=mask)
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (q, k, v, gamma), grad_out)
    out, _ = geometric_product_attention(
        q, k, v, gamma, attention_mask=mask, kernel="triton", key_padding_mask=padding_mask, causal=causal
    )
    grads = torch.autograd.grad(out, (q, k, v, gamma), grad_out)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


@needs_triton
def test_triton_rejects_dense_mask():
    q, k, v, gamma = (t.detach() for t in _inputs(1, 1, 4, 4, 1))
    with pytest.raises(ValueError, match="attention_mask=None"):
        gpa_triton(q, k, v, gamma, attention_mask=torch.ones(1, 1, 4, 4, dtype=torch.bool))
    # a dense mask of unknown construction takes the reference
    mask = torch.rand(1, 1, 4, 4) > 0.3
    mask[..., 0] = True
    out, _ = geometric_product_attention(q, k, v, gamma, attention_mask=mask, kernel="triton")
    torch.testing.assert_close(out, gpa_reference(q, k, v, gamma, attention_mask=mask)[0])


@pytest.mark.gpu
def test_triton_on_gpu_bf16_and_long():
    q, k, v, gamma = (t.detach().cuda() for t in _inputs(2, 2, 1000, 1000, 2))
    gamma.requires_grad_(True)
    for dtype, tol in ((torch.float32, 1e-3), (torch.bfloat16, 5e-2)):
        qq, kk, vv = (t.to(dtype).requires_grad_(True) for t in (q, k, v))
        expected, _ = gpa_reference(qq, kk, vv, gamma, is_causal=True)
        out, _ = gpa_triton(qq, kk, vv, gamma, is_causal=True)
        torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)
        grad_out = torch.randn_like(out)
        got = torch.autograd.grad(out, (qq, kk, vv, gamma), grad_out)
        want = torch.autograd.grad(expected, (qq, kk, vv, gamma), grad_out)
        for g, w in zip(got, want):
            assert float((g.float() - w.float()).abs().max()) < tol * 10 * max(1.0, float(w.abs().max()))
