"""Clifford algebras Cl(p,q,r) on batched torch tensors, and the Cl(4,1) = M4(C) matrix path.

Blades are indexed by bitmasks: bit i set <=> generator e_{i+1} is a factor. The first `p`
generators square to +1, the next `q` to -1, the last `r` to 0. For Versor, Cl(4,1): bit0..bit3 =
e1..e4 (+1), bit4 = e5 (-1); blade index = mask in 0..31. A multivector is a tensor whose last
dimension holds the 2**n blade coefficients in mask order.

    e_A e_B = sign(A, B) e_{A xor B},
    sign(A, B) = (-1)^(#swaps to sort the generators of A then B) * prod_{i in A and B} e_i^2

Matrix path (docs/design.md §5.2): Cl(4,1) is isomorphic, as a real algebra, to the 4x4 complex matrices with

    e1 = sx(x)I,  e2 = sy(x)I,  e3 = sz(x)sx,  e4 = sz(x)sy,  e5 = i sz(x)sz,

E_A = ordered product of the generators of A, encode M = sum_A a_A E_A, decode
a_A = Re Tr(M E_A^dagger) / 4. A geometric product is then one complex 4x4 matmul. Complex numbers are
carried as separate real and imaginary parts (`[..., 2, 4, 4]`, index 0 = real) so every dtype,
autocast and Triton work.

Rotor exponential: `rotor_exp(B)` = exp(-B/2) computed as the matrix exponential in the M4(C)
representation (through its real 8x8 form [[X, -Y], [Y, X]]). A general Cl(4,1) bivector is the sum
of two commuting 2-blades, one of which may be a boost; the matrix exponential covers every case
without branching on the sign of B^2. It is exact in the algebra because the representation is an
algebra isomorphism, so exp(M(B)) = M(exp(B)). R~R = 1 holds because reversion is an
anti-automorphism with ~B = -B, so ~exp(-B/2) = exp(~(-B/2)) = exp(B/2), and the two exponentials
of commuting arguments multiply to exp(0) = 1.
"""

from __future__ import annotations

import torch

# Tables are built on the CPU explicitly: the first use may happen under a `torch.device("meta")` context
# (HF builds models on the meta device in `from_pretrained`), and cached tables must hold real values.
_CPU = torch.device("cpu")
# Constant tables are built once, when this module is imported, and the getters return them: under
# `torch.compile` a getter then reads a module constant, where tracing how a table is built would break the
# graph on its host reads (`nonzero`, `.tolist()`, `float(tensor)`).

# --------------------------------------------------------------------------------------------------
# Tables from bitmasks
# --------------------------------------------------------------------------------------------------


def blade_grade(mask: int) -> int:
    return bin(mask).count("1")


def _reorder_sign(a: int, b: int) -> int:
    """(-1)^(number of transpositions to bring e_A e_B into ascending generator order)."""
    swaps = 0
    a >>= 1
    while a:
        swaps += blade_grade(a & b)
        a >>= 1
    return -1 if swaps & 1 else 1


def generator_squares(p: int, q: int, r: int = 0) -> tuple[int, ...]:
    return (1,) * p + (-1,) * q + (0,) * r


def blade_product_sign(a: int, b: int, squares: tuple[int, ...]) -> int:
    """sign(A, B) in e_A e_B = sign * e_{A xor B} (0 when a shared generator squares to 0)."""
    sign = _reorder_sign(a, b)
    common = a & b
    index = 0
    while common:
        if common & 1:
            sign *= squares[index]
        common >>= 1
        index += 1
    return sign


class CliffordAlgebra:
    """Cayley tables of Cl(p, q, r) and the products on tensors `[..., 2**n]`.

    Tables (CPU tensors, moved to the operand's device/dtype on use):
        `grades[A]`, `reverse_signs[A] = (-1)^(g(g-1)/2)`, `product_index[A, B] = A xor B`,
        `product_sign[A, B]` = sign(A, B) and the outer/left-contraction/inner masks of the same shape.
    """

    def __init__(self, p: int, q: int = 0, r: int = 0) -> None:
        self.signature = (p, q, r)
        self.n = p + q + r
        self.dim = 1 << self.n
        self.squares = generator_squares(p, q, r)
        masks = range(self.dim)
        self.grades = torch.tensor([blade_grade(a) for a in masks], dtype=torch.long, device=_CPU)
        self.reverse_signs = torch.tensor([(-1) ** (g * (g - 1) // 2) for g in self.grades.tolist()], device=_CPU)
        self.product_index = torch.tensor([[a ^ b for b in masks] for a in masks], dtype=torch.long, device=_CPU)
        self.product_sign = torch.tensor(
            [[blade_product_sign(a, b, self.squares) for b in masks] for a in masks], device=_CPU
        )
        self.grade_onehot = (self.grades[:, None] == torch.arange(self.n + 1, device=_CPU)[None, :]).float()
        self.grade_spread = self.grade_onehot.T.contiguous()  # per-grade values -> per-blade
        g = self.grades
        ga, gb, gc = g[:, None], g[None, :], g[self.product_index]
        self.outer_mask = gc == ga + gb  # A and B disjoint
        self.left_contraction_mask = gc == gb - ga  # A subset of B
        # Hestenes inner product: grade |gA - gB|, both operands of grade > 0
        self.inner_mask = (gc == (ga - gb).abs()) & (ga > 0) & (gb > 0)
        # "Mixing" table for C = A B in the gather form used below: C[c] = sum_a sign(a, a^c) A[a] B[a^c]
        self._gather_index = self.product_index  # [a, c] -> a xor c (symmetric in meaning)
        self._gather_sign = torch.stack([self.product_sign[a, self.product_index[a]] for a in masks])
        self._gather_masks = {
            "geometric": torch.ones(self.dim, self.dim, dtype=torch.bool, device=_CPU),
            "outer": torch.stack([self.outer_mask[a, self.product_index[a]] for a in masks]),
            "left_contraction": torch.stack([self.left_contraction_mask[a, self.product_index[a]] for a in masks]),
            "inner": torch.stack([self.inner_mask[a, self.product_index[a]] for a in masks]),
        }
        self._cache: dict[tuple, torch.Tensor] = {}

    def blades_of_grade(self, grade: int) -> torch.Tensor:
        return torch.nonzero(self.grades == grade).flatten()

    def table(self, name: str, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A per-blade table (`grades`, `grade_onehot`, `reverse_signs`, ...) on `device`, cached."""
        key = (name, device, dtype)
        if key in self._cache:
            return self._cache[key]
        value = getattr(self, name)
        value = value.to(device=device, dtype=dtype or value.dtype)
        if not torch.compiler.is_compiling():  # a compiled graph converts in place; eager runs keep the copy
            self._cache[key] = value
        return value

    def _signed_table(self, kind: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (kind, device, dtype)
        if key not in self._cache:
            table = self._gather_sign * self._gather_masks[kind]
            self._cache[key] = table.to(device=device, dtype=dtype)
        return self._cache[key]

    def _product(self, a: torch.Tensor, b: torch.Tensor, kind: str) -> torch.Tensor:
        # (a b)[c] = sum_x sign(x, x^c) a[x] b[x^c]: gather b into [..., x, c], one contraction over x.
        a, b = torch.broadcast_tensors(a, b)
        table = self._signed_table(kind, a.device, a.dtype)
        index = self._gather_index.to(a.device)
        b_gathered = b[..., index]  # [..., x, c] = b[x ^ c]
        return torch.einsum("...x,...xc,xc->...c", a, b_gathered, table)

    def geometric_product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a b over the last dimension (broadcasting over the others)."""
        return self._product(a, b, "geometric")

    def outer_product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a ^ b: grade-(r+s) part of the product of grade-r and grade-s parts."""
        return self._product(a, b, "outer")

    def left_contraction(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a _| b: grade-(s-r) part of the product of grade-r and grade-s parts (zero if r > s)."""
        return self._product(a, b, "left_contraction")

    def inner_product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Hestenes inner product: grade-|r-s| part of grade-r times grade-s, scalars excluded."""
        return self._product(a, b, "inner")

    def reverse(self, a: torch.Tensor) -> torch.Tensor:
        """~a: blade of grade g times (-1)^(g(g-1)/2)."""
        return a * self.reverse_signs.to(device=a.device, dtype=a.dtype)

    def grade_projection(self, a: torch.Tensor, grade: int) -> torch.Tensor:
        """<a>_g with the other coefficients set to zero (same shape)."""
        keep = (self.grades == grade).to(device=a.device, dtype=a.dtype)
        return a * keep

    def grade_part(self, a: torch.Tensor, grade: int) -> torch.Tensor:
        """Coefficients of grade `g` only: `[..., C(n, g)]`, in mask order."""
        return a[..., self.blades_of_grade(grade).to(a.device)]

    def scalar_product_signs(self) -> torch.Tensor:
        """s[A] with <a ~b>_0 = sum_A s[A] a_A b_A (= reverse sign x e_A e_A)."""
        return self.reverse_signs * torch.diagonal(self.product_sign)

    def bilinear_forms(self, blades: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Signed permutations of <a ~b>_C for each blade C in `blades`.

        Returns `(index, sign)` of shape `[len(blades), dim]` with
        <a ~b>_C = sum_A a_A * sign[C, A] * b_{index[C, A]},  index[C, A] = A xor C.
        """
        rows_index, rows_sign = [], []
        for c in blades.tolist():
            index = torch.tensor([a ^ c for a in range(self.dim)], device=_CPU)
            sign = torch.tensor(
                [blade_product_sign(a, a ^ c, self.squares) * int(self.reverse_signs[a ^ c]) for a in range(self.dim)],
                device=_CPU,
            )
            rows_index.append(index)
            rows_sign.append(sign)
        return torch.stack(rows_index), torch.stack(rows_sign)


_CONFORMAL_ALGEBRA = CliffordAlgebra(4, 1, 0)


def conformal_algebra() -> CliffordAlgebra:
    """Cl(4,1), the conformal geometric algebra used by Versor."""
    return _CONFORMAL_ALGEBRA


# Blade masks of the 10 bivectors of Cl(4,1), in mask order; the 6 with e5 absent square to -1
# (rotations), the 4 e_i e5 square to +1 (boosts).
BIVECTOR_MASKS = (3, 5, 6, 9, 10, 12, 17, 18, 20, 24)
NUM_BLADES = 32
NUM_GRADES = 6


# --------------------------------------------------------------------------------------------------
# Cl(4,1) = M4(C)
# --------------------------------------------------------------------------------------------------


def _build_matrix_basis() -> torch.Tensor:
    one = torch.eye(2, dtype=torch.complex128, device=_CPU)
    sx = torch.tensor([[0, 1], [1, 0]], dtype=torch.complex128, device=_CPU)
    sy = torch.tensor([[0, -1j], [1j, 0]], dtype=torch.complex128, device=_CPU)
    sz = torch.tensor([[1, 0], [0, -1]], dtype=torch.complex128, device=_CPU)
    generators = [
        torch.kron(sx, one),
        torch.kron(sy, one),
        torch.kron(sz, sx),
        torch.kron(sz, sy),
        1j * torch.kron(sz, sz),
    ]
    matrices = []
    for mask in range(NUM_BLADES):
        m = torch.eye(4, dtype=torch.complex128, device=_CPU)
        for bit in range(5):
            if mask >> bit & 1:
                m = m @ generators[bit]
        matrices.append(m)
    basis = torch.stack(matrices)
    return torch.stack((basis.real, basis.imag), dim=1)


_MATRIX_BASIS = _build_matrix_basis()  # float64 on the CPU; read it through `matrix_basis`


def matrix_basis(device: torch.device = _CPU, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """E_A for every blade A as real/imag parts `[32, 2, 4, 4]` on `device` in `dtype` (float64 CPU: the table)."""
    return _MATRIX_BASIS.to(device=device, dtype=dtype)


def complex_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(X + iY)(U + iV) on `[..., 2, n, n]` real/imag pairs."""
    ar, ai = a.unbind(-3)
    br, bi = b.unbind(-3)
    return torch.stack((ar @ br - ai @ bi, ar @ bi + ai @ br), dim=-3)


def to_matrix(a: torch.Tensor) -> torch.Tensor:
    """Encode Cl(4,1) multivectors `[..., 32]` as M = sum_A a_A E_A, `[..., 2, 4, 4]` (real, imag)."""
    return torch.einsum("...a,aczw->...czw", a, matrix_basis(a.device, a.dtype))


def from_matrix(m: torch.Tensor) -> torch.Tensor:
    """Decode a_A = Re Tr(M E_A^dagger) / 4 = sum_ij (Re M_ij Re E_Aij + Im M_ij Im E_Aij) / 4."""
    return torch.einsum("...czw,aczw->...a", m, matrix_basis(m.device, m.dtype)) / 4


def matrix_geometric_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a b through the matrix path: encode, one complex 4x4 matmul, decode."""
    return from_matrix(complex_matmul(to_matrix(a), to_matrix(b)))


def _build_reverse_signs_matrix() -> torch.Tensor:
    # ~M = C M^T C^-1 with C = E_{e2 e4}: transposition fixes e1, e3, e5 and negates e2, e4 (sy^T = -sy);
    # conjugation by e2 e4 negates exactly e2 and e4 back, so the composite fixes every generator and
    # reverses products: it is the reversion anti-automorphism. C is a signed anti-diagonal
    # (C[i, 3 - i] = c_i, C^-1 = -C), so ~M[i, j] = -c_i c_{3-j} M[3 - j, 3 - i]: a transpose about the
    # anti-diagonal and a sign pattern, no products.
    conjugator = matrix_basis()[0b01010, 0]  # E_{e2 e4} is real
    c = torch.stack([conjugator[i, 3 - i] for i in range(4)])
    return -c[:, None] * c.flip(0)[None, :]


_REVERSE_SIGNS_MATRIX = _build_reverse_signs_matrix()  # read it through `reverse_signs_matrix`


def reverse_signs_matrix(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The signs S of ~M[i, j] = S[i, j] M[3 - j, 3 - i], `[4, 4]`."""
    return _REVERSE_SIGNS_MATRIX.to(device=device, dtype=dtype)


def matrix_reverse(m: torch.Tensor) -> torch.Tensor:
    """Reversion ~M in the matrix representation, `[..., 2, 4, 4]` real/imag pairs or `[..., 4, 4]` complex."""
    return m.flip(-2, -1).transpose(-2, -1) * reverse_signs_matrix(m.device, m.real.dtype)


def _complex_to_real8(m: torch.Tensor) -> torch.Tensor:
    x, y = m.unbind(-3)
    return torch.cat((torch.cat((x, -y), dim=-1), torch.cat((y, x), dim=-1)), dim=-2)


# matrix_exp_series: Taylor degree on ||X|| <= 1 (remainder <= 1/19! < 1e-17) and the most squarings (norms
# up to 2^48; exp of a boost past ~709 overflows float64 long before, rotations are periodic)
_SERIES_DEGREE, _MAX_SQUARINGS = 18, 48


def matrix_exp_series(a: torch.Tensor) -> torch.Tensor:
    """exp(A) for `[..., n, n]` by scaling and squaring with a fixed trace: X = A / 2^s with s = ceil(log2 ||A||_inf)
    per matrix, a degree-18 Taylor polynomial (Horner), then squarings applied where their index is below s.

    The same function as `torch.linalg.matrix_exp` to float64 rounding (test), built from matmuls only, so it
    exports to ONNX, which has no matrix-exponential operator. Used by the "export" RRA kernel."""
    norm = a.abs().sum(-1).amax(-1)  # the inf-norm bounds the spectral radius
    s = torch.ceil(torch.log2(norm.clamp_min(1.0))).clamp(max=_MAX_SQUARINGS)  # 0 where ||A|| <= 1
    x = a / torch.exp2(s)[..., None, None]
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
    out = eye
    for k in range(_SERIES_DEGREE, 0, -1):  # I + X/1 (I + X/2 (I + ... (I + X/18)))
        out = eye + (x @ out) / k
    for k in range(_MAX_SQUARINGS):
        out = torch.where((k < s)[..., None, None], out @ out, out)
    return out


def rotor_exp_matrix(bivector: torch.Tensor, traceable: bool = False) -> torch.Tensor:
    """exp(-B/2) in the M4(C) representation, `[..., 2, 4, 4]`, for bivector coefficients `[..., 10]`.

    The general case (rotations and boosts mixed) through the real 8x8 form of the complex matrix, computed in
    float64 (a float32 matrix exponential and its backward lose several digits) and returned in float32,
    or float64 if given. `traceable` takes `matrix_exp_series` (graph export) instead of
    `torch.linalg.matrix_exp`. Rotations alone or boosts alone have closed forms: `rotation_rotor`, `boost_rotor`.
    """
    dtype = torch.float64 if bivector.dtype == torch.float64 else torch.float32
    b = bivector.to(torch.float64)
    basis = matrix_basis(b.device, torch.float64)[list(BIVECTOR_MASKS)]  # [10, 2, 4, 4]
    generator = torch.einsum("...k,kczw->...czw", -0.5 * b, basis)
    exp = matrix_exp_series if traceable else torch.linalg.matrix_exp
    real8 = exp(_complex_to_real8(generator))
    return torch.stack((real8[..., :4, :4], real8[..., 4:, :4]), dim=-3).to(dtype)


# --------------------------------------------------------------------------------------------------
# Closed-form rotors: Spin(4) = SU(2) x SU(2) for rotations, cosh/sinh for boosts
# --------------------------------------------------------------------------------------------------

# positions of the 6 rotation (e_i e_j, i, j <= 4) and 4 boost (e_i e5) bivectors in BIVECTOR_MASKS order
ROTATION_INDICES = tuple(i for i, mask in enumerate(BIVECTOR_MASKS) if not mask & 16)
BOOST_INDICES = tuple(i for i, mask in enumerate(BIVECTOR_MASKS) if mask & 16)
# the blades of a boost rotor exp(-A/2): the scalar and the 4 boost bivectors
BOOST_ROTOR_MASKS = (0, *(BIVECTOR_MASKS[i] for i in BOOST_INDICES))
# below this squared angle the closed forms use their Taylor series (truncation error < 1e-18)
_SERIES_BELOW = 1e-5


def _build_spin4_tables() -> dict[str, torch.Tensor]:
    """Constants of the rotation rotors, derived from the matrix basis (float64).

    I = e1234 squares to +1 and commutes with every even element of Cl(4,0), so P+- = (1 +- I)/2 split
    that subalgebra into two quaternion algebras. In this representation I = diag(-1, 1, 1, -1): P+ keeps
    rows/columns (1, 2), P- keeps (0, 3), and a rotation rotor is block diagonal with two SU(2) blocks.
    A block is a "quaternion" q0 1 + q1 (i sx) + q2 (i sy) + q3 (i sz), so a rotor is a pair `[2, 4]`.

    * `generator [2, 3, 6]`: -B/2 on block s is sum_m w_m (i s_m) with w = generator[s] @ B_rotation;
      the rotation bivectors are anti-Hermitian and traceless, so each block is exactly of that form.
    * `product [4, 4, 4]`: structure constants, (a b)_k = sum_ij product[i, j, k] a_i b_j.
    * `matrix [2, 4, 2, 4, 4]`: quaternion pair -> M4(C) real/imag parts; `multivector [2, 4, 32]`: -> blades.
    """
    basis = matrix_basis()
    complex_basis = torch.complex(basis[:, 0], basis[:, 1])
    pseudoscalar = complex_basis[0b01111].diagonal().real
    blocks = (torch.nonzero(pseudoscalar > 0).flatten(), torch.nonzero(pseudoscalar < 0).flatten())
    eye = torch.eye(2, dtype=torch.complex128, device=_CPU)
    paulis = (
        torch.tensor([[0, 1], [1, 0]], dtype=torch.complex128, device=_CPU),
        torch.tensor([[0, -1j], [1j, 0]], dtype=torch.complex128, device=_CPU),
        torch.tensor([[1, 0], [0, -1]], dtype=torch.complex128, device=_CPU),
    )
    units = torch.stack((eye, *(1j * p for p in paulis)))  # [4, 2, 2]

    def coefficient(block: torch.Tensor, unit: torch.Tensor) -> float:
        # <X, U> = Re Tr(X U^dagger) / 2 (the units are orthonormal under it)
        return float(torch.trace(block @ unit.conj().T).real / 2)

    rotation = [complex_basis[BIVECTOR_MASKS[k]] for k in ROTATION_INDICES]
    generator = torch.tensor(
        [[[-0.5 * coefficient(e[b][:, b], units[m]) for e in rotation] for m in (1, 2, 3)] for b in blocks],
        dtype=torch.float64,
        device=_CPU,
    )
    product = torch.tensor(
        [[[coefficient(units[i] @ units[j], units[k]) for k in range(4)] for j in range(4)] for i in range(4)],
        dtype=torch.float64,
        device=_CPU,
    )
    matrix = torch.zeros(2, 4, 4, 4, dtype=torch.complex128, device=_CPU)
    for s, b in enumerate(blocks):
        for a in range(4):
            matrix[s, a][b[:, None], b[None, :]] = units[a]
    matrix = torch.stack((matrix.real, matrix.imag), dim=2)  # [2, 4, 2, 4, 4]
    return {
        "generator": generator,
        "product": product,
        "matrix": matrix,
        "multivector": from_matrix(matrix),
    }


_SPIN4_TABLES = _build_spin4_tables()  # read them through `spin4_table`


def spin4_table(name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One of the `_build_spin4_tables` constants (`generator`, `product`, `matrix`, `multivector`) on `device`
    in `dtype`."""
    return _SPIN4_TABLES[name].to(device=device, dtype=dtype)


def _cos_sinc(angle2: torch.Tensor, hyperbolic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos x, sin x / x), or (cosh x, sinh x / x), from x^2 = `angle2` >= 0; series near 0 so values and
    gradients stay exact (and finite) at x = 0."""
    sign = 1.0 if hyperbolic else -1.0
    small = angle2 < _SERIES_BELOW
    x2 = torch.where(small, torch.ones_like(angle2), angle2)  # keeps the exact branch's gradient finite
    x = x2.sqrt()
    exact_cos = torch.cosh(x) if hyperbolic else torch.cos(x)
    exact_sinc = (torch.sinh(x) if hyperbolic else torch.sin(x)) / x
    a = sign * angle2
    series_cos = 1 + a / 2 + a * a / 24
    series_sinc = 1 + a / 6 + a * a / 120
    return torch.where(small, series_cos, exact_cos), torch.where(small, series_sinc, exact_sinc)


def rotation_rotor(rotation: torch.Tensor) -> torch.Tensor:
    """exp(-B/2) for rotation bivectors `[..., 6]` (coefficients of BIVECTOR_MASKS[ROTATION_INDICES]) as a
    quaternion pair `[..., 2, 4]` (see `_build_spin4_tables`).

    On block s, -B/2 = w . (i s) with (w . i s)^2 = -|w|^2, so exp(-B/2) = cos|w| + sin|w| / |w| (w . i s):
    the two commuting halves B P+ and B P- of B each rotate by their own angle.
    """
    w = torch.einsum("smk,...k->...sm", spin4_table("generator", rotation.device, rotation.dtype), rotation)
    cos, sinc = _cos_sinc((w * w).sum(-1), hyperbolic=False)
    return torch.cat((cos[..., None], sinc[..., None] * w), dim=-1)


def boost_rotor(boost: torch.Tensor) -> torch.Tensor:
    """exp(-A/2) for boost bivectors `[..., 4]` (A = sum_i a_i e_i e5) as coefficients `[..., 5]` of the blades
    `BOOST_ROTOR_MASKS` (scalar, then the boosts).

    A^2 = |a|^2 (the e_i e5 square to +1 and anticommute), so exp(-A/2) = cosh(|a|/2) - sinh(|a|/2) A / |a|.
    """
    cosh, sinhc = _cos_sinc((boost * boost).sum(-1) / 4, hyperbolic=True)
    return torch.cat((cosh[..., None], -0.5 * sinhc[..., None] * boost), dim=-1)


def quaternion_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Product of the SU(2) blocks `[..., 4]` (the rotor product within one half of Spin(4))."""
    table = spin4_table("product", a.device, a.dtype)
    return torch.einsum("...i,...j,ijk->...k", a, b, table)


def spin4_to_matrix(pair: torch.Tensor) -> torch.Tensor:
    """Quaternion pair `[..., 2, 4]` -> its M4(C) matrix `[..., 2, 4, 4]` (real/imag parts)."""
    return torch.einsum("...sa,saczw->...czw", pair, spin4_table("matrix", pair.device, pair.dtype))


def spin4_to_multivector(pair: torch.Tensor) -> torch.Tensor:
    """Quaternion pair `[..., 2, 4]` -> multivector coefficients `[..., 32]` (on the blades of Cl+(4,0))."""
    return torch.einsum("...sa,saz->...z", pair, spin4_table("multivector", pair.device, pair.dtype))


def boost_to_matrix(coefficients: torch.Tensor) -> torch.Tensor:
    """Boost-rotor coefficients `[..., 5]` (`BOOST_ROTOR_MASKS`) -> M4(C) matrix `[..., 2, 4, 4]`."""
    basis = matrix_basis(coefficients.device, coefficients.dtype)[list(BOOST_ROTOR_MASKS)]
    return torch.einsum("...k,kczw->...czw", coefficients, basis)


def rotor_exp(bivector: torch.Tensor) -> torch.Tensor:
    """Rotor R = exp(-B/2) as a `[..., 32]` multivector (even grades; odd grades are float noise
    and projected out)."""
    rotor = from_matrix(rotor_exp_matrix(bivector))
    even = (conformal_algebra().grades % 2 == 0).to(device=rotor.device, dtype=rotor.dtype)
    return rotor * even


def rotor_norm_error(rotor_matrix: torch.Tensor) -> torch.Tensor:
    """max |R ~R - 1| over the 32 coefficients, per rotor given as `[..., 2, 4, 4]`."""
    product = from_matrix(complex_matmul(rotor_matrix, matrix_reverse(rotor_matrix)))
    product[..., 0] = product[..., 0] - 1
    return product.abs().amax(-1)


def rotor_normalize(rotor_matrix: torch.Tensor) -> torch.Tensor:
    """Project a near-rotor back onto the group: one Newton step R <- R (3 - ~R R) / 2.

    For R = R0 (1 + d) with R0 a rotor and d small, ~R R = 1 + 2d' + O(d^2) and the step removes the
    first-order drift (the iteration converges quadratically to the rotor factor, like
    Newton-Schulz polar iteration for orthogonal matrices).
    """
    n = complex_matmul(matrix_reverse(rotor_matrix), rotor_matrix)
    eye = torch.eye(4, device=n.device, dtype=n.dtype)
    three = torch.stack((3 * eye, torch.zeros_like(eye)))
    return 0.5 * complex_matmul(rotor_matrix, three - n)


def sandwich(rotor_matrix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """R x ~R for rotors `[..., 2, 4, 4]` and multivectors `[..., 32]` (grade-preserving)."""
    m = to_matrix(x)
    return from_matrix(complex_matmul(complex_matmul(rotor_matrix, m), matrix_reverse(rotor_matrix)))


__all__ = [
    "BIVECTOR_MASKS",
    "BOOST_INDICES",
    "BOOST_ROTOR_MASKS",
    "ROTATION_INDICES",
    "boost_rotor",
    "boost_to_matrix",
    "quaternion_product",
    "reverse_signs_matrix",
    "rotation_rotor",
    "spin4_table",
    "spin4_to_matrix",
    "spin4_to_multivector",
    "NUM_BLADES",
    "NUM_GRADES",
    "CliffordAlgebra",
    "blade_product_sign",
    "complex_matmul",
    "conformal_algebra",
    "from_matrix",
    "matrix_basis",
    "matrix_exp_series",
    "matrix_geometric_product",
    "matrix_reverse",
    "rotor_exp",
    "rotor_exp_matrix",
    "rotor_norm_error",
    "rotor_normalize",
    "sandwich",
    "to_matrix",
]
