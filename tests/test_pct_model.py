"""PCT-specific model behaviour: complex blocks, width convention, initialisation, padding, LoRA, GPU.

The contract every family keeps (caches, padding, remote code, round trips, bad input) is in
test_model_contract.py.
"""

import json
import math

import pytest
import torch
from conftest import assert_close_eps, make_tiny_config

from zpx_hf import PCTConfig, PCTForCausalLM, PCTModel
from zpx_hf.modeling_complex import ComplexLinear, ComplexRMSNorm, ModReLU, mod_relu, mod_relu_naive
from zpx_hf.modeling_pct import query_key_value, query_key_value_naive, rotation_tables


def tiny_config(**overrides):
    return make_tiny_config("pct", **overrides)


def to_complex(x):
    half = x.shape[-1] // 2
    return torch.complex(x[..., :half].double(), x[..., half:].double())


def test_complex_blocks_match_complex_arithmetic():
    torch.manual_seed(0)
    linear = ComplexLinear(6, 5, bias=True).double()
    z = torch.randn(3, 12, dtype=torch.float64)
    weight = torch.complex(linear.real.weight.double(), linear.imag.weight.double())
    a, b = linear.real.bias.double(), linear.imag.bias.double()
    expected = to_complex(z) @ weight.T + torch.complex(a - b, a + b)
    assert (to_complex(linear(z)) - expected).abs().max() < 1e-12

    norm = ComplexRMSNorm(6, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(6) + 0.5)
    zc = to_complex(z)
    rms = torch.sqrt((zc.abs() ** 2).mean(-1, keepdim=True) + 1e-6)
    assert (to_complex(norm(z)) - norm.weight.double() * zc / rms).abs().max() < 1e-12

    act = ModReLU(6).double()
    with torch.no_grad():
        act.bias.copy_(torch.linspace(-1.5, 0.5, 6))
    out = to_complex(act(z))
    magnitude = torch.sqrt(zc.abs() ** 2 + 1e-6)
    expected = torch.relu(magnitude + act.bias.double()) * zc / magnitude
    assert (out - expected).abs().max() < 1e-12
    alive = out.abs() > 1e-6  # phase-preserving: surviving features keep their angle
    assert (torch.angle(out[alive]) - torch.angle(zc[alive])).abs().max() < 1e-10
    assert torch.isfinite(torch.autograd.functional.jacobian(act, torch.zeros(1, 12, dtype=torch.float64))).all()


def test_mod_relu_closed_form_backward_matches_autograd_and_finite_differences():
    """`mod_relu`'s backward (closed form) against finite differences and autograd through the formula
    (`mod_relu_naive`) in float64, with features on both sides of the relu; float32 and bfloat16 against the
    float64 gradients within a few eps of the dtype times the gradients' scale."""
    torch.manual_seed(0)
    z = torch.randn(3, 5, 16, dtype=torch.float64)
    bias = torch.linspace(-1.5, 0.5, 8, dtype=torch.float64)  # |z| ~ 1: some features dead, some alive
    grad = torch.randn(3, 5, 16, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b: mod_relu(a, b, 1e-6), (z[:1, :2].clone().requires_grad_(), bias.clone().requires_grad_())
    )

    def gradients(fn, dtype):
        zz, bb = (t.detach().to(dtype).clone().requires_grad_() for t in (z, bias))
        out = fn(zz, bb, 1e-6)
        out.backward(grad.to(dtype))
        return out.double(), zz.grad.double(), bb.grad.double()

    reference = gradients(mod_relu_naive, torch.float64)
    dead = (reference[0].unflatten(-1, (2, -1)) == 0).all(-2)
    assert dead.any() and (~dead).any()
    for one, two in zip(gradients(mod_relu, torch.float64), reference):
        torch.testing.assert_close(one, two, rtol=0, atol=1e-12)
    for dtype in (torch.float32, torch.bfloat16):
        eps = torch.finfo(dtype).eps
        for one, two in zip(gradients(mod_relu, dtype), reference):
            assert (one - two).abs().max() <= 8 * eps * two.abs().max()


@pytest.mark.parametrize("rotary", [True, False])
def test_query_key_value_closed_form_backward_matches_autograd(rotary):
    """`query_key_value` (normalise, rotate by r e^{i Theta}, split heads; closed-form backward): its forward
    equals complex arithmetic, its gradient equals finite differences and autograd through
    `query_key_value_naive` in float64, and float32's is within a few eps of float64's."""
    torch.manual_seed(0)
    batch, length, heads, dim = 2, 5, 3, 4
    qkv = torch.randn(batch, length, 2 * 3 * heads * dim, dtype=torch.float64)
    angle = torch.randn(batch, length, dim, dtype=torch.float64)
    radius = 1 + torch.rand(batch, length, dim, dtype=torch.float64)
    tables = rotation_tables(radius * angle.cos(), radius * angle.sin(), torch.float64) if rotary else None
    query, key, value = query_key_value(qkv, heads, dim, 1e-6, tables)
    parts = to_complex(qkv).view(batch, length, 3, heads, dim).permute(2, 0, 3, 1, 4)  # [(q, k, v), B, H, L, d]
    phase = (radius * torch.exp(1j * angle))[:, None] if rotary else 1.0
    for got, expected in ((query, parts[0]), (key, parts[1])):
        norm = torch.sqrt((expected.abs() ** 2).sum(-1, keepdim=True) + 1e-6)
        assert (to_complex(got) - expected / norm * phase).abs().max() < 1e-12
    assert (to_complex(value) - parts[2]).abs().max() == 0

    short = None if tables is None else tuple(t[:1, :, :3] for t in tables)
    assert torch.autograd.gradcheck(
        lambda x: query_key_value(x, heads, dim, 1e-6, short), (qkv[:1, :3].clone().requires_grad_(),)
    )
    grads = [torch.randn(batch, heads, length, 2 * dim, dtype=torch.float64) for _ in range(3)]

    def gradient(fn, dtype):
        x = qkv.detach().to(dtype).clone().requires_grad_()
        cast = None if tables is None else tuple(t.to(dtype) for t in tables)
        outputs = fn(x, heads, dim, 1e-6, cast)
        return torch.autograd.grad(outputs, x, [g.to(dtype) for g in grads])[0].double()

    reference = gradient(query_key_value_naive, torch.float64)
    torch.testing.assert_close(gradient(query_key_value, torch.float64), reference, rtol=0, atol=1e-12)
    error = (gradient(query_key_value, torch.float32) - reference).abs().max()
    assert error <= 16 * torch.finfo(torch.float32).eps * reference.abs().max()


def test_checkpoints_with_complex_widths_convert_on_load(tmp_path):
    """Earlier checkpoints counted widths in complex features; they load with the same modules."""
    config = tiny_config()
    config.save_pretrained(tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["width_unit"] == "real" and stored["hidden_size"] == 32
    del stored["width_unit"]
    stored.update(hidden_size=16, intermediate_size=32, head_dim=8)
    (tmp_path / "config.json").write_text(json.dumps(stored))
    legacy = PCTConfig.from_pretrained(tmp_path)
    assert (legacy.hidden_size, legacy.intermediate_size, legacy.head_dim) == (32, 64, 16)
    shapes = {k: v.shape for k, v in PCTModel(legacy).state_dict().items()}
    assert shapes == {k: v.shape for k, v in PCTModel(config).state_dict().items()}
    assert shapes["embed_tokens.weight"] == (61, 32)  # [re | im] of 16 complex features


def test_initialisation_recipe():
    # b_h = -log(train_context_length), whatever max_position_embeddings is (the length it may run at)
    model = PCTModel(tiny_config(max_position_embeddings=1024, train_context_length=128, tau="learnable"))
    attention = model.layers[0].self_attn
    torch.testing.assert_close(attention.gate_bias.data, torch.full((2,), -math.log(128)))
    torch.testing.assert_close(attention.tau.data, torch.full((2,), math.sqrt(8)))  # complex head dim d = 8
    assert attention.log_tau is None and attention.fixed_tau is None
    default = PCTModel(tiny_config(max_position_embeddings=1024)).layers[0].self_attn  # package defaults
    torch.testing.assert_close(default.gate_bias.data, torch.full((2,), -math.log(512)))
    torch.testing.assert_close(default.log_tau.data, torch.full((2,), math.log(5.0)))
    assert default.tau is None and default.fixed_tau is None
    scaled = PCTModel(tiny_config(tau="log_learnable", tau_init=7.5)).layers[0].self_attn
    torch.testing.assert_close(scaled.temperature().detach(), torch.full((2,), 7.5))
    assert PCTModel(tiny_config(tau="inv_sqrt_d")).layers[0].self_attn.fixed_tau == pytest.approx(8**-0.5)
    assert PCTModel(tiny_config(gate_bias_init=-2.0)).layers[0].self_attn.gate_bias.data.eq(-2.0).all()


def test_padding_tokens_are_invisible():
    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config(gate_bias_init=-1.0)).eval()
    ids = torch.randint(3, 61, (1, 8))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    other = ids.clone()
    other[0, :3] = torch.tensor([7, 8, 9])
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask).logits[0, 3:]
        b = model(input_ids=other, attention_mask=mask).logits[0, 3:]
        alone = model(input_ids=ids[:, 3:]).logits[0]
    assert torch.equal(a, b)  # padded pairs contribute exactly 0
    torch.testing.assert_close(a, alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_cached_decoding_equals_full_forward_float64(implementation):
    """A 70-token prefill (Gauss's three GEMMs in every projection) then one token per step (the stacked-row
    GEMM with its kept weight): the logits of the full forward; and the full forward's gradients equal the
    reference attention's (`eager`)."""
    from zpx_hf.modeling_complex import GAUSS_MIN_ROWS

    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config(attention_bias=True, mlp_bias=True)).double()
    model.config._attn_implementation = implementation
    ids = torch.randint(3, 61, (2, 74))
    prefill = 70
    assert 2 * prefill >= GAUSS_MIN_ROWS
    with torch.no_grad():
        full = model(input_ids=ids).logits
        out = model(input_ids=ids[:, :prefill], use_cache=True)
        steps = [out.logits]
        for index in range(prefill, ids.shape[1]):
            out = model(input_ids=ids[:, index : index + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)

    grads = {}
    for name in ("sdpa", "eager"):
        model.config._attn_implementation = name
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        grads[name] = [p.grad.clone() for p in model.parameters()]
    for one, two in zip(grads["sdpa"], grads["eager"]):
        torch.testing.assert_close(one, two, rtol=0, atol=1e-10)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_left_padded_cached_decoding_equals_full_forward_float64(implementation):
    """A left-padded batch of 2 (a 3-token pad on row 0): token-by-token decoding with the cache (the
    single-query decode branch under `sdpa`) reproduces the full forward's logits on every real token."""
    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config(gate_bias_init=-1.0)).double()
    model.config._attn_implementation = implementation
    ids = torch.randint(3, 61, (2, 12))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    prefill = 5
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        out = model(input_ids=ids[:, :prefill], attention_mask=mask[:, :prefill], use_cache=True)
        steps = [out.logits]
        for index in range(prefill, ids.shape[1]):
            out = model(
                input_ids=ids[:, index : index + 1],
                attention_mask=mask[:, : index + 1],
                past_key_values=out.past_key_values,
                use_cache=True,
            )
            steps.append(out.logits)
    real = mask.bool()
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], rtol=0, atol=1e-10)


def test_lora_on_complex_projections_trains_and_merges():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    # a base with a realistic weight scale (at std 0.02 the frozen head caps every logit near 0.6)
    model = PCTForCausalLM(tiny_config(gate_bias_init=-1.0, initializer_range=0.1))
    base = {k: v.clone() for k, v in model.state_dict().items()}
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["real", "imag"], lora_dropout=0.0)
    model = peft.get_peft_model(model, lora)
    wrapped = {n for n, _ in model.named_modules() if n.endswith(("q_proj.real", "v_proj.imag", "up_proj.real"))}
    assert len(wrapped) == 6
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    ids = torch.randint(3, 61, (4, 12))
    losses = []
    for _ in range(20):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0
    model.eval()
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        merged = model.merge_and_unload()
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted, rtol=0, atol=1e-4)
    changed = [k for k, v in merged.state_dict().items() if not torch.equal(v, base[k])]
    assert changed and all(k.endswith((".real.weight", ".imag.weight")) for k in changed)


def test_odd_complex_head_dim_is_valid_with_rotary():
    """Each complex feature is one rotary pair, so an odd complex head dim is fine for PCT."""
    config = tiny_config(head_dim=14, rotary="srpe")
    assert config.complex_head_dim == 7 and config.rotary_dim == 14
    logits = PCTForCausalLM(config)(input_ids=torch.tensor([[3, 4, 5]])).logits
    assert torch.isfinite(logits).all()


@pytest.mark.gpu
def test_cuda_bf16_model_dispatches_to_triton_and_matches_reference():
    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config(hidden_size=64, tau="learnable")).cuda().to(torch.bfloat16).train()
    ids = torch.randint(3, 61, (2, 300), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :17] = 0
    losses, grads = {}, {}
    for kernel in ("sdpa", "eager"):
        model.set_attn_implementation(kernel)
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        losses[kernel] = loss.float()
        grads[kernel] = model.model.layers[0].self_attn.q_proj.real.weight.grad.float().clone()
    torch.testing.assert_close(losses["sdpa"], losses["eager"], rtol=2e-2, atol=0)
    assert torch.isfinite(grads["sdpa"]).all()
    cosine = torch.nn.functional.cosine_similarity(grads["sdpa"].flatten(), grads["eager"].flatten(), dim=0)
    assert cosine > 0.99


def test_generate_keeps_derived_weights_for_one_call_only():
    """Inside `generate` the stacked projection weights and norm gains are built once; a later call must see
    parameters changed in between, also through `.data` (no version trace, as PEFT's merge writes)."""
    import copy

    from zpx_hf.modeling_blocks import derived_weight, keep_derived_weights

    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config()).double().eval()
    ids = torch.randint(3, 50, (1, 5))

    def scores(m):
        out = m.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0,
                         output_scores=True, return_dict_in_generate=True)  # fmt: skip
        return torch.stack(out.scores)

    before = scores(model)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data.add_(0.05 * torch.randn_like(parameter))
    after = scores(model)
    fresh = scores(copy.deepcopy(model))  # new modules: nothing kept from an earlier call
    assert not torch.allclose(after, before)
    assert_close_eps(after, fresh, ulps=64)

    built = []
    with keep_derived_weights():
        with torch.no_grad():
            kept = [derived_weight(("k",), lambda: built.append(1) or torch.ones(1)) for _ in range(3)]
        assert len(built) == 1 and kept[0] is kept[2]
        derived_weight(("k",), lambda: built.append(1) or torch.ones(1))  # gradients on: built, not kept
    assert len(built) == 2
    with torch.no_grad():
        derived_weight(("k",), lambda: built.append(1) or torch.ones(1))  # outside `generate`: built every call
    assert len(built) == 3
