"""PCT sigmoid attention ops: chunked reference and Triton kernel (interpreter on CPU) vs float64 formula."""

import subprocess
import sys

import pytest
import torch

from zpx_hf import ops_pct
from zpx_hf.ops_pct import (
    HAS_TRITON,
    pct_attention,
    pct_attention_reference,
    pct_attention_triton,
    pct_attention_weights,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def direct_float64(q, k, v, tau, bias, key_padding_mask, causal):
    """out_i = sum_j sigmoid(tau q_i.k_j + b) v_j over visible j, written out in float64."""
    q, k, v = q.double(), k.double(), v.double()
    l_q, l_k = q.shape[2], k.shape[2]
    scores = tau.double()[:, None, None] * torch.einsum("bhid,bhjd->bhij", q, k) + bias.double()[:, None, None]
    visible = torch.ones(l_q, l_k, dtype=torch.bool)
    if causal:
        visible = torch.arange(l_k)[None, :] <= torch.arange(l_q)[:, None] + (l_k - l_q)
    visible = visible[None, None]
    if key_padding_mask is not None:
        visible = visible & key_padding_mask[:, None, None, :]
    gates = torch.where(visible, torch.sigmoid(scores), torch.zeros_like(scores))
    return torch.einsum("bhij,bhjd->bhid", gates, v)


def make_inputs(batch, heads, l_q, l_k, dim, padded, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(dtype).requires_grad_()

    # unit-norm q, k as the model feeds them (after the complex L2 norm)
    q = torch.nn.functional.normalize(torch.randn(batch, heads, l_q, dim, generator=generator), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(batch, heads, l_k, dim, generator=generator), dim=-1)
    q, k = q.to(dtype).requires_grad_(), k.to(dtype).requires_grad_()
    v = rand(batch, heads, l_k, dim)
    tau = (torch.rand(heads, generator=generator) * 4 + 2).requires_grad_()
    bias = (-torch.rand(heads, generator=generator) * 3).requires_grad_()
    mask = None
    if padded:
        mask = torch.ones(batch, l_k, dtype=torch.bool)
        mask[0, : max(1, l_k // 4)] = False  # left padding
        mask[-1, l_k - l_k // 3 :] = False  # right padding
    grad = torch.randn(batch, heads, l_q, dim, generator=generator).to(dtype)
    return (q, k, v, tau, bias), mask, grad


def run(fn, inputs, mask, grad, causal):
    out = fn(*inputs, key_padding_mask=mask, causal=causal)
    grads = torch.autograd.grad((out.float() * grad.float()).sum(), inputs)
    return [out.double()] + [g.double() for g in grads]


def assert_all_close(actual, expected, atol, rtol, names=("out", "dq", "dk", "dv", "dtau", "dbias")):
    for name, a, e in zip(names, actual, expected):
        scale = e.abs().max().clamp(min=1.0)
        err = (a - e).abs().max() / scale
        assert err <= atol + rtol, f"{name}: relative max error {err:.3e}"


@pytest.mark.parametrize("length", [1, 63, 130])
@pytest.mark.parametrize("dim", [16, 32, 64])
@pytest.mark.parametrize("padded", [False, True])
def test_reference_matches_float64_formula(length, dim, padded):
    inputs, mask, grad = make_inputs(2, 2, length, length, dim, padded)
    expected = run(direct_float64, inputs, mask, grad, True)
    actual = run(lambda *a, **kw: pct_attention_reference(*a, **kw, block_size=32), inputs, mask, grad, True)
    assert_all_close(actual, expected, atol=2e-6, rtol=0)


@needs_triton
@pytest.mark.parametrize("length", [1, 63, 130])
@pytest.mark.parametrize("dim", [16, 32, 64])
@pytest.mark.parametrize("padded", [False, True])
def test_triton_matches_reference_fp32(length, dim, padded):
    batch, heads = (2, 1) if padded else (1, 2)
    inputs, mask, grad = make_inputs(batch, heads, length, length, dim, padded, seed=length + dim)
    reference = run(pct_attention_reference, inputs, mask, grad, True)
    triton_out = run(pct_attention_triton, inputs, mask, grad, True)
    assert_all_close(triton_out, reference, atol=1e-5, rtol=0)
    assert_all_close(triton_out, run(direct_float64, inputs, mask, grad, True), atol=1e-5, rtol=0)


@needs_triton
@pytest.mark.parametrize(
    "l_q, l_k, dim, causal, padded",
    [
        (1, 67, 32, True, True),  # one decode step against a cache
        (17, 80, 48, True, False),  # chunked prefill, head dim not a power of two
        (45, 45, 24, False, True),  # bidirectional encoder
    ],
)
def test_triton_rectangular_and_bidirectional(l_q, l_k, dim, causal, padded):
    inputs, mask, grad = make_inputs(2, 2, l_q, l_k, dim, padded, seed=7)
    expected = run(direct_float64, inputs, mask, grad, causal)
    assert_all_close(run(pct_attention_triton, inputs, mask, grad, causal), expected, atol=1e-5, rtol=0)
    assert_all_close(run(pct_attention_reference, inputs, mask, grad, causal), expected, atol=1e-5, rtol=0)


@needs_triton
@pytest.mark.parametrize("length, padded", [(63, False), (130, True)])
def test_triton_matches_reference_fp16(length, padded):
    inputs, mask, grad = make_inputs(1, 2, length, length, 32, padded, dtype=torch.float16, seed=3)
    reference = run(pct_attention_reference, inputs, mask, grad, True)
    triton_out = run(pct_attention_triton, inputs, mask, grad, True)
    assert triton_out[0].dtype == torch.float64  # (run() upcasts for comparison)
    assert_all_close(triton_out, reference, atol=0, rtol=4e-3)


def test_reference_gradcheck_float64():
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    q, k, v = rand(1, 2, 5, 6), rand(1, 2, 9, 6), rand(1, 2, 9, 6)
    tau, bias = rand(2), rand(2)
    mask = torch.ones(1, 9, dtype=torch.bool)
    mask[0, 3] = False

    def fn(*args):
        return pct_attention_reference(*args, key_padding_mask=mask, causal=True, block_size=4)

    assert torch.autograd.gradcheck(fn, (q, k, v, tau, bias))


def test_reference_never_materialises_full_score_matrix(monkeypatch):
    seen = []
    original = ops_pct._tile_gates

    def spy(q, k, tau, bias, mask):
        seen.append((q.shape[2], k.shape[2]))
        return original(q, k, tau, bias, mask)

    monkeypatch.setattr(ops_pct, "_tile_gates", spy)
    inputs, mask, grad = make_inputs(1, 2, 130, 130, 16, True)
    run(lambda *a, **kw: pct_attention_reference(*a, **kw, block_size=32), inputs, mask, grad, True)
    assert seen and max(m * n for m, n in seen) <= 32 * 32
    # causal: tiles strictly above the diagonal are skipped (5 x 5 tiles -> 15 visited, forward + backward)
    assert len(seen) == 2 * 15


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # masked huge scores
def test_masked_pairs_contribute_exactly_zero():
    inputs, mask, _ = make_inputs(2, 1, 40, 40, 16, True)
    q, k, v, tau, bias = (t.detach() for t in inputs)
    out = pct_attention_reference(q, k, v, tau, bias, key_padding_mask=mask)
    k2, v2 = k.clone(), v.clone()
    hidden = ~mask[:, None, :, None].expand_as(k)
    k2[hidden] = 1e4
    v2[hidden] = -1e6
    assert torch.equal(pct_attention_reference(q, k2, v2, tau, bias, key_padding_mask=mask), out)
    if HAS_TRITON:
        expected = pct_attention_triton(q, k, v, tau, bias, key_padding_mask=mask)
        assert torch.equal(pct_attention_triton(q, k2, v2, tau, bias, key_padding_mask=mask), expected)


def test_weights_helper_matches_formula_and_output():
    inputs, mask, _ = make_inputs(2, 2, 9, 12, 16, True)
    q, k, v, tau, bias = (t.detach() for t in inputs)
    gates = pct_attention_weights(q, k, tau, bias, key_padding_mask=mask, causal=True)
    torch.testing.assert_close(gates @ v, pct_attention_reference(q, k, v, tau, bias, mask, True))


def test_dispatch_picks_reference_on_cpu_and_rejects_unknown(monkeypatch):
    inputs, _, _ = make_inputs(1, 1, 4, 4, 8, False)
    calls = []
    monkeypatch.setattr(ops_pct, "pct_attention_reference", lambda *a, **kw: calls.append("reference"))
    pct_attention(*inputs)
    assert calls == ["reference"]
    with pytest.raises(ValueError, match="attention_kernel"):
        pct_attention(*inputs, implementation="flash")


def test_shape_errors_name_the_argument():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="key_padding_mask"):
        pct_attention_reference(q, q, q, 1.0, 0.0, key_padding_mask=torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="per-head"):
        pct_attention_reference(q, q, q, torch.ones(3), 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 257, 1000])
def test_triton_cuda_half_precision(dtype, length):
    inputs, mask, grad = make_inputs(2, 4, length, length, 128, True, dtype=dtype)
    inputs = tuple(t.detach().cuda().requires_grad_() for t in inputs)
    mask, grad = mask.cuda(), grad.cuda()
    reference = run(pct_attention_reference, inputs, mask, grad, True)
    assert_all_close(run(pct_attention, inputs, mask, grad, True), reference, atol=0, rtol=2e-2)


def test_ops_module_imports_and_runs_without_triton():
    script = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from zpx_hf import ops_pct\n"
        "assert not ops_pct.HAS_TRITON\n"
        "q = torch.randn(1, 1, 3, 4)\n"
        "out = ops_pct.pct_attention(q, q, q, 1.0, 0.0)\n"
        "try:\n"
        "    ops_pct.pct_attention(q, q, q, 1.0, 0.0, implementation='triton')\n"
        "except RuntimeError as error:\n"
        "    assert 'triton' in str(error)\n"
        "else:\n"
        "    raise SystemExit('expected an error')\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
