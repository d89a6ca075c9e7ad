"""Versor models: config validation, layers, cached generation, kernel paths, Auto classes, remote code."""

import pytest
import torch
from helpers_remote import run_remote_code
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

import zpx_hf  # noqa: F401  (registers the Auto classes)
from zpx_hf import VersorConfig, VersorForCausalLM, VersorForSequenceClassification, VersorModel
from zpx_hf.clifford_algebra import BIVECTOR_MASKS, rotor_exp_matrix, sandwich
from zpx_hf.modeling_blocks import CACHE_FIELD
from zpx_hf.modeling_versor import VersorCache, VersorLinear, VersorNorm
from zpx_hf.ops_gpa import HAS_TRITON

MIXERS = ("gpa", "rra", "hybrid")
ROTATION = [i for i, m in enumerate(BIVECTOR_MASKS) if not m & 16]


def tiny_config(**overrides) -> VersorConfig:
    kwargs = dict(
        vocab_size=40,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
    )
    kwargs.update(overrides)
    return VersorConfig(**kwargs)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("hidden_size", 100, "multiple of 32"),
        ("intermediate_size", 100, "multiple of 32"),
        ("num_attention_heads", 3, "head_dim"),
        ("rotary", "srpe", "rotary='none'"),
        ("mixer", "mamba", "mixer"),
        ("gpa_kernel", "flash", "gpa_kernel"),
        ("rra_kernel", "cuda", "rra_kernel"),
        ("rra_accumulate", "partial", "rra_accumulate"),
        ("rra_bivector_scale", 0.0, "rra_bivector_scale"),
    ],
)
def test_config_errors_name_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**{field: value})


def test_config_defaults_and_layers():
    config = VersorConfig()
    assert config.model_type == "versor" and config.rotary == "none"
    assert config.num_channels == config.hidden_size // 32
    assert [config.layer_mixer(i) for i in range(4)] == ["rra", "gpa", "rra", "gpa"]
    model = VersorModel(tiny_config(mixer="hybrid"))
    assert [layer.mixer_type for layer in model.layers] == ["rra", "gpa"]


def test_grade_aware_layers_commute_with_rotations():
    # VersorLinear mixes channels per grade: it commutes with any grade-preserving map applied to every
    # channel (a rotor sandwich); VersorNorm's coefficient norms are invariant under the compact rotors.
    torch.manual_seed(0)
    bivector = torch.zeros(10)
    bivector[ROTATION] = torch.randn(6)
    rotor = rotor_exp_matrix(bivector)
    x = torch.randn(3, 5, 32)
    linear = VersorLinear(5, 4)
    torch.nn.init.normal_(linear.weight)
    norm = VersorNorm(5)
    torch.nn.init.normal_(norm.weight)
    with torch.no_grad():
        torch.testing.assert_close(linear(sandwich(rotor, x)), sandwich(rotor, linear(x)), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(norm(sandwich(rotor, x)), sandwich(rotor, norm(x)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mixer", MIXERS)
def test_forward_backward_and_outputs(mixer):
    torch.manual_seed(0)
    model = VersorForCausalLM(tiny_config(mixer=mixer))
    ids = torch.randint(3, 40, (2, 7))
    out = model(ids, labels=ids, output_hidden_states=True, output_attentions=True)
    assert out.logits.shape == (2, 7, 40)
    assert len(out.hidden_states) == 3 and out.hidden_states[-1].shape == (2, 7, 128)
    gpa_layers = [i for i in range(2) if model.config.layer_mixer(i) == "gpa"]
    for i in range(2):
        assert (out.attentions[i] is not None) == (i in gpa_layers)
    out.loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values()), [
        n for n, g in grads.items() if g is None
    ]


@pytest.mark.parametrize("mixer", MIXERS)
def test_cached_generation_equals_uncached(mixer):
    torch.manual_seed(1)
    model = VersorForCausalLM(tiny_config(mixer=mixer)).eval()
    ids = torch.randint(3, 40, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        prefill = model(ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
        cache = prefill[CACHE_FIELD]
        assert isinstance(cache, VersorCache) and cache.get_seq_length() == 6
        steps = [prefill.logits]
        for t in range(6, 11):
            out = model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], use_cache=True, **{CACHE_FIELD: cache})
            cache = out[CACHE_FIELD]
            steps.append(out.logits)
    valid = mask.bool()
    torch.testing.assert_close(torch.cat(steps, 1)[valid], full[valid], rtol=1e-4, atol=1e-5)
    for layer, mixer_type in enumerate(cache.mixers):
        if mixer_type == "rra":  # recurrent layers keep the rotor only: O(1) state, no KV growth
            assert cache.keys[layer] is None and cache.rotors[layer].shape == (2, 2, 2, 4, 4)
        else:
            assert cache.keys[layer].shape == (2, 2, 11, 64) and cache.rotors[layer] is None

    generated = model.generate(ids[:, :5], attention_mask=mask[:, :5], max_new_tokens=6, do_sample=False)
    uncached = model.generate(
        ids[:, :5], attention_mask=mask[:, :5], max_new_tokens=6, do_sample=False, use_cache=False
    )
    assert torch.equal(generated, uncached)
    # greedy continuation equals argmax of full forwards
    sequence = ids[:1, :5]
    with torch.no_grad():
        for _ in range(6):
            next_token = model(sequence).logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat((sequence, next_token), 1)
    assert torch.equal(model.generate(ids[:1, :5], max_new_tokens=6, do_sample=False), sequence)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_kernel_paths_agree_inside_the_model():
    torch.manual_seed(2)
    base = VersorForCausalLM(tiny_config(mixer="hybrid")).eval()
    ids = torch.randint(3, 40, (2, 9))
    reference = base(ids).logits
    for overrides in (
        {"gpa_kernel": "triton", "rra_kernel": "triton"},
        {"gpa_kernel": "reference", "rra_kernel": "sequential"},
        {"gpa_bivector": False},
    ):
        model = VersorForCausalLM(tiny_config(mixer="hybrid", **overrides)).eval()
        model.load_state_dict(base.state_dict())
        logits = model(ids).logits
        if overrides.get("gpa_bivector") is False:
            assert not torch.allclose(logits, reference)  # the bivector term matters
        else:
            torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-5)
    # padded batches: the kernel with key padding equals the reference with the dense mask
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    padded = VersorForCausalLM(tiny_config(mixer="hybrid", gpa_kernel="triton", rra_kernel="triton")).eval()
    padded.load_state_dict(base.state_dict())
    valid = mask.bool()
    torch.testing.assert_close(
        padded(ids, attention_mask=mask).logits[valid],
        base(ids, attention_mask=mask).logits[valid],
        rtol=1e-4,
        atol=1e-5,
    )
    # gradients through the Triton kernels match the reference path
    triton_model = VersorForCausalLM(tiny_config(mixer="hybrid", gpa_kernel="triton", rra_kernel="triton"))
    triton_model.load_state_dict(base.state_dict())
    base.train()
    triton_model.train()
    base(ids, labels=ids).loss.backward()
    triton_model(ids, labels=ids).loss.backward()
    for (name, p), q in zip(base.named_parameters(), triton_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=name)


def test_sequence_classification_and_auto_classes(tmp_path):
    torch.manual_seed(3)
    config = tiny_config(num_labels=3)
    assert isinstance(AutoModel.from_config(config), VersorModel)
    assert isinstance(AutoModelForCausalLM.from_config(config), VersorForCausalLM)
    classifier = AutoModelForSequenceClassification.from_config(config)
    assert isinstance(classifier, VersorForSequenceClassification)
    ids = torch.randint(3, 40, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, 4:] = 0
    out = classifier(ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and torch.isfinite(out.loss)
    classifier.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "versor"
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    classifier.eval()
    torch.testing.assert_close(reloaded(ids, attention_mask=mask).logits, classifier(ids, attention_mask=mask).logits)


def test_remote_code_reload_without_zpx_hf(tmp_path):
    torch.manual_seed(4)
    model = VersorForCausalLM(tiny_config(mixer="hybrid")).eval()
    checkpoint = tmp_path / "ckpt"
    model.save_pretrained(checkpoint)
    files = {p.name for p in checkpoint.iterdir()}
    assert {"modeling_versor.py", "configuration_versor.py", "ops_gpa.py", "ops_rra.py", "clifford_algebra.py"} <= files
    inputs = {"input_ids": torch.randint(3, 40, (2, 8))}
    result = run_remote_code(checkpoint, "AutoModelForCausalLM", inputs, tmp_path)
    assert result["class"] == "VersorForCausalLM"
    with torch.no_grad():
        expected = model(**inputs).logits
    torch.testing.assert_close(result["output"], expected, rtol=0, atol=0)


def test_gradient_checkpointing_matches():
    torch.manual_seed(5)
    model = VersorForCausalLM(tiny_config(mixer="hybrid"))
    ids = torch.randint(3, 40, (2, 6))
    model(ids, labels=ids).loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing_enable()
    model.train()
    model(ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)


def test_beam_search_and_sampling_with_the_recurrent_cache():
    torch.manual_seed(6)
    model = VersorForCausalLM(tiny_config(mixer="hybrid")).eval()
    ids = torch.randint(3, 40, (2, 5))
    beams = model.generate(ids, max_new_tokens=4, num_beams=3, do_sample=False)
    assert torch.equal(beams, model.generate(ids, max_new_tokens=4, num_beams=3, do_sample=False, use_cache=False))
    assert model.generate(ids, max_new_tokens=3, do_sample=True, num_return_sequences=2).shape == (4, 8)
