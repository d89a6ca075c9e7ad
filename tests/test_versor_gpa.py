"""Geometric product attention: naive vs the Cayley-table product; chunked and Triton vs naive on one grid."""

import math

import pytest
import torch

from zpx_hf import ops_gpa_chunk
from zpx_hf.clifford_algebra import conformal_algebra
from zpx_hf.ops_gpa import (
    GPA_KERNELS,
    HAS_TRITON,
    geometric_product_attention,
    gpa_attention_weights,
    gpa_score_parts,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

# (B, H, Lq, Lk, C): square, bidirectional-sized, Lq < Lk (decoding over a cache), one query row
GRID = [(1, 2, 5, 5, 2), (2, 1, 6, 9, 1), (2, 2, 1, 7, 1)]
# larger lengths for the chunked path, run with small panels/blocks so every branch of the plan is taken
CHUNKED_GRID = [(2, 2, 37, 37, 2), (1, 3, 13, 45, 1), (2, 1, 1, 40, 1)]
TRITON_GRID = [(1, 2, 17, 17, 1), (2, 1, 3, 18, 2)]


def gpa_naive(*args, **kwargs):
    return geometric_product_attention(*args, kernel="naive", **kwargs)


def gpa_chunk(*args, **kwargs):
    return geometric_product_attention(*args, kernel="chunk", **kwargs)


def gpa_triton(*args, **kwargs):
    return geometric_product_attention(*args, kernel="triton", **kwargs)


def grid_id(case) -> str:
    return "B{}-H{}-Lq{}-Lk{}-C{}".format(*case)


def make_inputs(batch, heads, q_len, k_len, channels, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    dim = 32 * channels
    q = torch.randn(batch, heads, q_len, dim, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(batch, heads, k_len, dim, generator=generator, dtype=torch.float64) for _ in range(2))
    gamma = torch.tensor([0.7, -0.4, 1.3][:heads], dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    return [t.to(dtype).requires_grad_(True) for t in (q, k, v, gamma)]


def make_padding(batch, k_len, left=(), right=()):
    """[B, Lk] bool: sequence b has `left[b]` leading and `right[b]` trailing padding keys."""
    mask = torch.ones(batch, k_len, dtype=torch.bool)
    for b, n in enumerate(left[:batch]):
        mask[b, :n] = False
    for b, n in enumerate(right[:batch]):
        mask[b, k_len - n :] = False
    return mask


def gpa_direct(query, key, value, gamma, causal, padding=None, bivector=True, eps=1e-6):
    """Per pair (i, j): P = sum_ch Q_i,ch ~K_j,ch with the full geometric product, then docs/design.md §5.4.

    Query i sits at position Lk - Lq + i; a row with no visible key outputs zeros."""
    algebra = conformal_algebra()
    batch, heads, q_len, dim = query.shape
    k_len = key.shape[2]
    q = query.reshape(batch, heads, q_len, dim // 32, 32)
    k = key.reshape(batch, heads, k_len, dim // 32, 32)
    bivectors = algebra.blades_of_grade(2)
    out = torch.zeros_like(query)
    for b in range(batch):
        for i in range(q_len):
            keys = [j for j in range(k_len) if (not causal or j <= k_len - q_len + i)]
            keys = [j for j in keys if padding is None or bool(padding[b, j])]
            if not keys:
                continue
            scores = []
            for j in keys:
                p = algebra.geometric_product(q[b, :, i], algebra.reverse(k[b, :, j])).sum(-2)  # [H, 32]
                score = p[:, 0]
                if bivector:
                    score = score + gamma * torch.sqrt(p[:, bivectors].pow(2).sum(-1) + eps)
                scores.append(score / math.sqrt(dim))
            weights = torch.softmax(torch.stack(scores, -1), -1)  # [H, keys]
            out[b, :, i] = torch.einsum("hn,hnd->hd", weights, value[b, :, keys])
    return out


def assert_grads_close(got_out, want_out, leaves, *, rtol, atol, seed=1):
    grad_out = torch.randn(want_out.shape, generator=torch.Generator().manual_seed(seed), dtype=want_out.dtype)
    got = torch.autograd.grad(got_out, leaves, grad_out, allow_unused=True)
    want = torch.autograd.grad(want_out, leaves, grad_out, allow_unused=True)
    for name, g, w in zip(("query", "key", "value", "gamma"), got, want):
        if w is None:
            assert g is None or float(g.abs().max()) == 0.0, f"d{name} should be zero"
            continue
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(ops_gpa_chunk, "PANEL", 8)
    monkeypatch.setattr(ops_gpa_chunk, "BLOCK", 16)


# ---------------------------------------------------------------- naive vs the Cayley-table product


@pytest.mark.parametrize("case", GRID, ids=grid_id)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_naive_equals_cayley_table_product(case, causal):
    q, k, v, gamma = (t.detach() for t in make_inputs(*case))
    expected = gpa_direct(q, k, v, gamma.double(), causal)
    torch.testing.assert_close(gpa_naive(q, k, v, gamma, causal=causal), expected)


def test_naive_padding_and_empty_rows_equal_cayley_table_product():
    q, k, v, gamma = (t.detach() for t in make_inputs(2, 2, 4, 7, 1))
    padding = make_padding(2, 7, left=(5, 0), right=(0, 2))  # b=0: queries 0, 1 see no key
    for causal in (True, False):
        expected = gpa_direct(q, k, v, gamma.double(), causal, padding)
        torch.testing.assert_close(gpa_naive(q, k, v, gamma, causal=causal, key_padding_mask=padding), expected)
        if causal:
            assert float(expected[0, :, :2].abs().max()) == 0.0 and float(expected[0, :, 2:].abs().min()) > 0.0


def test_score_parts_equal_cayley_table_product():
    q, k, _, _ = (t.detach() for t in make_inputs(1, 2, 3, 4, 2))
    algebra = conformal_algebra()
    scalar, norm = gpa_score_parts(q, k, eps=1e-6)
    for i in range(3):
        for j in range(4):
            p = algebra.geometric_product(q[0, :, i].reshape(2, 2, 32), algebra.reverse(k[0, :, j].reshape(2, 2, 32)))
            p = p.sum(-2)
            torch.testing.assert_close(scalar[0, :, i, j], p[:, 0])
            torch.testing.assert_close(
                norm[0, :, i, j], torch.sqrt(p[:, algebra.blades_of_grade(2)].pow(2).sum(-1) + 1e-6)
            )
    scaled_scalar, scaled_norm = gpa_score_parts(q, k, scaling=0.5)
    torch.testing.assert_close(scaled_scalar, 0.5 * scalar)
    torch.testing.assert_close(scaled_norm, 0.5 * norm)


def test_attention_weights_times_value_is_the_output():
    q, k, v, gamma = (t.detach() for t in make_inputs(2, 2, 5, 8, 1))
    padding = make_padding(2, 8, left=(6, 0))
    weights = gpa_attention_weights(q, k, gamma, causal=True, key_padding_mask=padding)
    assert weights.shape == (2, 2, 5, 8)
    torch.testing.assert_close(weights @ v, gpa_naive(q, k, v, gamma, causal=True, key_padding_mask=padding))
    row_sums = weights.sum(-1)
    torch.testing.assert_close(row_sums[0, :, :3], torch.zeros_like(row_sums[0, :, :3]))  # rows with no key
    torch.testing.assert_close(row_sums[0, :, 3:], torch.ones_like(row_sums[0, :, 3:]))
    torch.testing.assert_close(row_sums[1], torch.ones_like(row_sums[1]))


# ---------------------------------------------------------------- chunked vs naive, float64


@pytest.mark.parametrize("case", CHUNKED_GRID, ids=grid_id)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_chunked_equals_naive_float64(case, causal, padded, small_chunks):
    q, k, v, gamma = make_inputs(*case, seed=case[2])
    batch, k_len = case[0], case[3]
    # left padding longer than a key block (skipped block, empty query rows), right padding
    padding = make_padding(batch, k_len, left=(20,), right=(0, 3)) if padded else None
    want = gpa_naive(q, k, v, gamma, causal=causal, key_padding_mask=padding)
    got = gpa_chunk(q, k, v, gamma, causal=causal, key_padding_mask=padding)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert_grads_close(got, want, (q, k, v, gamma), rtol=1e-8, atol=1e-10)


def test_chunked_saves_only_linear_memory():
    """The backward keeps q, k, v, out and the log-sum-exp, never an L x L tile."""
    q, k, v, gamma = make_inputs(1, 2, 256, 256, 1, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        gpa_chunk(q, k, v, gamma, causal=True)
    assert sum(saved) <= 5 * q.numel()
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        gpa_naive(q, k, v, gamma, causal=True)
    assert sum(saved) > 256 * 256  # the reference does keep L x L tensors


# ---------------------------------------------------------------- bivector=False: one function everywhere


def test_scalar_only_is_one_function_on_every_path(small_chunks):
    q, k, v, gamma = make_inputs(2, 2, 6, 20, 1, dtype=torch.float32)
    padding = make_padding(2, 20, left=(16,))  # b=0: the first query row sees no key
    kwargs = dict(causal=True, key_padding_mask=padding, bivector=False)
    expected = gpa_direct(*(t.detach().double() for t in (q, k, v, gamma)), True, padding, bivector=False)
    paths = {
        name: lambda g, n=name: geometric_product_attention(q, k, v, g, kernel=n, **kwargs)
        for name in ("auto", "naive", "chunk") + (("triton",) if HAS_TRITON else ())
    }
    paths["weights"] = lambda g: (
        gpa_attention_weights(q, k, g, causal=True, key_padding_mask=padding, bivector=False) @ v
    )
    for name, path in paths.items():
        out = path(gamma)
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        assert_grads_close(out, paths["naive"](gamma), (q, k, v), rtol=1e-4, atol=1e-5)
        assert torch.equal(path(gamma.detach() + 5.0), out)  # gamma is not part of the function


@pytest.mark.parametrize("bivector", [True, False], ids=["bivector", "scalar"])
def test_no_query_rows_give_an_empty_output_on_every_path(bivector):
    """Lq = 0 against a cache of keys (causal, so the scalar path builds its own mask): [B, H, 0, D], no error."""
    q, k, v, gamma = (t.detach() for t in make_inputs(2, 2, 0, 5, 1, dtype=torch.float32))
    for name in ("auto", "naive", "chunk"):
        out = geometric_product_attention(q, k, v, gamma, causal=True, bivector=bivector, kernel=name)
        assert out.shape == (2, 2, 0, 32), name


def test_auto_kernel_on_cpu_is_the_chunk_kernel():
    q, k, v, gamma = (t.detach() for t in make_inputs(1, 2, 9, 9, 1, dtype=torch.float32))
    auto = geometric_product_attention(q, k, v, gamma, causal=True)
    assert torch.equal(auto, gpa_chunk(q, k, v, gamma, causal=True))


# ---------------------------------------------------------------- bf16 / autocast


@pytest.mark.parametrize("kernel", ["naive", "chunk"])
def test_bf16_inputs_within_bound_of_fp32(kernel):
    """bf16 in, bf16 out; computed in fp32. Against fp32 on the same rounded inputs the only error is the
    output rounding (<= 2^-8 relative); against the unrounded fp32 inputs, input rounding adds <= 1e-2."""
    q, k, v, gamma = (t.detach() for t in make_inputs(2, 2, 24, 24, 2, dtype=torch.float32))
    low = [t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v)]
    rounded = [t.detach().float().requires_grad_(True) for t in low]
    out = geometric_product_attention(*low, gamma, causal=True, kernel=kernel)
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out.float()).all())
    want = geometric_product_attention(*rounded, gamma, causal=True, kernel=kernel)
    scale = float(want.detach().abs().max())
    assert float((out.float() - want).abs().max().detach()) <= 2**-8 * scale
    grad_out = torch.randn_like(want)
    got_grads = torch.autograd.grad(out, low, grad_out.to(torch.bfloat16))
    want_grads = torch.autograd.grad(want, rounded, grad_out.to(torch.bfloat16).float())
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == torch.bfloat16
        assert float((g.float() - w).abs().max()) <= 2**-7 * float(w.abs().max())
    exact = geometric_product_attention(q, k, v, gamma, causal=True, kernel=kernel)
    assert float((out.float() - exact).abs().max().detach()) <= 1e-2 * scale


@pytest.mark.parametrize("kernel", ["naive", "chunk", "auto"])
def test_autocast_does_not_change_the_computation(kernel):
    """Under bf16 autocast the op still computes in fp32: the same bits as without autocast."""
    q, k, v, gamma = (t.detach() for t in make_inputs(1, 2, 10, 10, 1, dtype=torch.float32))
    bivector = kernel != "auto"
    plain = geometric_product_attention(q, k, v, gamma, causal=True, kernel=kernel, bivector=bivector)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = geometric_product_attention(q, k, v, gamma, causal=True, kernel=kernel, bivector=bivector)
    assert mixed.dtype == torch.float32
    assert torch.equal(mixed, plain)


# ---------------------------------------------------------------- bad input


def test_bad_kernel_and_shapes_raise_value_errors():
    q, k, v, gamma = (t.detach() for t in make_inputs(2, 2, 4, 6, 1, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"`kernel`='flash' is not a GPA kernel.*'naive', 'chunk', 'triton'"):
        geometric_product_attention(q, k, v, gamma, causal=True, kernel="flash")
    assert GPA_KERNELS == ("naive", "chunk", "triton")
    bad = {
        "head dim": dict(query=q[..., :20], key=k[..., :20], value=v[..., :20]),
        "Lq <= Lk": dict(query=k, key=q, value=q),
        "value must": dict(value=v[:, :, :3]),
        "gamma must": dict(gamma=gamma[:1]),
        "key_padding_mask must be": dict(key_padding_mask=torch.ones(2, 5, dtype=torch.bool)),
        "only 0/1": dict(key_padding_mask=torch.full((2, 6), 2)),
        "share one floating dtype": dict(key=k.double()),
        "query \\[B, H, Lq, D\\]": dict(query=q[0]),
        "scaling": dict(scaling=-1.0),
        "eps": dict(eps=0.0),
        "document_ids must be": dict(document_ids=torch.zeros(2, 5, dtype=torch.long)),
    }
    for message, change in bad.items():
        args = dict(query=q, key=k, value=v, gamma=gamma, causal=True) | change
        for kernel in ("naive", "chunk"):
            with pytest.raises(ValueError, match=message):
                geometric_product_attention(**args, kernel=kernel)


def test_triton_where_it_cannot_run_is_refused_by_name(monkeypatch):
    # a CPU tensor without the interpreter, or float64, gets the op's message naming kernel='chunk' (not Triton's
    # own "0 active drivers" from inside the launch); "auto" never picks it there
    q, k, v, gamma = (t.detach() for t in make_inputs(1, 2, 4, 4, 1, dtype=torch.float32))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="GPA.*kernel='chunk'"):
        geometric_product_attention(q, k, v, gamma, causal=True, kernel="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if HAS_TRITON:
        with pytest.raises(ValueError, match="GPA Triton kernel takes.*float64"):
            geometric_product_attention(
                q.double(), k.double(), v.double(), gamma.double(), causal=True, kernel="triton"
            )


# ---------------------------------------------------------------- Triton (interpreter on CPU: fp32 / fp16)


@needs_triton
@pytest.mark.parametrize("case", TRITON_GRID, ids=grid_id)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_triton_equals_naive_fp32(case, causal):
    q, k, v, gamma = make_inputs(*case, dtype=torch.float32, seed=case[2])
    want = gpa_naive(q, k, v, gamma, causal=causal)
    got = gpa_triton(q, k, v, gamma, causal=causal)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert_grads_close(got, want, (q, k, v, gamma), rtol=1e-3, atol=1e-4)


@needs_triton
@pytest.mark.parametrize(
    "q_len,k_len,causal,left,right",
    [
        (18, 18, True, (17, 0), (0, 3)),  # left padding longer than a key block (empty rows), right padding
        (1, 18, False, (18, 3), (0, 0)),  # decoding over a padded cache; a sequence that is all padding
    ],
)
def test_triton_key_padding_equals_naive(q_len, k_len, causal, left, right):
    q, k, v, gamma = make_inputs(2, 1, q_len, k_len, 1, dtype=torch.float32, seed=k_len + q_len)
    padding = make_padding(2, k_len, left=left, right=right)
    want = gpa_naive(q, k, v, gamma, causal=causal, key_padding_mask=padding)
    got = gpa_triton(q, k, v, gamma, causal=causal, key_padding_mask=padding)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert_grads_close(got, want, (q, k, v, gamma), rtol=1e-3, atol=1e-4)


@needs_triton
def test_triton_equals_naive_fp16():
    q, k, v, gamma = make_inputs(1, 1, 12, 12, 1, dtype=torch.float16, seed=3)
    want = gpa_naive(q, k, v, gamma, causal=True)
    got = gpa_triton(q, k, v, gamma, causal=True)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    grad_out = torch.randn_like(want)
    for g, w in zip(
        torch.autograd.grad(got, (q, k, v, gamma), grad_out), torch.autograd.grad(want, (q, k, v, gamma), grad_out)
    ):
        assert float((g.float() - w.float()).abs().max()) < 3e-2 * max(float(w.abs().max()), 1.0)


@pytest.mark.gpu
def test_triton_on_gpu_bf16_and_long():
    q, k, v, gamma = (t.detach().cuda() for t in make_inputs(2, 2, 1000, 1000, 2, dtype=torch.float32))
    gamma.requires_grad_(True)
    for dtype, tol in ((torch.float32, 1e-3), (torch.bfloat16, 5e-2)):
        qq, kk, vv = (t.to(dtype).requires_grad_(True) for t in (q, k, v))
        want = gpa_naive(qq, kk, vv, gamma, causal=True)
        got = gpa_triton(qq, kk, vv, gamma, causal=True)
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
        grad_out = torch.randn_like(got)
        for g, w in zip(
            torch.autograd.grad(got, (qq, kk, vv, gamma), grad_out),
            torch.autograd.grad(want, (qq, kk, vv, gamma), grad_out),
        ):
            assert float((g.float() - w.float()).abs().max()) < tol * 10 * max(1.0, float(w.abs().max()))
