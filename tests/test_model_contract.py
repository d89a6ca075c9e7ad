"""The model contract every family keeps, parametrised over `zpx_hf.FAMILIES` (and each Versor mixer).

Generation with and without cache, padding, the two attention implementations computing one function,
attention outputs, remote code, round trips, gradient checkpointing, losses, mixed precision and bad input.
"""

import json
import warnings

import pytest
import torch
from conftest import FAMILY_CASES, TINY_CONFIGS, TINY_VOCAB, assert_close_eps, make_tiny_config
from helpers_remote import run_remote_code
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

import zpx_hf

CASES = list(TINY_CONFIGS)


def causal_lm(case, implementation="sdpa", dtype=torch.float32, seed=0, **overrides):
    torch.manual_seed(seed)
    config = make_tiny_config(case, **overrides)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
    return model.to(dtype).eval()


def greedy_without_cache(model, input_ids, steps):
    ids = input_ids
    for _ in range(steps):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=-1)
    return ids


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("case", CASES)
def test_cached_greedy_generation_equals_recomputation(case, implementation):
    model = causal_lm(case, implementation, dtype=torch.float64)
    prompt = torch.randint(3, TINY_VOCAB, (2, 5))
    with torch.no_grad():
        cached = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
        expected = greedy_without_cache(model, prompt, 8)
    assert torch.equal(cached, expected)


@pytest.mark.parametrize("case", ["zpx", "pct"])
def test_static_cache_generation_equals_dynamic(case):
    """ZPX's static cache holds the augmented keys k^ (width d + 5C); PCT's the normalised [re | im] keys."""
    model = causal_lm(case, dtype=torch.float64)
    prompt = torch.randint(3, TINY_VOCAB, (2, 5))
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0
    with torch.no_grad():
        static = model.generate(
            prompt,
            attention_mask=mask,
            max_new_tokens=6,
            do_sample=False,
            cache_implementation="static",
            pad_token_id=0,
        )
        dynamic = model.generate(prompt, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(static, dynamic)


def test_versor_static_cache_request_falls_back_with_a_warning():
    model = causal_lm("versor-hybrid")
    prompt = torch.randint(3, TINY_VOCAB, (1, 5))
    with torch.no_grad():
        with pytest.warns(UserWarning, match="cache_implementation='static' is ignored by Versor"):
            static = model.generate(
                prompt, max_new_tokens=4, do_sample=False, cache_implementation="static", pad_token_id=0
            )
        plain = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(static, plain)


@pytest.mark.parametrize("case", CASES)
def test_incremental_logits_match_full_forward_with_left_padding(case):
    model = causal_lm(case, dtype=torch.float64)
    ids = torch.randint(3, TINY_VOCAB, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding of the first row
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        out = model(input_ids=ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
        steps = [out.logits]
        cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
        for t in range(6, 9):
            out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache)
            cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
            steps.append(out.logits)
    incremental = torch.cat(steps, dim=1)
    real = mask.bool()
    torch.testing.assert_close(incremental[real], full[real], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("case", CASES)
def test_eager_and_sdpa_compute_one_function(case):
    """Forward and every parameter gradient agree in float64, switching with `set_attn_implementation`."""
    model = causal_lm(case, "eager", dtype=torch.float64)
    ids = torch.randint(3, TINY_VOCAB, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0

    def run():
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=ids)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.logits.detach(), grads

    logits_eager, grads_eager = run()
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"
    logits_sdpa, grads_sdpa = run()
    torch.testing.assert_close(logits_sdpa, logits_eager, rtol=1e-9, atol=1e-10)
    assert grads_sdpa.keys() == grads_eager.keys()
    for name in grads_eager:
        torch.testing.assert_close(grads_sdpa[name], grads_eager[name], rtol=1e-7, atol=1e-10, msg=name)


@pytest.mark.parametrize("case", CASES)
def test_output_attentions_returns_weights_without_changing_outputs(case):
    model = causal_lm(case, "sdpa", dtype=torch.float64)
    ids = torch.randint(3, TINY_VOCAB, (2, 7))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with_weights = model(input_ids=ids, output_attentions=True)
    torch.testing.assert_close(with_weights.logits, plain, rtol=1e-12, atol=1e-12)
    assert len(with_weights.attentions) == model.config.num_hidden_layers
    mixers = [getattr(layer, "mixer_type", "attention") for layer in model.model.layers]
    for mixer, weights in zip(mixers, with_weights.attentions):
        if mixer == "rra":  # a rotor accumulator has no attention matrix
            assert weights is None
        else:
            assert weights.shape == (2, model.config.num_attention_heads, 7, 7)
            assert torch.all(weights.triu(1) == 0)  # causal


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_remote_code_checkpoint_loads_without_zpx_hf(case, tmp_path):
    model = causal_lm(case)
    model.save_pretrained(tmp_path / "ckpt")
    auto_map = json.loads((tmp_path / "ckpt" / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification"}
    ids = torch.randint(3, TINY_VOCAB, (1, 6))
    result = run_remote_code(tmp_path / "ckpt", "AutoModelForCausalLM", {"input_ids": ids}, tmp_path)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    assert result["class"] == type(model).__name__
    # Same weights, same code, another process: equal up to float32 rounding (a subprocess may pick another
    # thread count and so another summation order); the weights' bit-exact round trip is tested below.
    tolerance = 64 * torch.finfo(expected.dtype).eps * expected.abs().max().item()
    torch.testing.assert_close(result["output"], expected, rtol=0, atol=tolerance)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_auto_classes_and_bit_exact_round_trip(case, tmp_path):
    model = causal_lm(case)
    model.save_pretrained(tmp_path / "ckpt")
    assert not list((tmp_path / "ckpt").glob("*.bin")), "safetensors only"
    saved = load_file(tmp_path / "ckpt" / "model.safetensors")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    for name, tensor in reloaded.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name]), name
    ids = torch.randint(3, TINY_VOCAB, (2, 6))
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)
    backbone = AutoModel.from_pretrained(tmp_path / "ckpt")
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "ckpt", num_labels=3)
    assert type(backbone).__name__.endswith("Model")
    assert type(classifier).__name__.endswith("ForSequenceClassification")


@pytest.mark.parametrize("case", CASES)
def test_gradient_checkpointing_gives_same_gradients(case):
    model = causal_lm(case, dtype=torch.float64).train()
    ids = torch.randint(3, TINY_VOCAB, (2, 8))

    def grads():
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    model.gradient_checkpointing_enable()
    checkpointed = grads()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_sequence_classification_pools_last_real_token(case):
    torch.manual_seed(0)
    config = make_tiny_config(case, num_labels=3)
    model = AutoModelForSequenceClassification.from_config(config).double().eval()
    ids = torch.randint(3, TINY_VOCAB, (1, 5))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 5), torch.zeros(1, 3)], dim=1).long()
    with torch.no_grad():
        alone = model(input_ids=ids).logits
        out = model(input_ids=padded, attention_mask=mask, labels=torch.tensor([2]))
    torch.testing.assert_close(out.logits, alone, rtol=1e-10, atol=1e-12)
    # transformers' losses run in float32 whatever the model dtype
    expected = torch.nn.functional.cross_entropy(out.logits.float(), torch.tensor([2]))
    torch.testing.assert_close(out.loss, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_shift_labels_are_the_targets(case):
    """`shift_labels` (Trainer under context parallelism, padding-free collators) are used as given."""
    model = causal_lm(case, dtype=torch.float64)
    ids = torch.randint(3, TINY_VOCAB, (2, 8))
    shifted = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    other = torch.randint(3, TINY_VOCAB, (2, 8))
    with torch.no_grad():
        from_labels = model(input_ids=ids, labels=ids).loss
        from_shift = model(input_ids=ids, shift_labels=shifted).loss
        from_other = model(input_ids=ids, labels=ids, shift_labels=other).loss
        logits = model(input_ids=ids).logits
    assert_close_eps(from_shift, from_labels, ulps=4)
    # transformers' causal-LM loss runs in float32 whatever the model dtype
    expected = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), other.reshape(-1))
    torch.testing.assert_close(from_other, expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="shift_labels"):
        model(input_ids=ids, shift_labels=other[:, :5])


@pytest.mark.parametrize("case", CASES)
def test_bf16_autocast_trains_close_to_fp32(case):
    """Ten AdamW steps under CPU bf16 autocast stay finite and within 3% of the fp32 losses (bf16 keeps 8
    mantissa bits; the algebra that needs fp32 runs in fp32 inside the ops)."""

    def train(autocast):
        model = causal_lm(case, seed=1).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(2)
        losses = []
        for _ in range(10):
            ids = torch.randint(3, TINY_VOCAB, (4, 16), generator=generator)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        assert all(torch.isfinite(p).all() for p in model.parameters())
        return torch.tensor(losses)

    fp32, bf16 = train(False), train(True)
    assert torch.isfinite(bf16).all()
    assert torch.all((bf16 - fp32).abs() <= 0.03 * fp32), (fp32, bf16)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_bad_inputs_fail_early_with_named_argument(case):
    model = causal_lm(case, allow_longer_positions=False, max_position_embeddings=16)
    ids = torch.randint(3, TINY_VOCAB, (2, 6))
    width = model.get_input_embeddings().weight.shape[-1]
    bad = [
        (dict(input_ids=ids.float()), "input_ids"),
        (dict(input_ids=ids[0]), "input_ids"),
        (dict(input_ids=ids + TINY_VOCAB), "input_ids"),
        (dict(input_ids=ids, inputs_embeds=torch.zeros(2, 6, width)), "exactly one"),
        (dict(inputs_embeds=torch.zeros(2, 6, width + 1)), "inputs_embeds"),
        (dict(inputs_embeds=torch.full((2, 6, width), float("nan"))), "inputs_embeds"),
        (dict(input_ids=ids, attention_mask=torch.ones(2, 5)), "attention_mask"),
        (dict(input_ids=ids, attention_mask=torch.full((2, 6), 2)), "attention_mask"),
        (dict(input_ids=ids, attention_mask=torch.full((2, 6), 0.5)), "attention_mask"),
        (dict(input_ids=ids, attention_mask=torch.full((2, 6), float("-inf"))), "attention_mask"),
        (dict(input_ids=ids, position_ids=torch.arange(20, 26)[None].expand(2, -1)), "position_ids"),
        (dict(input_ids=ids, position_ids=torch.arange(6)[None, :5]), "position_ids"),
        (dict(input_ids=ids, position_ids=torch.arange(-1, 5)[None].expand(2, -1)), "position_ids"),
        (dict(input_ids=torch.randint(3, TINY_VOCAB, (1, 17))), "max_position_embeddings"),
    ]
    for kwargs, match in bad:
        with pytest.raises(ValueError, match=match):
            model(**kwargs)


BAD_CONFIGS = [
    ("zpx", "lambda_angle", float("inf")),
    ("zpx", "lambda_sphere", float("nan")),
    ("zpx", "max_log_radius", float("inf")),
    ("zpx", "rope_theta", float("inf")),
    ("zpx", "max_position_embeddings", 10**12),
    ("zpx", "phase_channels", 0),
    ("zpx", "head_dim", 7),
    ("zpx", "max_log_radius", 0.0),
    ("zpx", "center_loss_weight", -1.0),
    ("zpx", "num_hidden_layers", 0),
    ("zpx", "rotary", "alibi"),
    ("pct", "tau", float("inf")),
    ("pct", "tau", "sqrt"),
    ("pct", "attention_dropout", 0.1),
    ("pct", "srpe_a", 1.0),
    ("versor-hybrid", "gpa_gamma_init", float("inf")),
    ("versor-hybrid", "rra_bivector_scale", float("inf")),
    ("versor-hybrid", "mixer", "mamba"),
    ("versor-hybrid", "hidden_size", 100),
    ("versor-hybrid", "rotary", "rope"),
]


@pytest.mark.parametrize("case,field,value", BAD_CONFIGS)
def test_bad_configs_name_the_field(case, field, value):
    with pytest.raises(ValueError, match=f"`{field}`"):
        make_tiny_config(case, **{field: value})


# ZPX is softmax attention on q^ . k^: softmax engines serve it (tests/test_deploy_serving.py)
@pytest.mark.parametrize("case", [case for case in FAMILY_CASES if case != "zpx"])
def test_softmax_kernels_of_other_models_are_refused(case):
    config = make_tiny_config(case)
    with pytest.raises((ValueError, ImportError)):
        AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention")
    model = causal_lm(case)
    model.config._attn_implementation = "flash_attention_2"  # bypassing HF's checks must still fail clearly
    with pytest.raises(ValueError, match="attn_implementation"):
        model(input_ids=torch.randint(3, TINY_VOCAB, (1, 4)))


@pytest.mark.parametrize(
    "config_class,field", [(zpx_hf.PCTConfig, "attention_kernel"), (zpx_hf.VersorConfig, "gpa_kernel")]
)
def test_removed_kernel_fields_load_and_warn(config_class, field):
    with pytest.warns(UserWarning, match=field):
        config = config_class(**{field: "triton"})
    assert not hasattr(config, field)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config_class(**{field: "auto"})  # the old default loads silently
