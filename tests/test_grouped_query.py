"""Grouped-query and multi-query attention (`num_key_value_heads`): full heads are today's models bit for bit
(fixtures written before the field existed); a grouped model computes exactly what the same model with its keys
and values repeated per query head computes (float64), through every kernel, packed rows, both caches, generate
and beam search; its cache holds only the key-value heads."""

import functools
from pathlib import Path

import pytest
import torch
from conftest import TINY_VOCAB, assert_close_eps, make_tiny_config
from helpers_grouped import OUTPUT_DIM, grouped_and_repeated, repeat_heads
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import zpx_hf
from zpx_hf.ops_common import HAS_TRITON
from zpx_hf.ops_gpa import geometric_product_attention
from zpx_hf.ops_pct import pct_attention
from zpx_hf.ops_zpx import phase_coordinates, phase_key_features, zpx_attention

FIXTURES = Path(__file__).parent / "fixtures" / "mha"
FIXTURE_FAMILIES = {"zpx": "zpx", "pct": "pct", "versor_gpa": "versor"}
HEADS = dict(num_attention_heads=4)


@pytest.mark.parametrize("name", sorted(FIXTURE_FAMILIES))
def test_full_heads_are_the_model_before_grouping_bit_for_bit(name):
    """A checkpoint written before `num_key_value_heads` existed loads with the same parameter names and shapes,
    reads as num_key_value_heads = num_attention_heads, and gives the logits that code gave, exactly."""
    config_class, _, causal_lm, _ = zpx_hf.FAMILIES[FIXTURE_FAMILIES[name]]
    config = config_class.from_json_file(FIXTURES / name / "config.json")
    assert config.num_key_value_heads == config.num_attention_heads == 4
    model = causal_lm(config).double().eval()
    state = load_file(str(FIXTURES / name / "model.safetensors"))
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in state.items()}
    model.load_state_dict(state, strict=True)
    expected = load_file(str(FIXTURES / name / "expected_logits.safetensors"))
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            logits = model(input_ids=expected["input_ids"]).logits
        assert torch.equal(logits, expected[f"logits_{implementation}"]), implementation


@pytest.mark.parametrize(
    "case, overrides, fix",
    [
        ("zpx", dict(num_attention_heads=4, num_key_value_heads=3), "divisor"),
        ("zpx", dict(num_key_value_heads=0), ">= 1"),
        ("pct", dict(num_attention_heads=4, num_key_value_heads=3), "divisor"),
        ("versor-rra", dict(num_key_value_heads=1), "no keys or values to group"),
    ],
)
def test_num_key_value_heads_is_checked_by_name(case, overrides, fix):
    with pytest.raises(ValueError, match="num_key_value_heads") as error:
        make_tiny_config(case, **overrides)
    assert fix in str(error.value) and "\n" not in str(error.value)


def zpx_inputs(query_heads, key_heads, l_q=5, l_k=7, dim=8, channels=2, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, dtype=dtype, generator=generator).requires_grad_()

    def phase_features(length):  # [cos phi, sin phi, s] of real phases (the fast form holds only for these)
        pre = torch.randn(3, 2, key_heads, length, channels, dtype=dtype, generator=generator)
        return phase_key_features(phase_coordinates(*pre, max_log_radius=4.0))

    query = draw(2, query_heads, l_q, dim)
    key = torch.randn(2, key_heads, l_k, dim, dtype=dtype, generator=generator)
    key_aug = torch.cat((key, phase_features(l_k)), dim=-1).requires_grad_()
    value = draw(2, key_heads, l_k, dim)
    # the queries' features: one per key-value head, shared by its group (as the model builds them)
    return query, key_aug, value, repeat_heads(phase_features(l_q), query_heads // key_heads)


MASKS = {
    "none": (None, None),
    "padding": (torch.tensor([[True] * 7, [False] * 3 + [True] * 4]), None),
    "documents": (None, torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])),
}


@pytest.mark.parametrize("masks", sorted(MASKS))
@pytest.mark.parametrize("kernel, l_q", [("naive", 5), ("panel", 5), ("panel", 7), ("decode", 1)])
@pytest.mark.parametrize("key_heads", [1, 2])
def test_zpx_kernels_take_grouped_keys_as_their_repeats(kernel, l_q, key_heads, masks):
    """Every ZPX kernel on grouped k^ / v equals the reference on k^ / v repeated per query head (forward), and
    its gradients equal its own on the repeats: dq alike, dk^ and dv of the grouped tensors the group sums of the
    repeated ones (float64; the kernels' gradients in k^'s phase columns differ from the naive form's atan2
    off the unit circle, so each kernel's gradients are compared with its own, as for full heads)."""
    key_padding_mask, document_ids = MASKS[masks]
    query, key_aug, value, features = zpx_inputs(4, key_heads, l_q=l_q)
    group = 4 // key_heads
    options = dict(causal=True, scaling=8**-0.5, lambda_angle=0.7, lambda_sphere=-0.4)
    options.update(key_padding_mask=key_padding_mask, document_ids=document_ids)
    output = zpx_attention(query, key_aug, value, features, kernel=kernel, **options)[0]
    repeated = [repeat_heads(x, group).detach().requires_grad_() for x in (key_aug, value)]
    with torch.no_grad():
        reference = zpx_attention(query, *repeated, features, kernel="naive", **options)[0]
    torch.testing.assert_close(output, reference, atol=1e-12, rtol=1e-12)
    twin = zpx_attention(query, *repeated, features, kernel=kernel, **options)[0]
    grad = torch.randn_like(reference)
    grads = torch.autograd.grad(output, (query, key_aug, value), grad)
    twin_grads = torch.autograd.grad(twin, (query, *repeated), grad)
    torch.testing.assert_close(grads[0], twin_grads[0], atol=1e-12, rtol=1e-12)
    for grouped_grad, repeated_grad in zip(grads[1:], twin_grads[1:]):
        summed = repeated_grad.unflatten(1, (key_heads, group)).sum(2)
        torch.testing.assert_close(grouped_grad, summed, atol=1e-12, rtol=1e-12)


def test_zpx_kernels_refuse_key_heads_that_do_not_divide_the_query_heads():
    query, key_aug, value, _ = zpx_inputs(4, 3)
    with pytest.raises(ValueError, match="Hkv dividing H=4"):
        zpx_attention(
            query,
            key_aug,
            value,
            torch.zeros(2, 4, 5, 10),
            causal=True,
            scaling=1.0,
            lambda_angle=1.0,
            lambda_sphere=1.0,
        )


CASES = [("zpx", 1), ("zpx", 2), ("pct", 1), ("pct", 2), ("versor-gpa", 2), ("versor-hybrid", 1)]
PACKED_POSITIONS = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 0, 1, 2]])


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("case, key_heads", CASES)
def test_grouped_model_equals_its_repeated_twin(case, key_heads, implementation):
    """Logits with left padding and with packed rows (position ids restarting at 0), and every parameter's
    gradient (a grouped projection's is the group sum of its twin's rows), float64."""
    grouped, full = grouped_and_repeated(case, key_heads, **HEADS)
    for model in (grouped, full):
        model.set_attn_implementation(implementation)
    ids = torch.randint(3, TINY_VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    for inputs in (dict(attention_mask=mask), dict(position_ids=PACKED_POSITIONS)):
        with torch.no_grad():
            phases = dict(output_phases=True) if case == "zpx" else {}
            ours, theirs = grouped(ids, **phases, **inputs), full(ids, **phases, **inputs)
        torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-12, rtol=0)
        if phases:  # the centre loss averages over key-value heads: the twin's repeated phases give the same mean
            torch.testing.assert_close(ours.center_loss, theirs.center_loss, atol=1e-12, rtol=0)
            assert ours.phases[0].shape[2] == key_heads
    grouped(ids, labels=ids, attention_mask=mask).loss.backward()
    full(ids, labels=ids, attention_mask=mask).loss.backward()
    twin = dict(full.named_parameters())
    for name, parameter in grouped.named_parameters():
        expected = twin[name].grad
        if parameter.shape != expected.shape:  # rows of a grouped projection: summed over the group
            dim = OUTPUT_DIM.get(case.split("-")[0], 0)
            rows = parameter.shape[dim] // key_heads
            expected = expected.unflatten(dim, (key_heads, -1, rows)).sum(dim + 1).flatten(dim, dim + 1)
        torch.testing.assert_close(parameter.grad, expected, atol=1e-12, rtol=0, msg=name)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("case, key_heads", CASES)
def test_grouped_model_generates_as_its_repeated_twin(case, key_heads, cache):
    """Greedy and beam-search generation from a left-padded batch: the same tokens and scores as the twin; the
    cache holds num_key_value_heads heads."""
    grouped, full = grouped_and_repeated(case, key_heads, **HEADS)
    ids = torch.randint(3, TINY_VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    options = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, cache_implementation=cache)
    options.update(return_dict_in_generate=True, output_scores=True)
    for beams in (1, 3):
        ours = grouped.generate(ids, num_beams=beams, **options)
        theirs = full.generate(ids, num_beams=beams, **options)
        assert torch.equal(ours.sequences, theirs.sequences), beams
        for a, b in zip(ours.scores, theirs.scores):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    cached = grouped(ids, attention_mask=mask, use_cache=True).past_key_values
    if case.startswith("versor"):  # VersorCache: GPA layers' keys and values (the last layer is GPA in both)
        keys, values = cached.keys[-1], cached.values[-1]
    else:
        keys, values = cached.layers[0].keys, cached.layers[0].values
    assert keys.shape[1] == values.shape[1] == key_heads


def test_tiny_grouped_config_saves_and_reloads(tmp_path):
    model = AutoModelForCausalLM.from_config(make_tiny_config("zpx", num_key_value_heads=1))
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert again.config.num_key_value_heads == 1
    assert again.model.layers[0].self_attn.k_proj.weight.shape[0] == model.config.head_dim


def assert_grouped_equals_repeated(op, kernel, inputs, originals, differentiated, generator):
    """op(*inputs, kernel=kernel) on grouped key / value (inputs[1:3]) against op(kernel="naive") on them repeated
    per query head (float64 originals): the output and the gradients of the first `differentiated` inputs, the
    grouped tensors' as the group sums of the repeated ones; float64 at 1e-12, float32 at eps scale."""
    query, key = originals[:2]
    group = query.shape[1] // key.shape[1]
    output = op(*inputs, kernel=kernel)
    reference_inputs = [x if i not in (1, 2) else repeat_heads(x, group) for i, x in enumerate(originals)]
    reference_inputs = [x.clone().requires_grad_() for x in reference_inputs]
    reference = op(*reference_inputs, kernel="naive")
    grad = torch.randn(reference.shape, dtype=torch.float64, generator=generator)
    grads = torch.autograd.grad(output, inputs[:differentiated], grad.to(output.dtype))
    reference_grads = list(torch.autograd.grad(reference, reference_inputs[:differentiated], grad))
    for i in (1, 2):  # the grouped tensors' gradients: summed over each key-value head's query heads
        reference_grads[i] = reference_grads[i].unflatten(1, (key.shape[1], group)).sum(2)
    for got, want in zip((output, *grads), (reference, *reference_grads)):
        if got.dtype == torch.float64:
            torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
        else:
            assert_close_eps(got, want, ulps=256)


PCT_KERNELS = [("naive", 5), ("panel", 5), ("panel", 7), ("decode", 1), ("triton", 5), ("triton", 7)]


@pytest.mark.parametrize("masks", sorted(MASKS))
@pytest.mark.parametrize("kernel, l_q", PCT_KERNELS)
@pytest.mark.parametrize("key_heads", [1, 2])
def test_pct_kernels_take_grouped_keys_as_their_repeats(kernel, l_q, key_heads, masks, monkeypatch):
    """Every PCT kernel on grouped k / v equals the naive reference on k / v repeated per query head, forward and
    every gradient (dq, dtau, db alike; dk and dv the group sums of the repeated ones): float64, Triton in float32
    under the interpreter against the float64 reference at eps scale. Panels of 2 rows: several per call."""
    if kernel == "triton" and not HAS_TRITON:
        pytest.skip("triton is not installed")
    monkeypatch.setattr("zpx_hf.ops_pct_panel.PANEL_ROWS", 2)
    key_padding_mask, document_ids = MASKS[masks]
    dtype = torch.float32 if kernel == "triton" else torch.float64
    generator = torch.Generator().manual_seed(3)

    def unit(*shape):  # L2-normalised rows, as the model gives the kernels
        x = torch.randn(*shape, dtype=torch.float64, generator=generator)
        return x / x.norm(dim=-1, keepdim=True)

    query, key, value = unit(2, 4, l_q, 16), unit(2, key_heads, 7, 16), torch.randn(2, key_heads, 7, 16).double()
    tau = torch.tensor([3.0, 5.0, 2.0, 4.0], dtype=torch.float64)
    bias = torch.tensor([-1.0, -2.0, 0.5, -0.5], dtype=torch.float64)
    inputs = [x.to(dtype).requires_grad_() for x in (query, key, value, tau, bias)]
    options = dict(causal=True, key_padding_mask=key_padding_mask, document_ids=document_ids)
    op = functools.partial(pct_attention, **options)
    assert_grouped_equals_repeated(op, kernel, inputs, (query, key, value, tau, bias), len(inputs), generator)


@pytest.mark.parametrize("rotary", [True, False])
def test_pct_grouped_projection_closed_form_backward_matches_autograd(rotary):
    """`query_key_value` with fewer key-value heads: its forward equals `query_key_value_naive` and its closed-form
    backward equals autograd through it (float64) and finite differences."""
    from zpx_hf.modeling_pct import query_key_value, query_key_value_naive, rotation_tables

    torch.manual_seed(0)
    batch, length, heads, key_heads, dim = 2, 5, 4, 2, 3
    qkv = torch.randn(batch, length, 2 * (heads + 2 * key_heads) * dim, dtype=torch.float64)
    angle = torch.randn(batch, length, dim, dtype=torch.float64)
    tables = rotation_tables(1.5 * angle.cos(), 1.5 * angle.sin(), torch.float64) if rotary else None
    outputs = query_key_value(qkv, heads, dim, 1e-6, tables, key_heads)
    assert [tuple(x.shape) for x in outputs] == [(2, 4, 5, 6), (2, 2, 5, 6), (2, 2, 5, 6)]
    for got, want in zip(outputs, query_key_value_naive(qkv, heads, dim, 1e-6, tables, key_heads)):
        assert torch.equal(got, want)
    grads = [torch.randn_like(x) for x in outputs]

    def gradient(fn):
        x = qkv.clone().requires_grad_()
        return torch.autograd.grad(fn(x, heads, dim, 1e-6, tables, key_heads), x, grads)[0]

    torch.testing.assert_close(gradient(query_key_value), gradient(query_key_value_naive), rtol=0, atol=1e-12)
    short = None if tables is None else tuple(t[:1, :, :3] for t in tables)
    assert torch.autograd.gradcheck(
        lambda x: query_key_value(x, heads, dim, 1e-6, short, key_heads), (qkv[:1, :3].clone().requires_grad_(),)
    )


GPA_KERNELS = [("naive", 5), ("chunk", 5), ("chunk", 7), ("triton", 5), ("auto-scalar", 5), ("auto-scalar", 7)]


@pytest.mark.parametrize("masks", sorted(MASKS))
@pytest.mark.parametrize("kernel, l_q", GPA_KERNELS)
@pytest.mark.parametrize("key_heads", [1, 2])
def test_gpa_kernels_take_grouped_keys_as_their_repeats(kernel, l_q, key_heads, masks, monkeypatch):
    """Every GPA kernel (and the scalar score's SDPA path, bivector=False) on grouped k / v equals the naive
    reference on k / v repeated per query head, forward and every gradient (dgamma per query head; dk and dv the
    group sums of the repeated ones): float64, Triton in float32 under the interpreter against the float64
    reference at eps scale. Chunks of 2 queries and 3 keys: several panels and key blocks per call."""
    if kernel == "triton" and not HAS_TRITON:
        pytest.skip("triton is not installed")
    monkeypatch.setattr("zpx_hf.ops_gpa_chunk.PANEL", 2)
    monkeypatch.setattr("zpx_hf.ops_gpa_chunk.BLOCK", 3)
    key_padding_mask, document_ids = MASKS[masks]
    dtype = torch.float32 if kernel == "triton" else torch.float64
    bivector = kernel != "auto-scalar"
    generator = torch.Generator().manual_seed(4)
    query, key, value = (torch.randn(2, h, n, 32, dtype=torch.float64, generator=generator) / 3 for h, n in
                         ((4, l_q), (key_heads, 7), (key_heads, 7)))  # fmt: skip
    gamma = torch.tensor([0.3, -0.2, 0.5, 0.1], dtype=torch.float64)
    inputs = [x.to(dtype).requires_grad_() for x in (query, key, value, gamma)]
    options = dict(causal=True, key_padding_mask=key_padding_mask, document_ids=document_ids, bivector=bivector)
    op = functools.partial(geometric_product_attention, **options)
    differentiated = 4 if bivector else 3  # gamma is unused by the scalar score
    assert_grouped_equals_repeated(
        op, kernel.split("-")[0], inputs, (query, key, value, gamma), differentiated, generator
    )
