"""Cl(p,q,r) tables and the Cl(4,1) matrix path against independent GA libraries (clifford, kingdon)."""

import itertools

import numpy as np
import pytest
import torch

from zpx_hf.clifford_algebra import (
    BIVECTOR_MASKS,
    BOOST_INDICES,
    BOOST_ROTOR_MASKS,
    ROTATION_INDICES,
    CliffordAlgebra,
    boost_rotor,
    boost_to_matrix,
    complex_matmul,
    conformal_algebra,
    from_matrix,
    matrix_geometric_product,
    matrix_reverse,
    quaternion_product,
    rotation_rotor,
    rotor_exp,
    rotor_exp_matrix,
    rotor_norm_error,
    rotor_normalize,
    sandwich,
    spin4_to_matrix,
    spin4_to_multivector,
    to_matrix,
)

clifford = pytest.importorskip("clifford")


def _mask(blade_tuple) -> int:
    return sum(1 << (i - 1) for i in blade_tuple)


class CliffordBridge:
    """Explicit map between clifford's blade order (tuples of 1-based generator indices) and our masks."""

    def __init__(self, squares):
        self.layout = clifford.Layout(list(squares))
        self.ours_of = np.array([_mask(t) for t in self.layout.bladeTupList])  # clifford index -> our mask

    def to_ours(self, mv) -> torch.Tensor:
        out = np.zeros(len(self.ours_of))
        out[self.ours_of] = mv.value
        return torch.from_numpy(out)

    def from_ours(self, x: torch.Tensor):
        return self.layout.MultiVector(value=x.numpy()[self.ours_of])


@pytest.fixture(scope="module")
def cl41():
    return conformal_algebra(), CliffordBridge((1, 1, 1, 1, -1))


def test_blade_convention():
    algebra = conformal_algebra()
    assert algebra.dim == 32
    # bit0..3 square to +1, bit4 to -1
    assert [int(algebra.product_sign[1 << i, 1 << i]) for i in range(5)] == [1, 1, 1, 1, -1]
    assert algebra.product_sign[0b00011, 0b00011] == -1  # (e1 e2)^2 = -1
    assert algebra.product_sign[0b10001, 0b10001] == 1  # (e1 e5)^2 = +1 (boost)
    assert algebra.reverse_signs.tolist() == [(-1) ** (g * (g - 1) // 2) for g in algebra.grades.tolist()]


def test_cayley_table_matches_clifford(cl41):
    algebra, bridge = cl41
    blades = bridge.layout.blades_list
    for i, j in itertools.product(range(32), range(32)):
        product = bridge.to_ours(blades[i] * blades[j])
        a, b = int(bridge.ours_of[i]), int(bridge.ours_of[j])
        expected = torch.zeros(32, dtype=torch.float64)
        expected[algebra.product_index[a, b]] = float(algebra.product_sign[a, b])
        assert torch.equal(product, expected), (a, b)


@pytest.mark.parametrize("squares", [(1, 1, 1, 1, -1), (1, 1, -1, 0)])
def test_random_products_match_clifford(squares, cl41):
    p, q, r = squares.count(1), squares.count(-1), squares.count(0)
    algebra = CliffordAlgebra(p, q, r)
    bridge = cl41[1] if squares == (1, 1, 1, 1, -1) else CliffordBridge(squares)
    rng = np.random.default_rng(0)
    for _ in range(5):
        a = bridge.layout.MultiVector(value=rng.standard_normal(algebra.dim))
        b = bridge.layout.MultiVector(value=rng.standard_normal(algebra.dim))
        x, y = bridge.to_ours(a), bridge.to_ours(b)
        torch.testing.assert_close(algebra.geometric_product(x, y), bridge.to_ours(a * b))
        torch.testing.assert_close(algebra.outer_product(x, y), bridge.to_ours(a ^ b))
        torch.testing.assert_close(algebra.inner_product(x, y), bridge.to_ours(a | b))
        torch.testing.assert_close(algebra.left_contraction(x, y), bridge.to_ours(a << b))
        torch.testing.assert_close(algebra.reverse(x), bridge.to_ours(~a))
        for grade in range(algebra.n + 1):
            torch.testing.assert_close(algebra.grade_projection(x, grade), bridge.to_ours(a(grade)))


def test_geometric_product_matches_kingdon():
    kingdon = pytest.importorskip("kingdon")
    algebra = conformal_algebra()
    alg = kingdon.Algebra(4, 1)
    # kingdon keys are the same bitmasks (e1 = 1, e2 = 2, e12 = 3, ..., e5 = 16)
    rng = np.random.default_rng(1)
    a_values, b_values = rng.standard_normal(32), rng.standard_normal(32)
    a = alg.multivector(values=a_values, keys=tuple(range(32)))
    b = alg.multivector(values=b_values, keys=tuple(range(32)))
    product = a * b
    expected = np.zeros(32)
    for key, value in zip(product.keys(), product.values()):
        expected[key] = value
    ours = algebra.geometric_product(torch.from_numpy(a_values), torch.from_numpy(b_values))
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-10, atol=1e-10)


def test_associativity_and_reverse_anti_automorphism():
    algebra = conformal_algebra()
    a, b, c = torch.randn(3, 16, 32, dtype=torch.float64)
    gp = algebra.geometric_product
    torch.testing.assert_close(gp(gp(a, b), c), gp(a, gp(b, c)))
    torch.testing.assert_close(algebra.reverse(gp(a, b)), gp(algebra.reverse(b), algebra.reverse(a)))
    torch.testing.assert_close(algebra.reverse(algebra.reverse(a)), a)


def test_matrix_path_equals_table_path():
    algebra = conformal_algebra()
    a, b = torch.randn(2, 64, 32, dtype=torch.float64)
    torch.testing.assert_close(from_matrix(to_matrix(a)), a)
    torch.testing.assert_close(matrix_geometric_product(a, b), algebra.geometric_product(a, b))
    torch.testing.assert_close(from_matrix(matrix_reverse(to_matrix(a))), algebra.reverse(a))
    # float32 works too (no complex dtype involved)
    a32, b32 = a.float(), b.float()
    torch.testing.assert_close(matrix_geometric_product(a32, b32), algebra.geometric_product(a32, b32))


def test_rotor_exp_matches_clifford_and_is_a_rotor(cl41):
    algebra, bridge = cl41
    bivector = torch.randn(8, 10, dtype=torch.float64)
    rotor = rotor_exp(bivector)
    for i in range(bivector.shape[0]):
        b = torch.zeros(32, dtype=torch.float64)
        b[algebra.blades_of_grade(2)] = bivector[i]
        expected = bridge.to_ours(np.e ** (-bridge.from_ours(b) / 2))
        torch.testing.assert_close(rotor[i], expected, rtol=1e-9, atol=1e-9)
    # R ~R = 1 in float32 for many bivectors in the model's range (coefficients s*tanh(.) with s = 1),
    # from tiny to |B| = sqrt(10), rotations and boosts mixed
    bivector32 = (2 * torch.rand(4096, 10) - 1) * torch.logspace(-3, 0, 4096)[:, None]
    assert float(rotor_norm_error(rotor_exp_matrix(bivector32)).max()) < 1e-5
    r = rotor_exp(bivector32[:64].double())
    one = torch.zeros(32, dtype=torch.float64)
    one[0] = 1
    torch.testing.assert_close(algebra.geometric_product(r, algebra.reverse(r)), one.expand_as(r))


def test_sandwich_preserves_grades_and_normalize_repairs_drift():
    algebra = conformal_algebra()
    rotor = rotor_exp_matrix(torch.randn(16, 10, dtype=torch.float64))
    x = torch.randn(16, 32, dtype=torch.float64)
    for grade in range(6):
        y = sandwich(rotor, algebra.grade_projection(x, grade))
        torch.testing.assert_close(algebra.grade_projection(y, grade), y)
    # scalar part of a sandwiched vector's square is invariant: <(R v ~R)^2>_0 = <v^2>_0
    v = algebra.grade_projection(x, 1)
    rv = sandwich(rotor, v)
    torch.testing.assert_close(algebra.geometric_product(rv, rv)[:, 0], algebra.geometric_product(v, v)[:, 0])
    drifted = rotor * (1 + 1e-3 * torch.randn_like(rotor))
    assert float(rotor_norm_error(rotor_normalize(drifted)).max()) < 0.05 * float(rotor_norm_error(drifted).max())
    torch.testing.assert_close(
        complex_matmul(rotor, matrix_reverse(rotor))[..., 0, :, :], torch.eye(4).double().expand(16, 4, 4)
    )


def _split(bivector):
    rotation, boost = torch.zeros_like(bivector), torch.zeros_like(bivector)
    rotation[..., list(ROTATION_INDICES)] = bivector[..., list(ROTATION_INDICES)]
    boost[..., list(BOOST_INDICES)] = bivector[..., list(BOOST_INDICES)]
    return rotation, boost


@pytest.mark.parametrize("scale", [0.0, 1e-7, 1e-3, 0.5, 3.0, 20.0])
def test_closed_form_rotors_equal_the_matrix_exponential(scale):
    # float64, rotations and boosts apart; norms from 0 and the series branch to many turns / large boosts
    bivector = scale * torch.randn(256, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    rotation, boost = _split(bivector)
    for closed, reference in (
        (spin4_to_matrix(rotation_rotor(rotation[:, list(ROTATION_INDICES)])), rotor_exp_matrix(rotation)),
        (boost_to_matrix(boost_rotor(boost[:, list(BOOST_INDICES)])), rotor_exp_matrix(boost)),
    ):
        torch.testing.assert_close(closed, reference, rtol=1e-12, atol=1e-12 * float(reference.abs().max()))


@pytest.mark.parametrize("scale", [0.0, 1e-4, 0.7])
def test_closed_form_gradients_equal_the_matrix_exponential(scale):
    bivector = scale * torch.randn(16, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    weights = torch.randn(16, 2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    for indices, closed in (
        (ROTATION_INDICES, lambda b: spin4_to_matrix(rotation_rotor(b))),
        (BOOST_INDICES, lambda b: boost_to_matrix(boost_rotor(b))),
    ):
        part = bivector[:, list(indices)].requires_grad_(True)
        (got,) = torch.autograd.grad((closed(part) * weights).sum(), part)
        full = torch.zeros(16, 10, dtype=torch.float64).index_copy(1, torch.tensor(indices), part)
        (want,) = torch.autograd.grad((rotor_exp_matrix(full) * weights).sum(), part)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_closed_form_rotors_match_clifford(cl41):
    algebra, bridge = cl41
    bivector = torch.randn(8, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    rotation, boost = _split(bivector)
    rotors = spin4_to_multivector(rotation_rotor(rotation[:, list(ROTATION_INDICES)]))
    boosts = torch.zeros(8, 32, dtype=torch.float64)
    boosts[:, list(BOOST_ROTOR_MASKS)] = boost_rotor(boost[:, list(BOOST_INDICES)])
    for i in range(8):
        for ours, part in ((rotors[i], rotation[i]), (boosts[i], boost[i])):
            b = torch.zeros(32, dtype=torch.float64)
            b[list(BIVECTOR_MASKS)] = part
            # clifford exponentiates a bivector that is not a blade by a truncated series (~1e-8 here)
            torch.testing.assert_close(ours, bridge.to_ours(np.e ** (-bridge.from_ours(b) / 2)), rtol=1e-6, atol=1e-6)


def test_quaternion_pairs_are_the_rotation_subgroup():
    # Spin(4) = SU(2) x SU(2): products of pairs are geometric products of the rotors they encode
    algebra = conformal_algebra()
    generator = torch.Generator().manual_seed(7)
    a, b = (rotation_rotor(torch.randn(32, 6, dtype=torch.float64, generator=generator)) for _ in range(2))
    product = torch.stack([quaternion_product(a[:, s], b[:, s]) for s in range(2)], dim=1)
    expected = algebra.geometric_product(spin4_to_multivector(a), spin4_to_multivector(b))
    torch.testing.assert_close(spin4_to_multivector(product), expected)
    torch.testing.assert_close(from_matrix(spin4_to_matrix(a)), spin4_to_multivector(a))
    # unit pairs are rotors: R ~R = 1
    assert float(rotor_norm_error(spin4_to_matrix(a)).max()) < 1e-13
