"""Versor-specific model behaviour: layers, grade equivariance, the recurrent cache in generation.

The contract every family keeps (caches, padding, remote code, round trips, bad input) is in
test_model_contract.py.
"""

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_config
from transformers import GenerationConfig

from zpx_hf import VersorConfig, VersorForCausalLM, VersorModel
from zpx_hf.clifford_algebra import BIVECTOR_MASKS, rotor_exp_matrix, sandwich
from zpx_hf.modeling_blocks import CACHE_FIELD
from zpx_hf.modeling_versor import VersorCache, VersorLinear, VersorNorm

MIXERS = ("gpa", "rra", "hybrid")
ROTATION = [i for i, m in enumerate(BIVECTOR_MASKS) if not m & 16]


def tiny_model(mixer: str, seed: int = 0, **overrides) -> VersorForCausalLM:
    torch.manual_seed(seed)
    return VersorForCausalLM(make_tiny_config(f"versor-{mixer}", **overrides)).eval()


def test_config_defaults_and_layers():
    config = VersorConfig()
    assert config.model_type == "versor" and config.rotary == "none"
    assert config.num_channels == config.hidden_size // 32
    assert [config.layer_mixer(i) for i in range(4)] == ["rra", "gpa", "rra", "gpa"]
    model = VersorModel(make_tiny_config("versor-hybrid"))
    assert [layer.mixer_type for layer in model.layers] == ["rra", "gpa"]


def test_grade_aware_layers_commute_with_rotations():
    # VersorLinear mixes channels per grade: it commutes with any grade-preserving map applied to every
    # channel (a rotor sandwich); VersorNorm's coefficient norms are invariant under the compact rotors.
    torch.manual_seed(0)
    bivector = torch.zeros(10, dtype=torch.float64)
    bivector[ROTATION] = torch.randn(6, dtype=torch.float64)
    rotor = rotor_exp_matrix(bivector)
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    linear = VersorLinear(5, 4).double()
    torch.nn.init.normal_(linear.weight)
    norm = VersorNorm(5).double()
    torch.nn.init.normal_(norm.weight)
    with torch.no_grad():
        torch.testing.assert_close(linear(sandwich(rotor, x)), sandwich(rotor, linear(x)), rtol=1e-10, atol=1e-12)
        flat = x.flatten(-2)
        rotated = sandwich(rotor, x).flatten(-2)
        expected = sandwich(rotor, norm(flat).unflatten(-1, (5, 32))).flatten(-2)
        torch.testing.assert_close(norm(rotated), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mixer", MIXERS)
def test_recurrent_layers_keep_only_the_rotor_state(mixer):
    model = tiny_model(mixer)
    ids = torch.randint(3, TINY_VOCAB, (2, 11))
    with torch.no_grad():
        cache = model(ids, use_cache=True)[CACHE_FIELD]
    assert isinstance(cache, VersorCache) and cache.get_seq_length() == 11
    for layer, mixer_type in enumerate(cache.mixers):
        if mixer_type == "rra":  # O(1) state per layer, no KV growth
            assert cache.keys[layer] is None and cache.rotors[layer] is not None
            assert cache.rotors[layer].numel() < ids.shape[1] * 32
        else:
            assert cache.keys[layer].shape == (2, 2, 11, 64) and cache.rotors[layer] is None


@pytest.mark.parametrize("mixer", ["rra", "hybrid"])
def test_generation_continues_from_returned_state_and_from_embeddings(mixer):
    model = tiny_model(mixer, seed=1)
    model.generation_config.eos_token_id = None
    prompt = torch.randint(3, TINY_VOCAB, (2, 5))
    with torch.no_grad():
        whole = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
        first = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
        state = first.past_key_values if hasattr(first, "past_key_values") else first[CACHE_FIELD]
        resumed = model.generate(
            first.sequences, past_key_values=state, max_new_tokens=4, do_sample=False, pad_token_id=0
        )
        embeds = model.get_input_embeddings()(prompt)
        from_embeds = model.generate(inputs_embeds=embeds, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(resumed, whole)
    assert torch.equal(from_embeds, whole[:, prompt.shape[1] :])


def test_assisted_decoding_is_refused_clearly():
    # The refusal must come from us on every supported transformers (5.25 dropped the `_is_stateful` hook and
    # then fails deep inside with "Assisted decoding requires a cache"), for each way to ask for it.
    model = tiny_model("hybrid")
    assistant = tiny_model("hybrid", seed=2)
    prompt = torch.randint(3, TINY_VOCAB, (1, 5))
    greedy = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    with pytest.raises(ValueError, match="stateful.*assistant model"):
        model.generate(prompt, assistant_model=assistant, **greedy)
    with pytest.raises(ValueError, match="set by assistant_model"):
        model.generate(prompt, None, None, None, None, None, assistant, **greedy)
    with pytest.raises(ValueError, match="set by prompt_lookup_num_tokens"):
        model.generate(prompt, prompt_lookup_num_tokens=2, **greedy)
    with pytest.raises(ValueError, match="set by prompt_lookup_num_tokens"):
        model.generate(prompt, generation_config=GenerationConfig(prompt_lookup_num_tokens=2, **greedy))


def test_beam_search_and_sampling_with_the_recurrent_cache():
    model = tiny_model("hybrid", seed=6)
    ids = torch.randint(3, TINY_VOCAB, (2, 5))
    beams = model.generate(ids, max_new_tokens=4, num_beams=3, do_sample=False)
    assert torch.equal(beams, model.generate(ids, max_new_tokens=4, num_beams=3, do_sample=False, use_cache=False))
    assert model.generate(ids, max_new_tokens=3, do_sample=True, num_return_sequences=2).shape == (4, 8)


@pytest.mark.parametrize("accumulate", ["compact", "full"])
@pytest.mark.parametrize("mixer", ["rra", "hybrid"])
def test_token_by_token_decode_equals_the_sequence_forward_float64(mixer, accumulate):
    # generation runs the lean single-token step (ops_rra_decode) through the cache; it must give the sequence
    # path's logits and rotor states, and the readable reference's (eager), with left padding in the batch
    # "full" at scale 1 leaves float32 within the tiny context (VersorConfig refuses it): scale 0.3, as test_inspect
    scale = 0.3 if accumulate == "full" else 1.0
    model = tiny_model(mixer, seed=3, rra_accumulate=accumulate, rra_bivector_scale=scale).double()
    ids = torch.randint(3, TINY_VOCAB, (2, 10))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    prefix = 4
    with torch.no_grad():
        whole = model(ids, attention_mask=mask, use_cache=True)
        model.set_attn_implementation("eager")
        reference = model(ids, attention_mask=mask).logits
        model.set_attn_implementation("sdpa")
        out = model(ids[:, :prefix], attention_mask=mask[:, :prefix], use_cache=True)
        cache, logits = out[CACHE_FIELD], [out.logits]
        for t in range(prefix, ids.shape[1]):
            out = model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache, use_cache=True)
            cache = out[CACHE_FIELD]
            logits.append(out.logits)
    decoded = torch.cat(logits, dim=1)
    torch.testing.assert_close(decoded, whole.logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(decoded, reference, rtol=1e-10, atol=1e-10)
    for layer, mixer_type in enumerate(cache.mixers):
        if mixer_type == "rra":
            torch.testing.assert_close(cache.rotors[layer], whole[CACHE_FIELD].rotors[layer], rtol=1e-10, atol=1e-10)
