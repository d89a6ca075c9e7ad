"""ZPX-specific model behaviour: Llama equivalence, the centre term and phases, bidirectional encoding.

The contract every family keeps (caches, padding, remote code, round trips, bad input) is in
test_model_contract.py.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from zpx_hf import ZPXForCausalLM, ZPXModel


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_zero_lambdas_with_rope_equal_llama(implementation, tiny_config):
    torch.manual_seed(0)
    config = tiny_config("zpx", lambda_angle=0.0, lambda_sphere=0.0, rotary="rope", rope_theta=10000.0)
    zpx = AutoModelForCausalLM.from_config(config, attn_implementation=implementation).eval()
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
    # fp32 on both sides (Llama's RMSNorm always runs in fp32): a few ulps of the logit magnitude
    tolerance = 64 * torch.finfo(torch.float32).eps * theirs.abs().max().item()
    torch.testing.assert_close(ours_aligned[mask.bool()], theirs[mask.bool()], rtol=0, atol=tolerance)
    torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=tolerance)


def test_loss_includes_centre_term_and_phases_are_returned(tiny_config):
    torch.manual_seed(0)
    ids = torch.randint(3, 61, (2, 6))
    plain = ZPXForCausalLM(tiny_config("zpx"))
    weighted = ZPXForCausalLM(tiny_config("zpx", center_loss_weight=0.01))
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


def test_bidirectional_encoder_sees_the_future(tiny_config):
    torch.manual_seed(0)
    model = ZPXModel(tiny_config("zpx", causal=False)).eval()
    ids = torch.randint(3, 61, (1, 6))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1 - 3) % 58 + 3
    first = model(input_ids=ids).last_hidden_state[0, 0]
    assert not torch.allclose(first, model(input_ids=changed).last_hidden_state[0, 0])
    with pytest.raises(ValueError, match="causal"):
        ZPXForCausalLM(tiny_config("zpx", causal=False))


@pytest.mark.parametrize("attention_bias", [False, True])
def test_fused_decoding_projections_match_the_separate_projections(attention_bias, tiny_config):
    """Inside `generate` (derived weights kept) q, k, v and the three phase encoders run as one matmul with q and
    k rotated together; logits of a prefill and cached steps equal the separate path's (float64)."""
    from zpx_hf.modeling_blocks import keep_derived_weights

    torch.manual_seed(0)
    config = tiny_config("zpx", attention_bias=attention_bias, phase_bias=not attention_bias)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").double().eval()
    for parameter in model.parameters():  # biases start at zero: make every term count
        torch.nn.init.normal_(parameter, std=0.2)
    ids = torch.randint(3, 61, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0

    def prefill_and_steps():
        out = model(input_ids=ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
        logits, cache = [out.logits], out.past_key_values
        for t in range(6, 9):
            out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache)
            logits.append(out.logits)
        return torch.cat(logits, dim=1)

    attention = model.model.layers[0].self_attn
    hidden = torch.randn(2, 3, config.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        separate = prefill_and_steps()
        assert attention.fused_projections(hidden) is None
        with keep_derived_weights():
            assert attention.fused_projections(hidden) is not None
            fused = prefill_and_steps()
        handle = attention.phase_encoder.to_b.register_forward_hook(lambda *args: None)
        with keep_derived_weights():
            assert attention.fused_projections(hidden) is None  # a hooked projection runs as itself
        handle.remove()
    torch.testing.assert_close(fused, separate, rtol=1e-10, atol=1e-10)
