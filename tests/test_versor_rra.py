"""Recursive rotor accumulator: the sequential reference against a float64 multivector formula, and every fast
path (scan, the recurrent decode step, Triton under the interpreter) against the reference: forward, state and
all gradients."""

import pytest
import torch

from zpx_hf.clifford_algebra import (
    BOOST_INDICES,
    ROTATION_INDICES,
    conformal_algebra,
    rotor_exp,
    rotor_norm_error,
    to_matrix,
)
from zpx_hf.ops_rra import (
    HAS_TRITON,
    RRA_ACCUMULATE,
    recursive_rotor_accumulator,
    resolve_rra_kernel,
    rotor_trajectory,
)
from zpx_hf.ops_rra_decode import rra_step

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
# (B, L, H, C): single token, odd sizes, and L > 64 (crosses the reference's re-projection step)
GRID = [(1, 1, 1, 1), (2, 7, 3, 2), (1, 33, 2, 3), (2, 70, 1, 1)]
GRID_IDS = [f"B{b}-L{l}-H{h}-C{c}" for b, l, h, c in GRID]


def _inputs(batch, length, heads, channels, accumulate, dtype=torch.float64, seed=0, with_initial=True):
    """Model-like bivectors (s tanh(.) with s = 1; boosts kept small when they accumulate), values, an initial
    rotor with every rotor component (rotations and boosts)."""
    generator = torch.Generator().manual_seed(seed)
    bivectors = torch.tanh(torch.randn(batch, length, heads, 10, generator=generator, dtype=torch.float64))
    if accumulate == "full":  # a product of boosts grows without bound: keep |R| modest over 70 steps
        bivectors[..., list(BOOST_INDICES)] *= 0.1
    value = torch.randn(batch, length, heads, channels, 32, generator=generator, dtype=torch.float64)
    initial = rotor_exp(0.4 * torch.randn(batch, heads, 10, generator=generator, dtype=torch.float64))
    leaves = [bivectors, value] + ([initial] if with_initial else [])
    return [x.to(dtype).requires_grad_(True) for x in leaves]


def _run(kernel, accumulate, bivectors, value, initial=None):
    out, state = recursive_rotor_accumulator(bivectors, value, accumulate=accumulate, initial=initial, kernel=kernel)
    return out, state


def _multivector_reference(bivectors, value, accumulate, initial):
    """y_t = T_t v_t ~T_t with Cayley-table products of rotor multivectors (float64, no matrices)."""
    algebra = conformal_algebra()
    gp = algebra.geometric_product
    rotation = torch.zeros(10, dtype=torch.float64)
    rotation[list(ROTATION_INDICES)] = 1
    accumulated = bivectors if accumulate == "full" else bivectors * rotation
    steps, boosts = rotor_exp(accumulated), rotor_exp(bivectors * (1 - rotation))
    state = initial
    outputs = []
    for t in range(bivectors.shape[1]):
        state = gp(state, steps[:, t])
        transform = state if accumulate == "full" else gp(state, boosts[:, t])
        transform = transform[:, :, None]  # over channels
        outputs.append(gp(gp(transform, value[:, t]), algebra.reverse(transform)))
    return torch.stack(outputs, 1), state


@pytest.mark.parametrize("accumulate", RRA_ACCUMULATE)
@pytest.mark.parametrize("shape", GRID, ids=GRID_IDS)
def test_naive_equals_float64_multivector_formula(shape, accumulate):
    bivectors, value, initial = (x.detach() for x in _inputs(*shape, accumulate))
    out, state = _run("naive", accumulate, bivectors, value, initial)
    expected, expected_state = _multivector_reference(bivectors, value, accumulate, initial)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10 * float(expected.abs().max()))
    torch.testing.assert_close(state, expected_state, rtol=1e-10, atol=1e-10)


def _forward_and_grads(kernel, accumulate, leaves, seed=1):
    out, state = _run(kernel, accumulate, *leaves)
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.device, out.dtype)
    state_weights = torch.randn(state.shape, generator=generator, dtype=torch.float64).to(state.device, state.dtype)
    loss = (out * weights).sum() + (state * state_weights).sum()
    return [out.detach(), state.detach(), *torch.autograd.grad(loss, leaves)]


def _assert_all_close(got, want, names, rel):
    for name, g, w in zip(names, got, want):
        scale = float(w.abs().max())
        assert float((g - w).abs().max()) <= rel * scale, (name, float((g - w).abs().max()), scale)


NAMES = ("output", "state", "d bivectors", "d value", "d initial")


@pytest.mark.parametrize("with_initial", [False, True], ids=["from-1", "from-state"])
@pytest.mark.parametrize("accumulate", RRA_ACCUMULATE)
@pytest.mark.parametrize("shape", GRID, ids=GRID_IDS)
@pytest.mark.parametrize("kernel", ["scan", "decode"])
def test_fast_paths_equal_naive_float64(kernel, shape, accumulate, with_initial):
    # "decode" is the decode step (ops_rra_decode) in a loop; "auto" picks it for one token
    leaves = _inputs(*shape, accumulate, with_initial=with_initial)
    got = _forward_and_grads(kernel, accumulate, leaves)
    want = _forward_and_grads("naive", accumulate, leaves)
    _assert_all_close(got, want, NAMES, rel=1e-10)


@pytest.mark.parametrize("accumulate", RRA_ACCUMULATE)
def test_auto_runs_the_step_for_one_token_and_the_scan_otherwise(accumulate, monkeypatch):
    from zpx_hf import ops_rra_decode

    calls = []
    monkeypatch.setattr(ops_rra_decode, "rra_step", lambda *a: calls.append("step") or rra_step(*a))
    leaves = _inputs(2, 1, 3, 2, accumulate)
    got = _forward_and_grads("auto", accumulate, leaves)
    assert calls == ["step"]
    _assert_all_close(got, _forward_and_grads("naive", accumulate, leaves), NAMES, rel=1e-10)
    _run("auto", accumulate, *_inputs(2, 5, 3, 2, accumulate))
    assert calls == ["step"]  # longer sequences: the scan


def test_step_keeps_the_state_on_the_group_over_many_tokens():
    # 4,096 decode steps in float32 (model-like bivectors): the per-step re-projection keeps R~R = 1
    generator = torch.Generator().manual_seed(0)
    state = None
    for _ in range(4096):
        bivectors = torch.tanh(torch.randn(1, 1, 2, 10, generator=generator))
        out, state = _run("auto", "compact", bivectors, torch.randn(1, 1, 2, 1, 32, generator=generator), state)
    assert torch.isfinite(out).all()
    assert float(rotor_norm_error(to_matrix(state)).max()) < 1e-5


@needs_triton
@pytest.mark.parametrize("accumulate", RRA_ACCUMULATE)
@pytest.mark.parametrize("shape", GRID[:3], ids=GRID_IDS[:3])
def test_triton_equals_naive(shape, accumulate):
    # the kernel runs in float32: compare with the reference in float64, within 10 L float32 eps of each
    # quantity's largest entry (rounding accumulates along the sequence)
    leaves = _inputs(*shape, accumulate)
    want = _forward_and_grads("naive", accumulate, leaves)
    got = _forward_and_grads("triton", accumulate, [x.detach().float().requires_grad_(True) for x in leaves])
    rel = 10 * max(shape[1], 10) * torch.finfo(torch.float32).eps
    _assert_all_close([g.double() for g in got], want, NAMES, rel=rel)


@pytest.mark.parametrize("kernel", ["naive", "scan", "decode", "auto"])
@pytest.mark.parametrize("accumulate", RRA_ACCUMULATE)
def test_continuing_from_the_state_equals_one_call(kernel, accumulate):
    bivectors, value, initial = (x.detach() for x in _inputs(2, 23, 2, 2, accumulate))
    full, final = _run(kernel, accumulate, bivectors, value, initial)
    first, state = _run(kernel, accumulate, bivectors[:, :9], value[:, :9], initial)
    second, state = _run(kernel, accumulate, bivectors[:, 9:10], value[:, 9:10], state)  # one generated token
    third, state = _run(kernel, accumulate, bivectors[:, 10:], value[:, 10:], state)
    torch.testing.assert_close(torch.cat((first, second, third), 1), full, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(state, final, rtol=1e-11, atol=1e-11)


def test_trajectory_is_the_accumulated_rotor():
    algebra = conformal_algebra()
    bivectors, _, initial = (x.detach() for x in _inputs(2, 9, 3, 1, "full"))
    for accumulate in RRA_ACCUMULATE:
        trajectory = rotor_trajectory(bivectors, accumulate=accumulate, initial=initial)
        accumulated = bivectors.clone()
        if accumulate == "compact":
            accumulated[..., list(BOOST_INDICES)] = 0
        state = initial
        for t in range(bivectors.shape[1]):
            state = algebra.geometric_product(state, rotor_exp(accumulated[:, t]))
            torch.testing.assert_close(trajectory[:, t], state, rtol=1e-10, atol=1e-10)


def test_zero_bivectors_and_empty_sequences():
    value = torch.randn(2, 5, 3, 2, 32)
    for kernel in ("naive", "scan", "decode"):
        out, state = _run(kernel, "compact", torch.zeros(2, 5, 3, 10), value)
        torch.testing.assert_close(out, value, rtol=1e-6, atol=1e-6)
        assert torch.equal(state[..., 0], torch.ones(2, 3))
        empty, state = _run(kernel, "full", torch.zeros(2, 0, 3, 10), value[:, :0])
        assert empty.shape == (2, 0, 3, 2, 32) and state.shape == (2, 3, 32)


def test_16k_tokens_stay_on_the_group():
    # the model's bivectors (s tanh(.), s = 1) in float32; compact accumulates the rotations
    length = 16_384
    generator = torch.Generator().manual_seed(0)
    bivectors = torch.tanh(torch.randn(1, length, 2, 10, generator=generator))
    value = torch.randn(1, length, 2, 1, 32, generator=generator)
    out, state = _run("scan", "compact", bivectors, value)
    assert torch.isfinite(out).all()
    assert float(rotor_norm_error(to_matrix(state)).max()) < 1e-5
    trajectory = rotor_trajectory(bivectors)
    assert float(rotor_norm_error(to_matrix(trajectory[:, :: length // 16])).max()) < 1e-5


def test_float32_gradient_close_to_float64():
    # the same math in float32 and float64 (1,024 tokens): the fast path's rounding stays small
    leaves64 = _inputs(1, 1024, 2, 2, "compact")
    leaves32 = [x.detach().float().requires_grad_(True) for x in leaves64]
    want = _forward_and_grads("scan", "compact", leaves64)
    got = _forward_and_grads("scan", "compact", leaves32)
    _assert_all_close([g.double() for g in got], want, NAMES, rel=1e-4)


@pytest.mark.parametrize("mixed", ["autocast", "bf16-inputs"])
@pytest.mark.parametrize("accumulate", RRA_ACCUMULATE)
def test_bf16_runs_the_algebra_in_float32(mixed, accumulate):
    bivectors, value, initial = _inputs(2, 40, 2, 2, accumulate, dtype=torch.float32)
    ref_out, ref_state = _run("scan", accumulate, bivectors, value, initial)
    if mixed == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, state = _run("scan", accumulate, bivectors, value.bfloat16(), initial)
    else:
        out, state = _run("scan", accumulate, bivectors.bfloat16(), value.bfloat16(), initial)
    assert out.dtype == torch.bfloat16 and state.dtype == torch.float32
    # inputs rounded to bf16 (2^-8 relative) and the output rounded once: a few bf16 ulps of |y|, not drift
    bound = 4 * 2.0**-8 * float(ref_out.detach().abs().max())
    assert torch.isfinite(out).all() and float((out.float() - ref_out).detach().abs().max()) < bound
    grads = torch.autograd.grad(out.float().sum() + state.sum(), (bivectors, value, initial))
    assert all(torch.isfinite(g).all() for g in grads)
    assert float(rotor_norm_error(to_matrix(state.detach())).max()) < 1e-5


def test_bad_arguments_are_named():
    bivectors, value = torch.zeros(1, 3, 2, 10), torch.zeros(1, 3, 2, 1, 32)
    with pytest.raises(ValueError, match="`kernel`='fast' is not a RRA kernel.*'scan'"):
        recursive_rotor_accumulator(bivectors, value, kernel="fast")
    with pytest.raises(ValueError, match="accumulate='boosts'.*'compact'"):
        recursive_rotor_accumulator(bivectors, value, accumulate="boosts")
    with pytest.raises(ValueError, match="bivectors must be"):
        recursive_rotor_accumulator(bivectors[..., :6], value)
    with pytest.raises(ValueError, match="value must be"):
        recursive_rotor_accumulator(bivectors, value[:, :2])
    with pytest.raises(ValueError, match="initial must be"):
        recursive_rotor_accumulator(bivectors, value, initial=torch.zeros(1, 2, 2, 4, 4))


def test_triton_where_it_cannot_run_is_refused_and_auto_keeps_float64_exact(monkeypatch):
    bivectors, value = torch.zeros(1, 3, 2, 10), torch.zeros(1, 3, 2, 1, 32)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a CPU tensor: the op's message, not Triton's "0 active drivers"
    with pytest.raises(RuntimeError, match="RRA.*kernel='scan'"):
        recursive_rotor_accumulator(bivectors, value, kernel="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if HAS_TRITON:
        with pytest.raises(ValueError, match="computes in float32"):
            recursive_rotor_accumulator(bivectors, value.double(), kernel="triton")
    cuda = torch.device("cuda")  # resolution only: no CUDA tensor is made
    assert resolve_rra_kernel("auto", cuda, 12, torch.float64) == "scan"  # the Triton scan would refuse it
    assert resolve_rra_kernel("auto", cuda, 12, torch.float32) == ("triton" if HAS_TRITON else "scan")


@pytest.mark.gpu
def test_triton_on_gpu_16k_matches_scan():
    length = 16_384
    bivectors = torch.tanh(torch.randn(2, length, 4, 10, device="cuda")).requires_grad_(True)
    value = torch.randn(2, length, 4, 2, 32, device="cuda", requires_grad=True)
    got = _forward_and_grads("triton", "compact", [bivectors, value])
    want = _forward_and_grads("scan", "compact", [bivectors, value])
    assert float(rotor_norm_error(to_matrix(got[1])).max()) < 1e-5
    _assert_all_close(got, want, NAMES[:4], rel=1e-3)
