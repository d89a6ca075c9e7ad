"""ZPX models through the HF APIs: generation with cache, Llama equivalence, remote code, errors."""

import json

import pytest
import torch
from helpers_remote import run_remote_code
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
)

from zpx_hf import ZPXConfig, ZPXForCausalLM, ZPXForSequenceClassification, ZPXModel
from zpx_hf.modeling_blocks import CACHE_FIELD


def tiny_config(**overrides):
    base = dict(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        phase_channels=4,
        max_position_embeddings=64,
    )
    base.update(overrides)
    return ZPXConfig(**base)


def greedy_without_cache(model, input_ids, steps):
    ids = input_ids
    for _ in range(steps):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=-1)
    return ids


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("rotary", ["srpe", "none"])
def test_greedy_generate_with_cache_equals_recomputation(implementation, rotary):
    torch.manual_seed(0)
    config = tiny_config(rotary=rotary)
    config._attn_implementation = implementation
    model = ZPXForCausalLM(config).eval()
    prompt = torch.randint(3, 61, (2, 5))
    with torch.no_grad():
        cached = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        expected = greedy_without_cache(model, prompt, 12)
    assert torch.equal(cached, expected)


def test_incremental_logits_match_full_forward_with_left_padding():
    torch.manual_seed(0)
    model = ZPXForCausalLM(tiny_config()).eval()
    ids = torch.randint(3, 61, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids[0, :3] = 0
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        first = model(input_ids=ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
        cache = first[CACHE_FIELD]
        rest = model(input_ids=ids[:, 6:], attention_mask=mask, past_key_values=cache).logits
    real = mask.bool()
    torch.testing.assert_close(first.logits[real[:, :6]], full[:, :6][real[:, :6]], rtol=0, atol=1e-5)
    torch.testing.assert_close(rest, full[:, 6:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_zero_lambdas_with_rope_equal_llama(implementation):
    torch.manual_seed(0)
    config = tiny_config(lambda_angle=0.0, lambda_sphere=0.0, rotary="rope", rope_theta=10000.0)
    config._attn_implementation = implementation
    zpx = ZPXForCausalLM(config).eval()
    llama_config = LlamaConfig(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    llama = LlamaForCausalLM(llama_config).eval()
    missing, unexpected = llama.load_state_dict(zpx.state_dict(), strict=False)
    assert not missing
    assert all(".phase_encoder." in key for key in unexpected) and unexpected
    ids = torch.randint(3, 61, (2, 13))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        ours = zpx(input_ids=ids, attention_mask=mask).logits
        theirs = llama(input_ids=ids, attention_mask=mask, position_ids=torch.arange(13)[None].expand(2, -1)).logits
        ours_aligned = zpx(input_ids=ids, attention_mask=mask, position_ids=torch.arange(13)[None].expand(2, -1)).logits
    torch.testing.assert_close(ours_aligned[mask.bool()], theirs[mask.bool()], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=1e-5)


def test_remote_code_checkpoint_loads_without_zpx_hf(tmp_path):
    torch.manual_seed(0)
    model = ZPXForCausalLM(tiny_config()).eval()
    checkpoint = tmp_path / "ckpt"
    model.save_pretrained(checkpoint)
    files = {p.name for p in checkpoint.iterdir()}
    assert "model.safetensors" in files and not any(f.endswith(".bin") for f in files)
    assert {"modeling_zpx.py", "configuration_zpx.py", "ops_zpx.py", "modeling_blocks.py"} <= files
    auto_map = json.loads((checkpoint / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification"}

    ids = torch.randint(3, 61, (2, 7))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        expected = model(**inputs).logits
        backbone = model.model(**inputs).last_hidden_state
    remote = run_remote_code(checkpoint, "AutoModelForCausalLM", inputs, tmp_path)
    assert remote["class"] == "ZPXForCausalLM"
    assert torch.equal(remote["output"], expected)
    remote_base = run_remote_code(checkpoint, "AutoModel", inputs, tmp_path)
    assert remote_base["class"] == "ZPXModel"
    assert torch.equal(remote_base["output"], backbone)
    remote_cls = run_remote_code(checkpoint, "AutoModelForSequenceClassification", inputs, tmp_path)
    assert remote_cls["class"] == "ZPXForSequenceClassification"
    assert remote_cls["output"].shape == (2, 2)


def test_auto_classes_and_bit_exact_round_trip(tmp_path):
    torch.manual_seed(0)
    model = ZPXForCausalLM(tiny_config(tie_word_embeddings=True))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), ZPXConfig)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(reloaded) is ZPXForCausalLM
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    original, loaded = model.state_dict(), reloaded.state_dict()
    assert original.keys() == loaded.keys()
    for key in original:
        assert torch.equal(original[key], loaded[key]), key
    stored = load_file(tmp_path / "model.safetensors")
    assert "model.embed_tokens.weight" in stored
    assert type(AutoModel.from_pretrained(tmp_path)) is ZPXModel
    assert type(AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3)) is (
        ZPXForSequenceClassification
    )


def test_loss_includes_centre_term_and_phases_are_returned():
    torch.manual_seed(0)
    ids = torch.randint(3, 61, (2, 6))
    plain = ZPXForCausalLM(tiny_config())
    weighted = ZPXForCausalLM(tiny_config(center_loss_weight=0.01))
    weighted.load_state_dict(plain.state_dict())
    out_plain = plain(input_ids=ids, labels=ids, output_phases=True)
    out_weighted = weighted(input_ids=ids, labels=ids)
    torch.testing.assert_close(out_weighted.loss, out_plain.loss + 0.01 * out_plain.center_loss)
    assert len(out_plain.phases) == 2 and out_plain.phases[0].shape == (2, 6, 2, 4, 7)
    sphere = out_plain.phases[0][..., 3:6]
    torch.testing.assert_close(sphere.pow(2).sum(-1), torch.ones(2, 6, 2, 4))
    out_weighted.loss.backward()
    encoder = weighted.model.layers[0].self_attn.phase_encoder
    assert encoder.to_log_r.weight.grad is not None and encoder.to_log_r.weight.grad.abs().sum() > 0


def test_gradient_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    ids = torch.randint(3, 61, (2, 8))
    model = ZPXForCausalLM(tiny_config()).train()
    model(input_ids=ids, labels=ids).loss.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model(input_ids=ids, labels=ids).loss.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, reference[name], msg=lambda m, name=name: f"{name}: {m}")


def test_sequence_classification_pools_last_real_token():
    torch.manual_seed(0)
    model = ZPXForSequenceClassification(tiny_config(num_labels=3)).eval()
    ids = torch.randint(3, 61, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    alone = model(input_ids=ids[1:, :5]).logits
    torch.testing.assert_close(out.logits[1:], alone, rtol=0, atol=1e-5)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)


def test_bidirectional_encoder_sees_the_future():
    torch.manual_seed(0)
    model = ZPXModel(tiny_config(causal=False)).eval()
    ids = torch.randint(3, 61, (1, 6))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1 - 3) % 58 + 3
    first = model(input_ids=ids).last_hidden_state[0, 0]
    assert not torch.allclose(first, model(input_ids=changed).last_hidden_state[0, 0])
    with pytest.raises(ValueError, match="causal"):
        ZPXForCausalLM(tiny_config(causal=False))


@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(hidden_size=30, num_attention_heads=2), "head_dim"),
        (dict(head_dim=7), "head_dim"),
        (dict(rotary="alibi"), "rotary"),
        (dict(phase_channels=-1), "phase_channels"),
        (dict(phase_channels=0), "phase_channels"),
        (dict(max_log_radius=0.0), "max_log_radius"),
        (dict(center_loss_weight=-1.0), "center_loss_weight"),
        (dict(srpe_a=1.5), "srpe_a"),
        (dict(num_hidden_layers=0), "num_hidden_layers"),
        (dict(lambda_angle=float("nan")), "lambda_angle"),
    ],
)
def test_bad_configs_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        tiny_config(**overrides)


def test_bad_inputs_fail_early_with_named_argument():
    model = ZPXForCausalLM(tiny_config(allow_longer_positions=False)).eval()
    with pytest.raises(ValueError, match="input_ids"):
        model(input_ids=torch.tensor([[1, 2, 99]]))
    with pytest.raises(ValueError, match="inputs_embeds"):
        model(inputs_embeds=torch.full((1, 3, 32), float("nan")))
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=torch.ones(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="attn_implementation"):
        config = tiny_config()
        config._attn_implementation = "flex_attention"
        ZPXForCausalLM(config)(input_ids=torch.tensor([[1, 2]]))
