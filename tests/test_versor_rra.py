"""Recursive rotor accumulator: scans vs the sequential loop, long-scan stability, the full op."""

import pytest
import torch

from zpx_hf.clifford_algebra import (
    BIVECTOR_MASKS,
    bivector_to_multivector,
    conformal_algebra,
    from_matrix,
    rotor_exp,
    rotor_exp_matrix,
    rotor_norm_error,
)
from zpx_hf.ops_rra import (
    HAS_TRITON,
    recursive_rotor_accumulator,
    rotor_scan,
    rotor_scan_chunked,
    rotor_scan_sequential,
    rotor_scan_triton,
)

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
ROTATION = [i for i, m in enumerate(BIVECTOR_MASKS) if not m & 16]


def _rotors(num_seq, length, seed=0):
    # rotations of O(1) angle, small boosts (the full group, kept where float32 can represent the product)
    generator = torch.Generator().manual_seed(seed)
    scale = torch.full((10,), 0.05)
    scale[ROTATION] = 0.8
    bivectors = scale * torch.randn(num_seq, length, 10, generator=generator)
    initial = rotor_exp_matrix(0.3 * torch.randn(num_seq, 10, generator=generator))
    return rotor_exp_matrix(bivectors).requires_grad_(True), initial.requires_grad_(True)


def _check_scan(scan, length, chunk=None):
    rotors, initial = _rotors(5, length, seed=length)
    expected = rotor_scan_sequential(rotors, initial)
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (rotors, initial), grad_out)
    out = scan(rotors, initial) if chunk is None else scan(rotors, initial, chunk_size=chunk)
    grads = torch.autograd.grad(out, (rotors, initial), grad_out)
    scale = float(expected.detach().abs().max())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * scale)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@pytest.mark.parametrize("length,chunk", [(1, None), (23, None), (23, 4), (150, 7)])
def test_chunked_scan_equals_loop(length, chunk):
    _check_scan(rotor_scan_chunked, length, chunk)


@needs_triton
@pytest.mark.parametrize("length", [1, 17, 150])
def test_triton_scan_equals_loop(length):
    _check_scan(rotor_scan_triton, length)


def test_scan_matches_multivector_products():
    # the matrix-path scan equals prefix products of rotor multivectors with the Cayley table
    algebra = conformal_algebra()
    bivectors = 0.7 * torch.randn(3, 9, 10, dtype=torch.float64)
    prefix = rotor_scan(rotor_exp_matrix(bivectors), kernel="sequential")
    state = rotor_exp(bivectors[:, 0])
    torch.testing.assert_close(from_matrix(prefix[:, 0]), state)
    for t in range(1, 9):
        state = algebra.geometric_product(state, rotor_exp(bivectors[:, t]))
        torch.testing.assert_close(from_matrix(prefix[:, t]), state)


@pytest.mark.parametrize("kernel", ["chunked", "sequential"])
def test_16k_step_scan_stays_on_the_group(kernel):
    # the model's accumulated bivectors: rotation coefficients s * tanh(.) in [-1, 1]
    length = 16_384
    bivectors = torch.zeros(4, length, 10)
    bivectors[..., ROTATION] = torch.tanh(torch.randn(4, length, 6, generator=torch.Generator().manual_seed(0)))
    rotors = rotor_exp_matrix(bivectors)
    assert float(rotor_norm_error(rotors).max()) < 1e-5
    prefix = rotor_scan(rotors, kernel=kernel)
    assert torch.isfinite(prefix).all()
    assert float(rotor_norm_error(prefix[:, -1]).max()) < 1e-3
    assert float(rotor_norm_error(prefix[:, :: length // 16]).max()) < 1e-3


def test_rra_op_state_continuation_and_local_rotors():
    batch, length, heads, channels = 2, 11, 2, 3
    # the model's compact mode: rotations accumulated, all 10 components in the per-token rotor
    bivectors = torch.zeros(batch, length, heads, 10)
    bivectors[..., ROTATION] = torch.randn(batch, length, heads, 6) * 0.5
    local = torch.randn(batch, length, heads, 10) * 0.3
    values = torch.randn(batch, length, heads, channels, 32)
    full, final = recursive_rotor_accumulator(bivectors, values, kernel="chunked", local_bivectors=local)
    first, state = recursive_rotor_accumulator(
        bivectors[:, :6], values[:, :6], kernel="sequential", local_bivectors=local[:, :6]
    )
    second, final2 = recursive_rotor_accumulator(
        bivectors[:, 6:], values[:, 6:], initial=state, kernel="sequential", local_bivectors=local[:, 6:]
    )
    torch.testing.assert_close(torch.cat((first, second), 1), full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final2, final, rtol=1e-5, atol=1e-5)
    # direct transcription of y_t = T_t v_t ~T_t with T_t = (prod_s exp(-B_s/2)) exp(-A_t/2)
    algebra = conformal_algebra()
    b, h, t = 1, 1, 4
    rotor = rotor_exp(bivectors[b, 0, h].double())
    for s in range(1, t + 1):
        rotor = algebra.geometric_product(rotor, rotor_exp(bivectors[b, s, h].double()))
    transform = algebra.geometric_product(rotor, rotor_exp(local[b, t, h].double()))
    y = algebra.geometric_product(
        algebra.geometric_product(transform, values[b, t, h].double()), algebra.reverse(transform)
    )
    torch.testing.assert_close(full[b, t, h].double(), y, rtol=1e-4, atol=1e-4)
    # zero bivectors give identity rotors: y = v
    identity, _ = recursive_rotor_accumulator(torch.zeros_like(bivectors), values)
    torch.testing.assert_close(identity, values, rtol=1e-5, atol=1e-5)
    assert bivector_to_multivector(torch.ones(10)).sum() == 10


@pytest.mark.gpu
def test_triton_scan_on_gpu_16k():
    length = 16_384
    bivectors = torch.zeros(8, length, 10, device="cuda")
    bivectors[..., ROTATION] = torch.tanh(torch.randn(8, length, 6, device="cuda"))
    rotors = rotor_exp_matrix(bivectors).requires_grad_(True)
    prefix = rotor_scan_triton(rotors)
    assert torch.isfinite(prefix).all() and float(rotor_norm_error(prefix[:, -1]).max()) < 1e-3
    expected = rotor_scan_chunked(rotors)
    torch.testing.assert_close(prefix, expected, rtol=1e-3, atol=1e-3)
    grad_out = torch.randn_like(prefix)
    got = torch.autograd.grad(prefix, rotors, grad_out)[0]
    want = torch.autograd.grad(expected, rotors, grad_out)[0]
    assert float((got - want).abs().max()) < 1e-2 * float(want.abs().max())
