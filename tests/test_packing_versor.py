"""Packed sequences through Versor (issue 22): a packed batch equals each document run alone.

In the shape of flash-linear-attention's model tests: every GPA and RRA kernel (naive, chunk / scan, decode,
Triton under TRITON_INTERPRET=1) and every mixer, outputs and every gradient (float64 tight; fp32 within a
bound scaled to eps), `DataCollatorWithFlattening` against the unpacked documents, cached token-by-token
decoding with random left padding against one uncached forward, and the old kernel names.
"""

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_config

from zpx_hf import VersorConfig, VersorForCausalLM, ops_gpa_chunk
from zpx_hf.clifford_algebra import BOOST_INDICES, rotor_exp
from zpx_hf.modeling_blocks import CACHE_FIELD
from zpx_hf.ops_gpa import HAS_TRITON, geometric_product_attention
from zpx_hf.ops_rra import recursive_rotor_accumulator

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
MIXERS = ("gpa", "rra", "hybrid")
# two rows of 13 tokens, cut into documents of these lengths (a one-token document included)
ROWS = [(5, 1, 7), (13,)]
FP32_EPS = torch.finfo(torch.float32).eps


def document_ids(rows=ROWS):
    return torch.tensor([sum(([d] * n for d, n in enumerate(row)), []) for row in rows])


def documents(rows=ROWS):
    """(row, start, stop) of every document."""
    spans = []
    for b, row in enumerate(rows):
        start = 0
        for n in row:
            spans.append((b, start, start + n))
            start += n
    return spans


def assert_close_scaled(got, want, rel, name=""):
    scale = max(float(want.abs().max()), 1e-30)
    err = float((got.double() - want.double()).abs().max())
    assert err <= rel * scale, f"{name}: max error {err:.3e} > {rel:.1e} x {scale:.3e}"


# ---------------------------------------------------------------- GPA: every kernel


def gpa_inputs(dtype, seed=0, length=13, heads=2, channels=1):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, heads, length, 32 * channels, generator=generator, dtype=torch.float64) for _ in "qkv")
    gamma = torch.tensor([0.7, -0.4][:heads], dtype=torch.float64)
    return [t.to(dtype).requires_grad_(True) for t in (q, k, v, gamma)]


def gpa_packed_and_alone(kernel, dtype, causal, bivector=True):
    """(packed, alone): lists [out, dq, dk, dv, dgamma], the second assembled from each document alone
    (through the naive kernel in float64)."""
    leaves = gpa_inputs(dtype)
    weights = torch.randn(leaves[0].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = geometric_product_attention(
        *leaves, causal=causal, document_ids=document_ids(), bivector=bivector, kernel=kernel
    )
    packed = [out.detach(), *torch.autograd.grad((out * weights.to(dtype)).sum(), leaves, allow_unused=True)]
    reference = [x.detach().double().requires_grad_(True) for x in leaves]
    alone = [torch.zeros_like(reference[0]) for _ in range(4)] + [torch.zeros_like(reference[3])]
    for b, start, stop in documents():
        q, k, v = (x[b : b + 1, :, start:stop] for x in reference[:3])
        doc_out = geometric_product_attention(q, k, v, reference[3], causal=causal, bivector=bivector, kernel="naive")
        grads = torch.autograd.grad((doc_out * weights[b : b + 1, :, start:stop]).sum(), reference, allow_unused=True)
        alone[0][b, :, start:stop] = doc_out.detach()[0]
        for i in range(3):
            alone[1 + i][b, :, start:stop] = grads[i][b, :, start:stop]
        if bivector:
            alone[4] += grads[3]
    return packed, alone


@pytest.fixture
def small_chunks(monkeypatch):
    """Panels and key blocks smaller than a document: block skipping and per-block document masks run."""
    monkeypatch.setattr(ops_gpa_chunk, "PANEL", 4)
    monkeypatch.setattr(ops_gpa_chunk, "BLOCK", 4)


NAMES = ("output", "d query", "d key", "d value", "d gamma")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("kernel", ["naive", "chunk"])
def test_gpa_packed_equals_each_document_alone_float64(kernel, causal, small_chunks):
    packed, alone = gpa_packed_and_alone(kernel, torch.float64, causal)
    for name, got, want in zip(NAMES, packed, alone):
        assert_close_scaled(got, want, 1e-12, f"{kernel} {name}")


def test_gpa_scalar_only_packed_through_sdpa_float64():
    packed, alone = gpa_packed_and_alone("auto", torch.float64, True, bivector=False)
    for name, got, want in zip(NAMES[:4], packed, alone):
        assert_close_scaled(got, want, 1e-12, f"scalar sdpa {name}")
    assert packed[4] is None  # gamma is not part of the scalar-only function


@pytest.mark.parametrize("kernel", ["chunk"] + (["triton"] if HAS_TRITON else []))
def test_gpa_packed_equals_each_document_alone_float32(kernel, small_chunks):
    # fp32 against the float64 documents: rounding of dot products over D = 32 and of the softmax; the
    # Triton path runs under TRITON_INTERPRET=1 on CPU (conftest sets it before kernels are defined)
    packed, alone = gpa_packed_and_alone(kernel, torch.float32, True)
    for name, got, want in zip(NAMES, packed, alone):
        assert_close_scaled(got, want, 1000 * FP32_EPS, f"{kernel} {name}")


def test_gpa_documents_and_padding_combine():
    # left padding in one row and documents: every kernel equals the naive path
    leaves = [x.detach() for x in gpa_inputs(torch.float64)]
    padding = torch.ones(2, 13, dtype=torch.bool)
    padding[1, :4] = False
    kwargs = dict(causal=True, key_padding_mask=padding, document_ids=document_ids([(5, 1, 7), (4, 9)]))
    want = geometric_product_attention(*leaves, kernel="naive", **kwargs)
    assert float(want[1, :, :4].abs().max()) == 0.0  # padding rows of a padding-only document see nothing
    assert_close_scaled(geometric_product_attention(*leaves, kernel="chunk", **kwargs), want, 1e-12)


# ---------------------------------------------------------------- RRA: every kernel


def rra_inputs(accumulate, dtype, seed=0, length=13, heads=2, channels=2):
    generator = torch.Generator().manual_seed(seed)
    bivectors = torch.tanh(torch.randn(2, length, heads, 10, generator=generator, dtype=torch.float64))
    if accumulate == "full":
        bivectors[..., list(BOOST_INDICES)] *= 0.1
    value = torch.randn(2, length, heads, channels, 32, generator=generator, dtype=torch.float64)
    initial = rotor_exp(0.4 * torch.randn(2, heads, 10, generator=generator, dtype=torch.float64))
    return [x.to(dtype).requires_grad_(True) for x in (bivectors, value, initial)]


def rra_packed_and_alone(kernel, accumulate, dtype):
    """(packed, alone): [out, state, d bivectors, d value, d initial]; alone runs each document through the
    naive kernel in float64, the first document of a row from `initial`, the others from the rotor 1."""
    leaves = rra_inputs(accumulate, dtype)
    generator = torch.Generator().manual_seed(1)
    weights = torch.randn(leaves[1].shape, generator=generator, dtype=torch.float64)
    state_weights = torch.randn(leaves[2].shape, generator=generator, dtype=torch.float64)
    out, state = recursive_rotor_accumulator(
        leaves[0], leaves[1], initial=leaves[2], accumulate=accumulate, document_ids=document_ids(), kernel=kernel
    )
    loss = (out * weights.to(dtype)).sum() + (state * state_weights.to(state.dtype)).sum()
    packed = [out.detach(), state.detach(), *torch.autograd.grad(loss, leaves)]
    reference = [x.detach().double().requires_grad_(True) for x in leaves]
    alone = [torch.zeros_like(reference[1]), torch.zeros_like(reference[2])] + [torch.zeros_like(x) for x in reference]
    for b, start, stop in documents():
        initial = reference[2][b : b + 1] if start == 0 else None
        doc_out, doc_state = recursive_rotor_accumulator(
            reference[0][b : b + 1, start:stop], reference[1][b : b + 1, start:stop], initial=initial,
            accumulate=accumulate, kernel="naive",
        )  # fmt: skip
        loss = (doc_out * weights[b : b + 1, start:stop]).sum()
        if stop == 13:  # the row's last document gives the returned state
            alone[1][b] = doc_state.detach()[0]
            loss = loss + (doc_state * state_weights[b : b + 1]).sum()
        grads = torch.autograd.grad(loss, reference, allow_unused=True)  # `initial` reaches first documents only
        alone[0][b, start:stop] = doc_out.detach()[0]
        alone[2][b, start:stop] = grads[0][b, start:stop]
        alone[3][b, start:stop] = grads[1][b, start:stop]
        if grads[2] is not None:
            alone[4][b] += grads[2][b]
    return packed, alone


RRA_NAMES = ("output", "state", "d bivectors", "d value", "d initial")


@pytest.mark.parametrize("accumulate", ["compact", "full"])
@pytest.mark.parametrize("kernel", ["naive", "scan", "decode"])
def test_rra_packed_restarts_the_rotor_at_each_document_float64(kernel, accumulate):
    packed, alone = rra_packed_and_alone(kernel, accumulate, torch.float64)
    for name, got, want in zip(RRA_NAMES, packed, alone):
        assert_close_scaled(got, want, 1e-10, f"{kernel} {name}")


@pytest.mark.parametrize("accumulate", ["compact", "full"])
@pytest.mark.parametrize("kernel", ["scan"] + (["triton"] if HAS_TRITON else []))
def test_rra_packed_restarts_the_rotor_at_each_document_float32(kernel, accumulate):
    # rounding accumulates along a document: within 10 L float32 eps of each quantity's largest entry
    packed, alone = rra_packed_and_alone(kernel, accumulate, torch.float32)
    for name, got, want in zip(RRA_NAMES, packed, alone):
        assert_close_scaled(got, want, 10 * 13 * FP32_EPS, f"{kernel} {name}")


def test_rra_packed_scan_over_long_documents_float64():
    # documents longer than several scan rounds (log-depth combine across a restart) on the scan kernel
    rows = [(40, 1, 23), (64,)]
    leaves = [x.detach() for x in rra_inputs("compact", torch.float64, length=64, heads=1, channels=1)]
    out, _ = recursive_rotor_accumulator(leaves[0], leaves[1], document_ids=document_ids(rows), kernel="scan")
    for b, start, stop in documents(rows):
        doc, _ = recursive_rotor_accumulator(leaves[0][b : b + 1, start:stop], leaves[1][b : b + 1, start:stop])
        assert_close_scaled(out[b : b + 1, start:stop], doc, 1e-11, f"document {b}:{start}-{stop}")


# ---------------------------------------------------------------- old kernel names


# the names earlier versions of GPA and RRA used (configs, scripts, benchmarks)
OLD_GPA_NAMES = {"cpu": "chunk", "chunked": "chunk", "reference": "naive"}
OLD_RRA_NAMES = {"cpu": "scan", "sequential": "naive", "recurrent": "decode", "step": "decode"}


def test_old_kernel_names_select_the_same_kernels_with_a_warning():
    q, k, v, gamma = (x.detach() for x in gpa_inputs(torch.float64))
    for old, new in OLD_GPA_NAMES.items():
        with pytest.warns(FutureWarning, match=f"GPA kernel '{old}' is now called '{new}'"):
            got = geometric_product_attention(q, k, v, gamma, causal=True, kernel=old)
        assert torch.equal(got, geometric_product_attention(q, k, v, gamma, causal=True, kernel=new)), old
    bivectors, value, initial = (x.detach() for x in rra_inputs("compact", torch.float64))
    for old, new in OLD_RRA_NAMES.items():
        with pytest.warns(FutureWarning, match=f"RRA kernel '{old}' is now called '{new}'"):
            got = recursive_rotor_accumulator(bivectors, value, initial=initial, kernel=old)
        want = recursive_rotor_accumulator(bivectors, value, initial=initial, kernel=new)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), old
    with pytest.raises(ValueError, match=r"`kernel`='flash' is not a GPA kernel"):
        geometric_product_attention(q, k, v, gamma, causal=True, kernel="flash")
    with pytest.raises(ValueError, match=r"`kernel`='flash' is not a RRA kernel"):
        recursive_rotor_accumulator(bivectors, value, kernel="flash")


def test_configs_with_old_kernel_fields_still_load(tmp_path):
    # earlier versions wrote gpa_kernel / rra_kernel to config.json: such checkpoints load (with a warning
    # that the field no longer selects anything) and run
    config = make_tiny_config("versor-hybrid")
    config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    text = path.read_text().replace('"mixer"', '"gpa_kernel": "chunked", "rra_kernel": "scan", "mixer"', 1)
    path.write_text(text)
    with pytest.warns(UserWarning, match="was removed") as record:
        loaded = VersorConfig.from_pretrained(tmp_path)
    messages = " ".join(str(w.message) for w in record)
    assert "`rra_kernel`='scan' was removed" in messages and "`gpa_kernel`='chunked' was removed" in messages
    assert not hasattr(loaded, "rra_kernel") and loaded.mixer == "hybrid"
    with torch.no_grad():
        assert VersorForCausalLM(loaded)(torch.tensor([[3, 4, 5]])).logits.shape == (1, 3, TINY_VOCAB)


# ---------------------------------------------------------------- models: every mixer


def tiny_model(mixer, seed=0, **overrides):
    torch.manual_seed(seed)
    return VersorForCausalLM(make_tiny_config(f"versor-{mixer}", **overrides)).eval()


def packed_tokens(rows=ROWS, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, TINY_VOCAB, (len(rows), sum(rows[0])), generator=generator)
    positions = torch.tensor([sum((list(range(n)) for n in row), []) for row in rows])
    return ids, positions


def model_packed_and_alone(model, packing):
    """(packed logits, alone logits, packed grads, alone grads) for `packing` "position_ids" or "cu_seq_lens"."""
    ids, positions = packed_tokens()
    weights = torch.randn(*ids.shape, TINY_VOCAB, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    weights = weights.to(model.dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    if packing == "position_ids":
        logits = model(ids, position_ids=positions).logits
    else:
        lengths = torch.tensor([n for row in ROWS for n in row])
        cu = torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0)))
        logits = model(ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=7, max_length_k=7).logits
    packed_grads = torch.autograd.grad((logits * weights).sum(), params)
    alone = torch.zeros_like(logits)
    loss = 0.0
    for b, start, stop in documents():
        doc = model(ids[b : b + 1, start:stop]).logits
        alone[b, start:stop] = doc.detach()[0]
        loss = loss + (doc * weights[b : b + 1, start:stop]).sum()
    alone_grads = torch.autograd.grad(loss, params)
    return logits.detach(), alone, packed_grads, alone_grads


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_model_packed_equals_each_document_alone_float64(mixer, implementation):
    model = tiny_model(mixer, seed=1).double()
    model.set_attn_implementation(implementation)
    logits, alone, packed_grads, alone_grads = model_packed_and_alone(model, "position_ids")
    assert_close_scaled(logits, alone, 1e-10, "logits")
    for (name, _), got, want in zip(model.named_parameters(), packed_grads, alone_grads):
        assert_close_scaled(got, want, 1e-9, name)


@pytest.mark.parametrize("mixer", MIXERS)
def test_model_packed_by_cu_seq_lens_float32(mixer):
    # flash-attention's cu_seq_lens kwargs (a padding-free collator) set the documents; fp32 bound
    model = tiny_model(mixer, seed=2)
    logits, alone, packed_grads, alone_grads = model_packed_and_alone(model, "cu_seq_lens")
    assert_close_scaled(logits, alone, 200 * FP32_EPS, "logits")
    for (name, _), got, want in zip(model.named_parameters(), packed_grads, alone_grads):
        assert_close_scaled(got, want, 2000 * FP32_EPS, name)


def test_unpacked_documents_still_leak_without_packing_information():
    # the check above can fail: the same row without position ids lets documents see each other
    model = tiny_model("hybrid", seed=1).double()
    ids, positions = packed_tokens()
    with torch.no_grad():
        packed = model(ids, position_ids=positions).logits
        plain = model(ids).logits
    assert float((packed[0, 5:] - plain[0, 5:]).abs().max()) > 1e-3
    torch.testing.assert_close(packed[:, :5], plain[:, :5], rtol=1e-12, atol=1e-12)  # the first document


@pytest.mark.parametrize("mixer", MIXERS)
def test_data_collator_with_flattening_gives_the_unpacked_loss(mixer):
    from transformers import DataCollatorWithFlattening

    model = tiny_model(mixer, seed=4).double()
    generator = torch.Generator().manual_seed(5)
    docs = [torch.randint(3, TINY_VOCAB, (n,), generator=generator).tolist() for n in (6, 3, 9)]
    batch = DataCollatorWithFlattening()([{"input_ids": d} for d in docs])
    assert "attention_mask" not in batch and batch["input_ids"].shape == (1, 18)
    with torch.no_grad():
        packed = model(**batch).loss
        total, count = 0.0, 0
        for d in docs:
            ids = torch.tensor([d])
            total = total + model(ids, labels=ids).loss * (len(d) - 1)  # mean over len - 1 targets
            count += len(d) - 1
    torch.testing.assert_close(packed, total / count, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # and it differs from the same row read as one document
        leaked = model(batch["input_ids"], labels=batch["labels"]).loss
    assert abs(float(leaked - packed)) > 1e-6


# ---------------------------------------------------------------- decoding with a cache


@pytest.mark.parametrize("mixer", MIXERS)
def test_cached_decoding_with_random_left_padding_equals_one_forward(mixer):
    model = tiny_model(mixer, seed=6).double()
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(3, TINY_VOCAB, (3, 9), generator=generator)
    mask = torch.ones_like(ids)
    for b, pad in enumerate(torch.randint(0, 5, (3,), generator=generator).tolist()):
        mask[b, :pad] = 0
    mask[0, :4] = 0  # at least one row padded
    with torch.no_grad():
        whole = model(ids, attention_mask=mask).logits
        cache, logits = None, []
        for t in range(ids.shape[1]):
            out = model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache, use_cache=True)
            cache = out[CACHE_FIELD]
            logits.append(out.logits)
    decoded = torch.cat(logits, dim=1)
    real = mask.bool()
    torch.testing.assert_close(decoded[real], whole[real], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mixer", MIXERS)
def test_decoding_after_a_packed_prompt_continues_its_last_document(mixer):
    # a packed prompt fills the cache; the tokens decoded next belong to the row's last document only
    model = tiny_model(mixer, seed=8).double()
    ids, positions = packed_tokens([(5, 8)], seed=9)
    more = torch.randint(3, TINY_VOCAB, (1, 3), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        out = model(ids, position_ids=positions, use_cache=True)
        cache, logits = out[CACHE_FIELD], []
        for t in range(3):
            out = model(more[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = out[CACHE_FIELD]
            logits.append(out.logits)
        alone = model(torch.cat((ids[:, 5:], more), dim=1)).logits[:, -3:]
    torch.testing.assert_close(torch.cat(logits, dim=1), alone, rtol=1e-10, atol=1e-10)


@needs_triton
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_gpa_triton_document_loop_bounds_equal_naive(causal):
    # documents longer than a tile (16 on CPU): query blocks start past earlier documents' key blocks and
    # key blocks stop before later documents' query blocks; the result equals the naive path
    rows = [(20, 1, 19), (7, 33)]
    leaves = gpa_inputs(torch.float32, seed=3, length=40, heads=1)
    kwargs = dict(causal=causal, document_ids=document_ids(rows))
    got = geometric_product_attention(*leaves, kernel="triton", **kwargs)
    want = geometric_product_attention(*leaves, kernel="naive", **kwargs)
    weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(4))
    got_grads = torch.autograd.grad((got * weights).sum(), leaves)
    want_grads = torch.autograd.grad((want * weights).sum(), leaves)
    for name, g, w in zip(NAMES, (got, *got_grads), (want, *want_grads)):
        assert_close_scaled(g, w, 1000 * FP32_EPS, name)
