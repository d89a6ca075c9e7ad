"""PCT attention ops, every kernel through the one entry `pct_attention`: naive vs a complex float64 formula,
panel, decode and Triton (interpreter) vs naive on one grid, the dispatch, bf16 autocast, and ComplexLinear's
fast paths (plain and under PEFT LoRA)."""

import functools
import math
import subprocess
import sys

import pytest
import torch
from conftest import assert_close_eps

from zpx_hf import ops_pct, ops_pct_panel
from zpx_hf.modeling_complex import GAUSS_MIN_ROWS, ComplexLinear, complex_linear
from zpx_hf.ops_pct import HAS_TRITON, PCT_KERNELS, pct_attention, pct_attention_weights, resolve_kernel

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

# (B, H, Lq, Lk, D): D is the real head dim 2d; Lq < Lk = queries after a KV cache
GRID = [(1, 1, 1, 1, 2), (2, 3, 37, 37, 8), (2, 2, 5, 40, 6), (1, 2, 1, 33, 16), (2, 2, 50, 50, 16)]
GRID_IDS = [f"B{b}-H{h}-Lq{lq}-Lk{lk}-D{d}" for b, h, lq, lk, d in GRID]
MODES = {"causal": (True, False), "causal-padded": (True, True), "bidirectional-padded": (False, True)}
NAMES = ("out", "dq", "dk", "dv", "dtau", "dbias")


def kernel(name):
    """`pct_attention` with `kernel=name` (every kernel is reached through the entry)."""
    return functools.partial(pct_attention, kernel=name)


pct_attention_naive = kernel("naive")
pct_attention_panel = kernel("panel")
pct_attention_triton = kernel("triton")


def make_inputs(shape, padded, dtype=torch.float64, seed=0):
    """Unit-norm q, k (as the model feeds them), random v, per-head tau and bias, a padding mask, dO."""
    batch, heads, l_q, l_k, dim = shape
    generator = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(
        torch.randn(batch, heads, l_q, dim, generator=generator, dtype=torch.float64), dim=-1
    )
    k = torch.nn.functional.normalize(
        torch.randn(batch, heads, l_k, dim, generator=generator, dtype=torch.float64), dim=-1
    )
    v = torch.randn(batch, heads, l_k, dim, generator=generator, dtype=torch.float64)
    tau = torch.rand(heads, generator=generator, dtype=torch.float64) * 4 + 2
    bias = -torch.rand(heads, generator=generator, dtype=torch.float64) * 3
    param_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # tau, bias are parameters
    inputs = tuple(t.to(dtype).requires_grad_() for t in (q, k, v)) + tuple(
        t.to(param_dtype).requires_grad_() for t in (tau, bias)
    )
    mask = None
    if padded:
        mask = torch.ones(batch, l_k, dtype=torch.bool)
        mask[0, : max(1, l_k // 4)] = False  # left padding
        mask[-1, l_k - l_k // 3 :] = False  # right padding
    grad = torch.randn(batch, heads, l_q, dim, generator=generator, dtype=torch.float64).to(dtype)
    return inputs, mask, grad


def run(fn, inputs, mask, grad, causal):
    """[out, dq, dk, dv, dtau, dbias] in float64."""
    out = fn(*inputs, causal=causal, key_padding_mask=mask)
    grads = torch.autograd.grad((out.double() * grad.double()).sum(), inputs)
    return [out.detach().double()] + [g.double() for g in grads]


def assert_close_scaled(actual, expected, tol):
    """max |a - e| <= tol * max(|e|, 1), per output and gradient."""
    for name, a, e in zip(NAMES, actual, expected):
        err = ((a - e).abs().max() / e.abs().max().clamp(min=1.0)).item()
        assert err <= tol, f"{name}: scaled max error {err:.3e} > {tol:.1e}"


def complex_formula(q, k, v, tau, bias, causal, mask):
    """docs/design.md §4.1 in complex128: a_ij = sigmoid(tau Re sum_m q_im conj(k_jm) + b) on visible pairs."""
    d = q.shape[-1] // 2
    qc, kc, vc = (torch.complex(t[..., :d], t[..., d:]) for t in (q, k, v))
    score = tau[:, None, None] * torch.einsum("bhim,bhjm->bhij", qc, kc.conj()).real + bias[:, None, None]
    l_q, l_k = q.shape[2], k.shape[2]
    visible = torch.tensor([[(not causal) or j <= i + l_k - l_q for j in range(l_k)] for i in range(l_q)])
    visible = visible[None, None] & (mask[:, None, None, :] if mask is not None else True)
    gate = torch.where(visible, torch.sigmoid(score), torch.zeros_like(score))
    out = torch.einsum("bhij,bhjm->bhim", gate.to(torch.complex128), vc)
    return torch.cat((out.real, out.imag), dim=-1)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", GRID, ids=GRID_IDS)
def test_naive_matches_complex_float64_formula(shape, mode):
    causal, padded = MODES[mode]
    inputs, mask, grad = make_inputs(shape, padded)
    assert_close_scaled(
        run(pct_attention_naive, inputs, mask, grad, causal),
        run(
            lambda *a, causal, key_padding_mask: complex_formula(*a, causal, key_padding_mask),
            inputs,
            mask,
            grad,
            causal,
        ),
        1e-12,
    )


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", GRID, ids=GRID_IDS)
def test_panel_matches_naive_float64(shape, mode, monkeypatch):
    monkeypatch.setattr(ops_pct_panel, "PANEL_ROWS", 16)  # several panels at these lengths
    causal, padded = MODES[mode]
    inputs, mask, grad = make_inputs(shape, padded, seed=1)
    assert_close_scaled(
        run(pct_attention_panel, inputs, mask, grad, causal),
        run(pct_attention_naive, inputs, mask, grad, causal),
        1e-12,
    )


@pytest.mark.parametrize("numbers", [False, True], ids=["per-head", "python-numbers"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_decode_branch_matches_naive_float64(padded, numbers):
    """One query row (decoding): kernel `decode` (what "auto" runs for one row off CUDA) equals the
    reference, output and every gradient; Python-number tau and bias round to float32 as the reference's do."""
    inputs, mask, grad = make_inputs((2, 3, 1, 19, 8), padded, seed=3)
    q, k, v, tau, bias = inputs
    if numbers:
        tau, bias = 4.25, -1.9375  # exact in float32: the result cannot depend on how a path reads a number
        inputs = (q, k, v)

    def decode(q, k, v, *per_head, causal, key_padding_mask):
        assert ops_pct.resolve_kernel("auto", q) == "decode"
        return pct_attention(q, k, v, *(per_head or (tau, bias)), key_padding_mask=key_padding_mask, kernel="decode")

    def naive(q, k, v, *per_head, causal, key_padding_mask):
        return pct_attention_naive(
            q, k, v, *(per_head or (tau, bias)), causal=causal, key_padding_mask=key_padding_mask
        )

    expected = run(naive, inputs, mask, grad, True)
    assert_close_scaled(run(decode, inputs, mask, grad, True), expected, 1e-12)
    assert_close_scaled(run(naive, inputs, mask, grad, False), expected, 1e-15)  # one last query: causal = full
    if padded:  # padded keys (the first 19 // 4 of batch 0) get no value gradient: their gates are exactly 0
        assert not expected[3][0, :, : 19 // 4].any()


@pytest.mark.parametrize("default", [torch.float32, torch.float64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_branch_reads_python_numbers_as_the_reference(default, dtype):
    """A Python tau and bias mean what `prepare_inputs` makes of them, whatever the default dtype: the reference
    reads a number as a tensor of the default dtype, so the bound is that precision's (and the inputs')."""
    inputs, mask, _ = make_inputs((1, 2, 1, 9, 4), True, dtype=dtype, seed=4)
    q, k, v = (t.detach() for t in inputs[:3])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        for tau, bias in ((2.0**0.5 * 3, -math.log(7)), (3, -2)):
            expected = pct_attention_naive(q, k, v, tau, bias, key_padding_mask=mask)
            precision = default if torch.finfo(default).eps > torch.finfo(dtype).eps else dtype
            decoded = pct_attention(q, k, v, tau, bias, key_padding_mask=mask, kernel="decode")
            assert_close_eps(decoded, expected, ulps=64, dtype=precision)
    finally:
        torch.set_default_dtype(previous)


def test_panel_gradcheck_float64(monkeypatch):
    monkeypatch.setattr(ops_pct_panel, "PANEL_ROWS", 3)
    inputs, mask, _ = make_inputs((2, 1, 4, 7, 4), padded=True, seed=2)
    assert torch.autograd.gradcheck(lambda *a: pct_attention_panel(*a, key_padding_mask=mask), inputs)


def test_panel_computes_only_visible_panels(monkeypatch):
    """No pass holds more than PANEL_ROWS x Lk gates, and causal panels stop at their last visible key."""
    monkeypatch.setattr(ops_pct_panel, "PANEL_ROWS", 16)
    seen = []
    original = ops_pct_panel._panel_gates

    def spy(q_scaled, key, bias_bh, block, *args):
        start, end, lo, keys = block
        seen.append((end - start, keys - lo))
        return original(q_scaled, key, bias_bh, block, *args)

    monkeypatch.setattr(ops_pct_panel, "_panel_gates", spy)
    inputs, mask, grad = make_inputs((1, 2, 50, 70, 8), padded=True, seed=3)
    run(pct_attention_panel, inputs, mask, grad, True)
    # panels of rows [0,16) [16,32) [32,48) [48,50) see keys up to 36, 52, 68, 70; forward + backward
    assert seen == [(16, 36), (16, 52), (16, 68), (2, 70)] * 2


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "shape, mode",
    [
        ((2, 2, 37, 37, 16), "causal"),
        ((2, 2, 5, 40, 24), "causal-padded"),
        ((1, 2, 45, 45, 32), "bidirectional-padded"),
    ],
    ids=["B2-H2-Lq37-Lk37-D16", "B2-H2-Lq5-Lk40-D24", "B1-H2-Lq45-Lk45-D32"],
)
def test_triton_interpreter_matches_naive(shape, mode, dtype):
    causal, padded = MODES[mode]
    inputs, mask, grad = make_inputs(shape, padded, dtype=dtype, seed=4)
    expected = run(pct_attention_naive, tuple(t.detach().double().requires_grad_() for t in inputs), mask, grad, causal)
    # fp32: float32 accumulation over <= 45 terms; fp16: the kernel rounds gates and ds to fp16 before its GEMMs
    tol = 1e-5 if dtype == torch.float32 else 8 * torch.finfo(torch.float16).eps
    assert_close_scaled(run(pct_attention_triton, inputs, mask, grad, causal), expected, tol)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # huge scores on hidden keys
@pytest.mark.parametrize("kernel", PCT_KERNELS)
def test_masked_pairs_contribute_exactly_zero(kernel):
    if kernel == "triton" and not HAS_TRITON:
        pytest.skip("triton is not installed")
    inputs, mask, _ = make_inputs((2, 1, 40, 40, 16), padded=True, dtype=torch.float32)
    q, k, v, tau, bias = (t.detach() for t in inputs)
    if kernel == "decode":  # one query row
        q = q[:, :, -1:]
    out = pct_attention(q, k, v, tau, bias, key_padding_mask=mask, kernel=kernel)
    k2, v2 = k.clone(), v.clone()
    hidden = ~mask[:, None, :, None].expand_as(k)
    k2[hidden], v2[hidden] = 1e4, -1e6
    assert torch.equal(pct_attention(q, k2, v2, tau, bias, key_padding_mask=mask, kernel=kernel), out)


def test_weights_are_the_naive_gates():
    inputs, mask, _ = make_inputs((2, 2, 9, 12, 16), padded=True)
    q, k, v, tau, bias = (t.detach() for t in inputs)
    gates = pct_attention_weights(q, k, tau, bias, causal=True, key_padding_mask=mask)
    assert gates.shape == (2, 2, 9, 12) and (gates[~mask[:, None, None, :].expand_as(gates)] == 0).all()
    assert_close_eps(gates @ v, pct_attention_naive(q, k, v, tau, bias, key_padding_mask=mask), ulps=64)


def test_dispatch_auto_is_panel_on_cpu_and_unknown_kernel_fails():
    inputs, _, _ = make_inputs((1, 2, 4, 6, 8), padded=False)
    assert PCT_KERNELS == ("naive", "panel", "triton", "decode")
    assert resolve_kernel("auto", inputs[0]) == "panel"
    assert resolve_kernel("auto", inputs[0][:, :, -1:]) == "decode"  # one row: the decoding step, same entry
    for name in ("naive", "panel"):
        assert resolve_kernel(name, inputs[0]) == name
        expected = pct_attention_naive(*inputs)
        assert_close_eps(pct_attention(*inputs, kernel=name), expected, ulps=64)
    for old in ("tiled", "cpu"):  # the earlier names still work
        with pytest.warns(FutureWarning, match=f"'{old}' is now called 'panel'"):
            got = pct_attention(*inputs, kernel=old)
        torch.testing.assert_close(got, pct_attention_panel(*inputs), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"`kernel`='flash'.*'naive', 'panel', 'triton', 'decode'"):
        pct_attention(*inputs, kernel="flash")
    with pytest.raises(ValueError, match="'decode' takes one query row"):
        pct_attention(*inputs, kernel="decode")


def test_bad_inputs_name_the_argument():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="key_padding_mask"):
        pct_attention(q, q, q, 1.0, 0.0, key_padding_mask=torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="`tau` is per-head"):
        pct_attention(q, q, q, torch.ones(3), 0.0)
    with pytest.raises(ValueError, match="`query` has more positions"):
        pct_attention(q, q[:, :, :2], q[:, :, :2], 1.0, 0.0)
    with pytest.raises(ValueError, match="`value`"):
        pct_attention(q, q, q[..., :4], 1.0, 0.0)


@pytest.mark.parametrize("kernel", ["naive", "panel"])
def test_bf16_autocast_stays_within_bound_of_fp32(kernel):
    """Under CPU bf16 autocast with bf16 q, k, v (what autocast linears give) the gates are computed in
    float32: out and every gradient differ from fp32 by the bf16 rounding of the inputs only, bounded here
    by 2 bf16 eps (1.6e-2) of each tensor's scale."""
    inputs, mask, grad = make_inputs((2, 2, 50, 50, 16), padded=True, dtype=torch.float32, seed=5)
    expected = run(pct_attention_naive, inputs, mask, grad, True)
    low = tuple(t.detach().to(torch.bfloat16).requires_grad_() for t in inputs[:3]) + inputs[3:]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual = run(lambda *a, **kw: pct_attention(*a, **kw, kernel=kernel), low, mask, grad, True)
        assert pct_attention(*low, kernel=kernel).dtype == torch.bfloat16
    assert_close_scaled(actual, expected, 2 * torch.finfo(torch.bfloat16).eps)


def test_ops_module_imports_and_runs_without_triton():
    script = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from zpx_hf import ops_pct\n"
        "assert not ops_pct.HAS_TRITON\n"
        "q = torch.randn(1, 1, 3, 4)\n"
        "out = ops_pct.pct_attention(q, q, q, 1.0, 0.0)\n"
        "try:\n"
        "    ops_pct.pct_attention(q, q, q, 1.0, 0.0, kernel='triton')\n"
        "except RuntimeError as error:\n"
        "    assert 'triton' in str(error)\n"
        "else:\n"
        "    raise SystemExit('expected an error')\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 257, 1000])
def test_triton_cuda_half_precision(dtype, length):
    inputs, mask, grad = make_inputs((2, 4, length, length, 128), padded=True, dtype=dtype)
    inputs = tuple(t.detach().cuda().requires_grad_() for t in inputs)
    mask, grad = mask.cuda(), grad.cuda()
    expected = run(pct_attention_panel, tuple(t.detach().float().requires_grad_() for t in inputs), mask, grad, True)
    assert_close_scaled(run(pct_attention, inputs, mask, grad, True), expected, 2e-2)


# ComplexLinear: Gauss's three GEMMs (many rows), the stacked-row GEMM (few rows) and the block weight (autocast,
# half precision) vs the two-GEMM definition through the sub-modules


def complex_linear_formula(linear, z):
    """W z + c with W = A + iB, c = (a - b) + i(a + b), in complex128."""
    n = z.shape[-1] // 2
    weight = torch.complex(linear.real.weight.double(), linear.imag.weight.double())
    out = torch.complex(z[..., :n].double(), z[..., n:].double()) @ weight.T
    if linear.real.bias is not None:
        a, b = linear.real.bias.double(), linear.imag.bias.double()
        out = out + torch.complex(a - b, a + b)
    return torch.cat((out.real, out.imag), dim=-1)


def fast_path_only(linear, z):
    """linear(z) with the sub-module path shadowed by None, so taking it raises."""
    linear.forward_submodules = None
    try:
        return linear(z)
    finally:
        del linear.forward_submodules


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [3, GAUSS_MIN_ROWS + 1], ids=["stacked", "gauss"])
def test_complex_linear_paths_equal_two_gemm_float64(bias, rows):
    torch.manual_seed(0)
    linear = ComplexLinear(6, 5, bias=bias).double()
    if bias:
        torch.nn.init.normal_(linear.real.bias)
        torch.nn.init.normal_(linear.imag.bias)
    z = torch.randn(rows, 12, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(rows, 10, dtype=torch.float64)
    results = []
    for fn in (lambda z: fast_path_only(linear, z), linear.forward_submodules):
        out = fn(z)
        results.append([out] + list(torch.autograd.grad((out * grad).sum(), [z, *linear.parameters()])))
    for one, two in zip(*results):
        torch.testing.assert_close(one, two, rtol=0, atol=1e-12)
    torch.testing.assert_close(results[0][0], complex_linear_formula(linear, z.detach()), rtol=0, atol=1e-12)
    with torch.no_grad():  # the no-grad path (a kept weight when stacked)
        torch.testing.assert_close(linear(z), results[0][0], rtol=0, atol=1e-12)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the block weight through autocast's F.linear
        low = linear.float()(z.float())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), results[0][0].detach(), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("rows", [2, GAUSS_MIN_ROWS], ids=["stacked", "gauss"])
def test_fused_complex_linear_equals_each_layer_float64(rows):
    """q, k, v as one map: [re_q re_k re_v | im_q im_k im_v], the same values and gradients as each layer."""
    torch.manual_seed(0)
    layers = tuple(ComplexLinear(6, width, bias=True).double() for width in (5, 3, 4))
    for layer in layers:
        for parameter in layer.parameters():
            torch.nn.init.normal_(parameter)
    z = torch.randn(1, rows, 12, dtype=torch.float64, requires_grad=True)
    parts = [layer.forward_submodules(z).unflatten(-1, (2, -1)) for layer in layers]
    expected = torch.cat(parts, dim=-1).flatten(-2)
    fused = complex_linear(z, layers)
    grad = torch.randn_like(expected)
    params = [z] + [p for layer in layers for p in layer.parameters()]
    for one, two in zip(
        (fused, *torch.autograd.grad((fused * grad).sum(), params)),
        (expected, *torch.autograd.grad((expected * grad).sum(), params)),
    ):
        torch.testing.assert_close(one, two, rtol=0, atol=1e-12)


def test_complex_linear_under_peft_lora_calls_the_adapters():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = ComplexLinear(6, 8, bias=True)
            self.second = ComplexLinear(8, 4)

        def forward(self, z):
            return self.second(self.first(z))

    base = Stack().double()
    z = torch.randn(GAUSS_MIN_ROWS + 5, 12, dtype=torch.float64)
    before = base(z)
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["real", "imag"], init_lora_weights=False)
    model = peft.get_peft_model(base, config)
    adapted = model(z)
    assert type(model.base_model.model.first.real) is not torch.nn.Linear  # wrapped: the sub-module path
    assert (adapted - before).abs().max() > 1e-3  # the adapters change the result
    merged = model.merge_and_unload()
    assert type(merged.first.real) is torch.nn.Linear  # plain again: the fast path
    torch.testing.assert_close(merged(z), adapted, rtol=0, atol=1e-12)
    torch.testing.assert_close(fast_path_only(merged.first, z), merged.first.forward_submodules(z), rtol=0, atol=1e-12)
    torch.testing.assert_close(merged.first(z), complex_linear_formula(merged.first, z), rtol=0, atol=1e-12)


def test_complex_linear_hooks_on_sub_modules_see_the_inputs():
    linear = ComplexLinear(4, 3)
    seen = []
    linear.real.register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    z = torch.randn(2, 8)
    torch.testing.assert_close(linear(z), linear.forward_submodules(z))
    # x and y separately, each of z's rank (what an nn.Linear sees): linear(z) (hooked, so through the
    # sub-modules) and forward_submodules(z) call `real` twice each
    assert seen == [(2, 4)] * 4


def test_complex_linear_inference_weight_follows_weight_changes():
    """Without gradients (few rows: the stacked [A; B]^T), in-place updates, `.data` writes (which leave no version
    trace, as PEFT's merge does) and new tensors must show."""
    torch.manual_seed(0)
    linear = ComplexLinear(4, 3, bias=True).double()
    z = torch.randn(2, 8, dtype=torch.float64)
    with torch.no_grad():
        assert_close_eps(linear(z), complex_linear_formula(linear, z), ulps=64)
        linear.imag.weight.add_(1.0)  # as an optimizer step does
        linear.real.bias.mul_(-2.0)
        assert_close_eps(linear(z), complex_linear_formula(linear, z), ulps=64)
        linear.real.weight.data.add_(0.5)
        linear.imag.bias.data.mul_(3.0)
        assert_close_eps(linear(z), complex_linear_formula(linear, z), ulps=64)
        linear.real.weight = torch.nn.Parameter(torch.randn(3, 4, dtype=torch.float64))
        assert_close_eps(linear(z), complex_linear_formula(linear, z), ulps=64)
        linear.float()
        torch.testing.assert_close(linear(z.float()).double(), complex_linear_formula(linear, z), rtol=0, atol=1e-5)


def test_complex_rms_norm_inference_gain_follows_weight_changes():
    """Without gradients, in-place updates, `.data` writes and new tensors of the gain's weight must show."""
    from zpx_hf.modeling_complex import ComplexRMSNorm

    def formula(norm, z):  # w z / sqrt(mean_m |z_m|^2 + eps) with complex128
        c = torch.complex(z[..., :3], z[..., 3:])
        out = norm.weight.double() * c / torch.sqrt((c.abs() ** 2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return torch.cat((out.real, out.imag), dim=-1)

    torch.manual_seed(0)
    norm = ComplexRMSNorm(3).double()
    z = torch.randn(4, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.nn.init.normal_(norm.weight)
        assert_close_eps(norm(z), formula(norm, z), ulps=64)
        norm.weight.mul_(-3.0)  # as an optimizer step does
        assert_close_eps(norm(z), formula(norm, z), ulps=64)
        norm.weight.data.add_(0.25)  # no version bump
        assert_close_eps(norm(z), formula(norm, z), ulps=64)
        norm.weight = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
        assert_close_eps(norm(z), formula(norm, z), ulps=64)
    assert_close_eps(norm(z), formula(norm, z), ulps=64)  # with gradients
