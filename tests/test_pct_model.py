"""PCT models through the HF APIs: complex blocks, cache, kernels, remote code, LoRA, errors."""

import json
import math

import pytest
import torch
from helpers_remote import run_remote_code
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from zpx_hf import PCTConfig, PCTForCausalLM, PCTForSequenceClassification, PCTModel
from zpx_hf.modeling_blocks import CACHE_FIELD
from zpx_hf.modeling_complex import ComplexLinear, ComplexRMSNorm, ModReLU
from zpx_hf.ops_pct import HAS_TRITON


def tiny_config(**overrides):
    base = dict(
        vocab_size=61,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
    )
    base.update(overrides)
    return PCTConfig(**base)


def to_complex(x):
    half = x.shape[-1] // 2
    return torch.complex(x[..., :half].double(), x[..., half:].double())


def test_complex_blocks_match_complex_arithmetic():
    torch.manual_seed(0)
    linear = ComplexLinear(6, 5, bias=True)
    z = torch.randn(3, 12)
    weight = torch.complex(linear.real.weight.double(), linear.imag.weight.double())
    a, b = linear.real.bias.double(), linear.imag.bias.double()
    expected = to_complex(z) @ weight.T + torch.complex(a - b, a + b)
    assert (to_complex(linear(z)) - expected).abs().max() < 1e-6

    norm = ComplexRMSNorm(6, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(6) + 0.5)
    zc = to_complex(z)
    rms = torch.sqrt((zc.abs() ** 2).mean(-1, keepdim=True) + 1e-6)
    assert (to_complex(norm(z)) - norm.weight.double() * zc / rms).abs().max() < 1e-6

    act = ModReLU(6)
    with torch.no_grad():
        act.bias.copy_(torch.linspace(-1.5, 0.5, 6))
    out = to_complex(act(z))
    magnitude = torch.sqrt(zc.abs() ** 2 + 1e-6)
    expected = torch.relu(magnitude + act.bias.double()) * zc / magnitude
    assert (out - expected).abs().max() < 1e-6
    alive = out.abs() > 1e-6  # phase-preserving: surviving features keep their angle
    assert (torch.angle(out[alive]) - torch.angle(zc[alive])).abs().max() < 1e-5
    assert torch.isfinite(torch.autograd.functional.jacobian(act, torch.zeros(1, 12))).all()


def test_initialisation_recipe():
    model = PCTModel(tiny_config(max_position_embeddings=128, tau="learnable"))
    attention = model.layers[0].self_attn
    torch.testing.assert_close(attention.gate_bias.data, torch.full((2,), -math.log(128)))
    torch.testing.assert_close(attention.tau.data, torch.full((2,), math.sqrt(8)))
    assert PCTModel(tiny_config(tau="inv_sqrt_d")).layers[0].self_attn.fixed_tau == pytest.approx(8**-0.5)
    assert PCTModel(tiny_config(gate_bias_init=-2.0)).layers[0].self_attn.gate_bias.data.eq(-2.0).all()


def greedy_without_cache(model, input_ids, steps):
    ids = input_ids
    for _ in range(steps):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=-1)
    return ids


@pytest.mark.parametrize("rotary", ["srpe", "none"])
def test_greedy_generate_with_cache_equals_recomputation(rotary):
    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config(rotary=rotary, gate_bias_init=-1.0)).eval()
    model.generation_config.eos_token_id = None  # compare all steps, never stop early
    prompt = torch.randint(3, 61, (2, 5))
    with torch.no_grad():
        cached = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
        expected = greedy_without_cache(model, prompt, 10)
    assert torch.equal(cached, expected)


def test_incremental_logits_match_full_forward_with_left_padding():
    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config(gate_bias_init=-1.0)).eval()
    ids = torch.randint(3, 61, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids[0, :3] = 0
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        first = model(input_ids=ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
        cache = first[CACHE_FIELD]
        middle = model(input_ids=ids[:, 6:8], attention_mask=mask[:, :8], past_key_values=cache)
        last = model(input_ids=ids[:, 8:], attention_mask=mask, past_key_values=middle[CACHE_FIELD]).logits
    real = mask.bool()
    torch.testing.assert_close(first.logits[real[:, :6]], full[:, :6][real[:, :6]], rtol=0, atol=1e-5)
    torch.testing.assert_close(middle.logits, full[:, 6:8], rtol=0, atol=1e-5)
    torch.testing.assert_close(last, full[:, 8:], rtol=0, atol=1e-5)


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


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_kernel_inside_the_model_matches_reference():
    torch.manual_seed(0)
    reference = PCTForCausalLM(tiny_config(tau="learnable")).train()
    triton_model = PCTForCausalLM(tiny_config(tau="learnable", attention_kernel="triton")).train()
    triton_model.load_state_dict(reference.state_dict())
    ids = torch.randint(3, 61, (2, 21))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    losses = []
    for model in (reference, triton_model):
        out = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
        out.loss.backward()
        losses.append(out.loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-5)
    for (name, p_ref), (_, p_tri) in zip(reference.named_parameters(), triton_model.named_parameters()):
        torch.testing.assert_close(p_tri.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    triton_model.eval()
    reference.eval()
    triton_model.generation_config.eos_token_id = reference.generation_config.eos_token_id = None
    prompt = ids[:1, :4]
    with torch.no_grad():
        assert torch.equal(
            triton_model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0),
            reference.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0),
        )


def test_eager_forces_reference_and_unknown_implementation_fails(monkeypatch):
    config = tiny_config(attention_kernel="triton")
    config._attn_implementation = "eager"
    model = PCTForCausalLM(config)
    assert model.model.layers[0].self_attn.attention_kernel() == "reference"
    config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation"):
        model(input_ids=torch.tensor([[1, 2]]))


def test_remote_code_checkpoint_loads_without_zpx_hf(tmp_path):
    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config(tau="learnable")).eval()
    checkpoint = tmp_path / "ckpt"
    model.save_pretrained(checkpoint)
    files = {p.name for p in checkpoint.iterdir()}
    assert "model.safetensors" in files
    assert {"modeling_pct.py", "configuration_pct.py", "ops_pct.py", "modeling_complex.py"} <= files
    auto_map = json.loads((checkpoint / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForCausalLM"] == "modeling_pct.PCTForCausalLM"
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification"}

    ids = torch.randint(3, 61, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        expected = model(**inputs).logits
    remote = run_remote_code(checkpoint, "AutoModelForCausalLM", inputs, tmp_path)
    assert remote["class"] == "PCTForCausalLM"
    assert torch.equal(remote["output"], expected)


def test_auto_classes_round_trip_and_tied_head(tmp_path):
    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config(tie_word_embeddings=True))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), PCTConfig)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(reloaded) is PCTForCausalLM
    for key, value in model.state_dict().items():
        assert torch.equal(value, reloaded.state_dict()[key]), key
    assert type(AutoModel.from_pretrained(tmp_path)) is PCTModel
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert type(classifier) is PCTForSequenceClassification
    # tied head: logit_v = Re sum_m conj(e_vm) z_m
    ids = torch.randint(3, 61, (1, 5))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    z = to_complex(out.hidden_states[-1])
    embeddings = to_complex(model.model.embed_tokens.weight)
    expected = (z @ embeddings.conj().T).real
    assert (out.logits.double() - expected).abs().max() < 1e-5


def test_sequence_classification_pools_last_real_token():
    torch.manual_seed(0)
    model = PCTForSequenceClassification(tiny_config(num_labels=3)).eval()
    ids = torch.randint(3, 61, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    alone = model(input_ids=ids[1:, :5]).logits
    torch.testing.assert_close(out.logits[1:], alone, rtol=0, atol=1e-5)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert model.score.weight.grad.abs().sum() > 0


def test_gradient_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    ids = torch.randint(3, 61, (2, 8))
    model = PCTForCausalLM(tiny_config(tau="learnable")).train()
    model(input_ids=ids, labels=ids).loss.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model(input_ids=ids, labels=ids).loss.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, reference[name], msg=lambda m, name=name: f"{name}: {m}")


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


@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(tau="sqrt"), "tau"),
        (dict(tau=-1.0), "tau"),
        (dict(attention_kernel="flash"), "attention_kernel"),
        (dict(head_dim=0), "head_dim"),
        (dict(attention_dropout=0.1), "attention_dropout"),
        (dict(qk_norm_eps=0.0), "qk_norm_eps"),
        (dict(gate_bias_init=float("nan")), "gate_bias_init"),
        (dict(rotary="alibi"), "rotary"),
    ],
)
def test_bad_configs_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        tiny_config(**overrides)


def test_odd_complex_head_dim_is_valid_with_rotary():
    """Each complex feature is one rotary pair, so an odd complex head dim is fine for PCT."""
    config = tiny_config(head_dim=7, rotary="srpe")
    assert config.rotary_dim == 14
    logits = PCTForCausalLM(config)(input_ids=torch.tensor([[3, 4, 5]])).logits
    assert torch.isfinite(logits).all()


def test_bad_inputs_fail_early_with_named_argument():
    model = PCTForCausalLM(tiny_config(allow_longer_positions=False)).eval()
    with pytest.raises(ValueError, match="input_ids"):
        model(input_ids=torch.tensor([[1, 2, 99]]))
    with pytest.raises(ValueError, match="inputs_embeds"):
        model(inputs_embeds=torch.randn(1, 3, 16))  # needs 2 * hidden_size = 32 ([re | im])
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=torch.ones(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="causal"):
        PCTForCausalLM(tiny_config(causal=False))


@pytest.mark.gpu
def test_cuda_bf16_model_dispatches_to_triton_and_matches_reference():
    torch.manual_seed(0)
    model = PCTForCausalLM(tiny_config(hidden_size=64, tau="learnable")).cuda().to(torch.bfloat16).train()
    ids = torch.randint(3, 61, (2, 300), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :17] = 0
    losses, grads = {}, {}
    for kernel in ("auto", "reference"):
        model.config.attention_kernel = kernel
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        losses[kernel] = loss.float()
        grads[kernel] = model.model.layers[0].self_attn.q_proj.real.weight.grad.float().clone()
    torch.testing.assert_close(losses["auto"], losses["reference"], rtol=2e-2, atol=0)
    assert torch.isfinite(grads["auto"]).all()
    cosine = torch.nn.functional.cosine_similarity(grads["auto"].flatten(), grads["reference"].flatten(), dim=0)
    assert cosine > 0.99
