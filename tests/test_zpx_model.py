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
