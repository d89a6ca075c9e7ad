"""Packed rows through every ZPX and PCT kernel (flash-linear-attention's model-test shape, at the op level):
a packed batch equals each document run alone, output and every gradient; float64 tight, fp32 within a bound
scaled to eps; the Triton kernel under TRITON_INTERPRET=1; masks per query panel, never L x L."""

import pytest
import torch

from zpx_hf import ops_common, ops_pct_panel, ops_zpx_panel
from zpx_hf.ops_common import HAS_TRITON, document_ids_from_cu_seq_lens, document_ids_from_position_ids
from zpx_hf.ops_pct import pct_attention
from zpx_hf.ops_zpx import phase_coordinates, phase_key_features, zpx_attention

# rows of one packed batch, each a list of document lengths (same total per row)
DOCUMENTS = [[5, 9, 1, 16], [12, 19]]
LENGTH = 31


def document_ids() -> torch.Tensor:
    rows = [torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row)) for row in DOCUMENTS]
    return torch.stack(rows)


def spans():
    """(row, start, end) of every document."""
    for row, lengths in enumerate(DOCUMENTS):
        start = 0
        for n in lengths:
            yield row, start, start + n
            start += n


def scaled_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max().clamp(min=1.0)).item()


def compare_packed_to_separate(op, inputs, grad, tol, seq_dim=2):
    """op(*tensors, document_ids) packed vs op on each document's slices alone; outputs [B, L, ...] on dim 1."""
    packed = op(*inputs, document_ids())
    grads = torch.autograd.grad((packed.double() * grad.double()).sum(), inputs)
    separate_loss = 0.0
    for row, start, end in spans():
        pieces = [t[row : row + 1].narrow(seq_dim, start, end - start) if t.dim() == 4 else t for t in inputs]
        out = op(*pieces, None)
        err = scaled_error(out, packed[row : row + 1, start:end])
        assert err <= tol, f"document {row}:{start}-{end} output error {err:.2e} > {tol:.1e}"
        separate_loss = separate_loss + (out.double() * grad[row : row + 1, start:end].double()).sum()
    separate = torch.autograd.grad(separate_loss, inputs)
    for index, (a, e) in enumerate(zip(grads, separate)):
        err = scaled_error(a, e)
        assert err <= tol, f"gradient of input {index}: error {err:.2e} > {tol:.1e}"


def pct_inputs(dtype, heads=2, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (len(DOCUMENTS), heads, LENGTH, dim)
    q = torch.nn.functional.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(*shape, generator=g, dtype=torch.float64)
    tau = torch.rand(heads, generator=g, dtype=torch.float64) * 4 + 2
    bias = -torch.rand(heads, generator=g, dtype=torch.float64) * 3
    param = torch.float64 if dtype == torch.float64 else torch.float32
    inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)] + [t.to(param).requires_grad_() for t in (tau, bias)]
    grad = torch.randn(len(DOCUMENTS), LENGTH, heads, dim, generator=g, dtype=torch.float64)
    return inputs, grad


def pct_op(kernel, causal):
    def op(q, k, v, tau, bias, documents):
        out = pct_attention(q, k, v, tau, bias, causal=causal, document_ids=documents, kernel=kernel)
        return out.transpose(1, 2)  # [B, L, H, D]: tokens on dim 1

    return op


def zpx_inputs(dtype, heads=2, dim=8, channels=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = len(DOCUMENTS)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()  # noqa: E731
    q, k, v = (make(batch, heads, LENGTH, dim) for _ in range(3))
    pre = [make(batch, heads, LENGTH, channels) for _ in range(3)]
    grad = torch.randn(batch, LENGTH, heads, dim, generator=g, dtype=torch.float64)
    return [q, k, v, *pre], grad


def zpx_op(kernel, causal, padding=None):
    def op(q, k, v, r, t, b, documents):
        features = phase_key_features(phase_coordinates(r, t, b, 4.0))
        mask = padding
        if mask is not None and documents is None:  # a document alone: its own slice of the padding mask
            mask = None
        out, _ = zpx_attention(
            q, torch.cat((k, features), -1), v, features, causal=causal, scaling=q.shape[-1] ** -0.5,
            lambda_angle=0.7, lambda_sphere=1.3, key_padding_mask=mask, document_ids=documents, kernel=kernel,
        )  # fmt: skip
        return out

    return op


DTYPES = {"fp64": (torch.float64, 1e-12), "fp32": (torch.float32, 64 * torch.finfo(torch.float32).eps)}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("kernel", ["naive", "panel"])
def test_pct_packed_equals_each_document_alone(kernel, causal, dtype, monkeypatch):
    monkeypatch.setattr(ops_pct_panel, "PANEL_ROWS", 7)  # several panels, each narrowed to its documents
    dtype, tol = DTYPES[dtype]
    inputs, grad = pct_inputs(dtype)
    compare_packed_to_separate(pct_op(kernel, causal), inputs, grad, tol)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("kernel", ["naive", "panel"])
def test_zpx_packed_equals_each_document_alone(kernel, causal, dtype, monkeypatch):
    monkeypatch.setattr(ops_zpx_panel, "MASK_ELEMENTS", 2 * 8 * LENGTH)  # panels of 16 rows
    monkeypatch.setattr(ops_zpx_panel, "KEPT_MASK_ELEMENTS", 0)  # each recomputed in the backward
    dtype, tol = DTYPES[dtype]
    inputs, grad = zpx_inputs(dtype)
    compare_packed_to_separate(zpx_op(kernel, causal), inputs, grad, tol)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_pct_triton_packed_equals_each_document_alone(causal):
    """The fused kernels' packed path (interpreter on CPU): fp32 accumulation over <= 31 terms."""
    inputs, grad = pct_inputs(torch.float32, dim=16, seed=1)
    compare_packed_to_separate(pct_op("triton", causal), inputs, grad, 64 * torch.finfo(torch.float32).eps)


@pytest.mark.parametrize("kernel", ["naive", "decode"])
def test_single_query_sees_only_its_document(kernel):
    """Decoding steps fold documents into the key mask: the last query of a packed row equals its document alone."""
    inputs, _ = pct_inputs(torch.float64)
    q, k, v, tau, bias = (t.detach() for t in inputs)
    documents = document_ids()
    out = pct_attention(q[:, :, -1:], k, v, tau, bias, document_ids=documents, kernel=kernel)
    start = LENGTH - DOCUMENTS[0][-1]
    alone = pct_attention(q[:1, :, -1:], k[:1, :, start:], v[:1, :, start:], tau, bias, kernel="naive")
    torch.testing.assert_close(out[:1], alone, rtol=0, atol=1e-13)
    zpx_in, _ = zpx_inputs(torch.float64)
    zq, zk, zv, *pre = (t.detach() for t in zpx_in)
    features = phase_key_features(phase_coordinates(*pre, 4.0))
    kwargs = dict(causal=True, scaling=0.3, lambda_angle=0.7, lambda_sphere=1.3)
    zpx_kernel = "decode" if kernel == "decode" else "naive"
    key_aug = torch.cat((zk, features), -1)
    packed, _ = zpx_attention(
        zq[:, :, -1:], key_aug, zv, features[:, :, -1:], document_ids=documents, kernel=zpx_kernel, **kwargs
    )
    alone, _ = zpx_attention(
        zq[:1, :, -1:], key_aug[:1, :, start:], zv[:1, :, start:], features[:1, :, -1:], kernel="naive", **kwargs
    )
    torch.testing.assert_close(packed[:1], alone, rtol=0, atol=1e-13)


@pytest.mark.parametrize("kernel", ["naive", "panel"])
def test_zpx_padding_and_documents_together(kernel, monkeypatch):
    """Padding keys inside packed rows (cu_seq_lens with a padding mask): real tokens see only real keys of
    their own document; rows with no visible key output exactly zero, on both kernels."""
    monkeypatch.setattr(ops_zpx_panel, "MASK_ELEMENTS", 2 * 8 * LENGTH)
    inputs, grad = zpx_inputs(torch.float64, seed=3)
    padding = torch.ones(len(DOCUMENTS), LENGTH, dtype=torch.bool)
    padding[0, 14] = False  # the one-token document is padding: its row sees nothing
    padding[1, :2] = False
    q, k, v, *pre = inputs
    out = zpx_op(kernel, True, padding)(q, k, v, *pre, document_ids())
    assert not out[0, 14].any()
    reference = zpx_op("naive", True, padding)(q, k, v, *pre, document_ids())
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-12)
    out.backward(grad.to(out.dtype))
    assert all(torch.isfinite(t.grad).all() for t in inputs)


def test_zpx_panels_never_build_an_l_by_l_mask(monkeypatch):
    """With padding (one padded key) the fast path's masks are per panel: none larger than MASK_ELEMENTS."""
    monkeypatch.setattr(ops_zpx_panel, "MASK_ELEMENTS", 4 * 64)
    sizes = []
    original = ops_zpx_panel.visible_block

    def spy(*args, **kwargs):
        mask = original(*args, **kwargs)
        sizes.append(0 if mask is None else mask.numel())
        return mask

    monkeypatch.setattr(ops_zpx_panel, "visible_block", spy)
    length = 64
    q, k, v = (torch.randn(1, 2, length, 8) for _ in range(3))
    features = phase_key_features(phase_coordinates(*(torch.randn(1, 2, length, 3) for _ in range(3)), 4.0))
    padding = torch.ones(1, length, dtype=torch.bool)
    padding[0, 0] = False
    zpx_attention(q, torch.cat((k, features), -1), v, features, key_padding_mask=padding, causal=True,
                  scaling=0.3, lambda_angle=1.0, lambda_sphere=1.0, kernel="panel")  # fmt: skip
    assert len(sizes) == length // 16 and max(sizes) <= 16 * length < length * length


def test_document_ids_from_positions_and_cu_seq_lens_agree():
    positions = torch.cat([torch.arange(n) for n in DOCUMENTS[0]])[None]
    from_positions = document_ids_from_position_ids(positions)
    cu = torch.tensor([0, 5, 14, 15, 31])
    torch.testing.assert_close(from_positions, document_ids_from_cu_seq_lens(cu, 1, LENGTH))
    torch.testing.assert_close(from_positions, document_ids()[:1])
    assert document_ids_from_position_ids(torch.arange(7)[None]) is None  # one document: the unchanged path
    torch.testing.assert_close(ops_common.document_positions(from_positions), positions)
    with pytest.raises(ValueError, match="cu_seq_lens must rise from 0"):
        document_ids_from_cu_seq_lens(torch.tensor([0, 5, 30]), 1, LENGTH)


def test_bad_document_ids_name_the_argument():
    inputs, _ = pct_inputs(torch.float64)
    q, k, v, tau, bias = (t.detach() for t in inputs)
    with pytest.raises(ValueError, match="`document_ids` must be"):
        pct_attention(q, k, v, tau, bias, document_ids=torch.zeros(2, 5, dtype=torch.long))


def test_zpx_kernel_names_one_vocabulary_and_earlier_names_map():
    from zpx_hf.ops_zpx import ZPX_KERNELS, resolve_kernel

    query = torch.zeros(1, 1, 4, 8)
    assert ZPX_KERNELS == ("naive", "panel", "decode")
    assert resolve_kernel("auto", query) == "panel" and resolve_kernel("auto", query[:, :, :1]) == "decode"
    assert resolve_kernel("auto", query[:, :, :1], dropout=0.1) == "panel"  # the decode step has no dropout
    for old in ("cpu", "sdpa"):
        with pytest.warns(FutureWarning, match=f"'{old}' is now called 'panel'"):
            assert resolve_kernel(old, query) == "panel"
    for rows, dropout in ((4, 0.0), (1, 0.1)):  # asked for by name, decode refuses what it cannot compute
        with pytest.raises(ValueError, match="'decode' takes one query row without dropout"):
            resolve_kernel("decode", query[:, :, :rows], dropout=dropout)
    with pytest.raises(ValueError, match=r"`kernel`='flash' is not a ZPX attention kernel"):
        resolve_kernel("flash", query)


def test_every_op_names_its_kernels_from_the_shared_vocabulary():
    from zpx_hf.ops_common import KERNEL_NAMES
    from zpx_hf.ops_gpa import GPA_KERNELS
    from zpx_hf.ops_pct import PCT_KERNELS
    from zpx_hf.ops_rra import RRA_KERNELS
    from zpx_hf.ops_zpx import ZPX_KERNELS

    for kernels in (ZPX_KERNELS, PCT_KERNELS, GPA_KERNELS, RRA_KERNELS):
        assert set(kernels) <= set(KERNEL_NAMES), kernels
    assert set(ZPX_KERNELS + PCT_KERNELS + GPA_KERNELS + RRA_KERNELS) == set(KERNEL_NAMES)  # no stale name


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_pct_triton_skips_other_documents_tiles_exactly(causal):
    """Documents longer than a tile (64 in the interpreter): query tiles start past earlier documents' key
    tiles and key tiles stop before later documents' query tiles; output and every gradient equal the naive
    path (fp32, sums over <= 100 terms)."""
    g = torch.Generator().manual_seed(5)
    rows = [[70, 1, 89], [130, 30]]
    ids = torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in rows])
    shape = (2, 2, 160, 16)
    q, k = (torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(*shape, generator=g)
    leaves = [t.requires_grad_() for t in (q, k, v, torch.rand(2, generator=g) * 4 + 2, -torch.rand(2, generator=g))]
    weights = torch.randn(shape, generator=g)
    results = {}
    for kernel in ("triton", "naive"):
        out = pct_attention(*leaves, causal=causal, document_ids=ids, kernel=kernel)
        results[kernel] = (out, *torch.autograd.grad((out * weights).sum(), leaves))
    for index, (got, want) in enumerate(zip(results["triton"], results["naive"])):
        err = scaled_error(got, want)
        assert err <= 256 * torch.finfo(torch.float32).eps, f"tensor {index}: error {err:.2e}"
