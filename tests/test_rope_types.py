"""transformers' rope types (`rope_parameters`) in every family with rotary="rope" (docs/design.md §2.5): ZPX at
lambdas 0 gives `LlamaModel`'s hidden states for each type, past the original context and through `generate`;
PCT's tables are Llama's; checkpoints saved with a top-level `rope_theta` load with the same outputs; SRPE and
configs the rotary tables cannot honour are refused by name."""

import copy

import pytest
import torch
from conftest import TINY_VOCAB, assert_close_eps
from helpers_llama import float64_norms, tiny_llama_config
from safetensors.torch import load_file
from transformers import LlamaForCausalLM, LlamaModel
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from zpx_hf import PCTConfig, ZPXConfig, ZPXForCausalLM, ZPXModel
from zpx_hf.configuration_common import ROPE_TYPES
from zpx_hf.rotary_srpe import build_rotary

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py

ORIGINAL = 16  # original context of the scaled types; the tiny models run to 40 (max_position_embeddings 32)
ROPE_PARAMETERS = {
    "default": {},
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "longrope": {
        "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
        "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
        "original_max_position_embeddings": ORIGINAL,
    },
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 4},
    "proportional": {"partial_rotary_factor": 0.5},
}
SIZE = dict(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


def rope_parameters(rope_type):
    return {"rope_type": rope_type, "rope_theta": 500.0, **copy.deepcopy(ROPE_PARAMETERS[rope_type])}


def zpx_and_llama(rope_type, head_class=False):
    """A float64 ZPX (lambdas 0, rotary rope) and transformers' Llama with the same weights and rope_parameters."""
    torch.manual_seed(0)
    llama_class = LlamaForCausalLM if head_class else LlamaModel
    llama = llama_class(tiny_llama_config(max_position_embeddings=32, rope_parameters=rope_parameters(rope_type)))
    llama = float64_norms(llama.double().eval())
    config = ZPXConfig(
        **SIZE,
        phase_channels=4,
        max_position_embeddings=32,
        lambda_angle=0.0,
        lambda_sphere=0.0,
        rotary="rope",
        rope_parameters=rope_parameters(rope_type),
        rms_norm_eps=llama.config.rms_norm_eps,
        pad_token_id=None,
    )
    zpx = (ZPXForCausalLM if head_class else ZPXModel)(config).double().eval()
    missing, unexpected = zpx.load_state_dict(llama.state_dict(), strict=False)
    assert not unexpected and all(".phase_encoder." in key for key in missing)
    return zpx, llama


def test_every_rope_type_of_transformers_is_covered():
    assert set(ROPE_TYPES) == set(ROPE_PARAMETERS)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("rope_type", sorted(ROPE_PARAMETERS))
def test_zero_lambdas_equal_llama_hidden_states_for_each_rope_type(rope_type, implementation):
    zpx, llama = zpx_and_llama(rope_type)
    zpx.set_attn_implementation(implementation)
    ids = torch.randint(3, TINY_VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        # 40 positions: past the original context (16) of yarn / longrope / llama3 and the 32 the dynamic type grows
        # from; then 12 (dynamic: back to the original frequencies, longrope: its short factors)
        for length in (40, 12, 40):
            ours = zpx(input_ids=ids[:, :length]).last_hidden_state
            theirs = llama(input_ids=ids[:, :length]).last_hidden_state
            assert (ours - theirs).abs().max() <= 1e-10


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope", "yarn", "llama3"])
def test_generation_past_the_original_context_equals_llama(rope_type):
    """Cached decoding: each step's frequencies follow its own position (dynamic grows, longrope switches)."""
    zpx, llama = zpx_and_llama(rope_type, head_class=True)
    prompt = torch.randint(3, TINY_VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    settings = dict(max_new_tokens=28, do_sample=False, output_scores=True, return_dict_in_generate=True)
    ours = zpx.generate(prompt, **settings, eos_token_id=None, pad_token_id=0)
    theirs = llama.generate(prompt, **settings, eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert max((a - b).abs().max() for a, b in zip(ours.scores, theirs.scores, strict=True)) <= 1e-10


@pytest.mark.parametrize("rope_type", sorted(ROPE_PARAMETERS))
def test_pct_rotation_tables_are_llamas(rope_type):
    """PCT rotates complex feature j by the table of pair j: with rotary="rope" those are Llama's, bit for bit."""
    config = PCTConfig(**SIZE, max_position_embeddings=32, rotary="rope", rope_parameters=rope_parameters(rope_type))
    llama = LlamaRotaryEmbedding(
        tiny_llama_config(
            max_position_embeddings=32, rope_parameters=rope_parameters(rope_type), head_dim=config.head_dim
        )
    )
    ours = build_rotary(config)
    half = config.head_dim // 2
    for positions in (torch.arange(40)[None], torch.arange(10)[None]):
        cos, sin = ours.pair_tables(positions, torch.device("cpu"))
        llama_cos, llama_sin = llama(torch.zeros(1), positions)
        assert torch.equal(cos, llama_cos[..., :half]) and torch.equal(sin, llama_sin[..., :half])


@pytest.mark.parametrize("rotary", ["rope", "srpe"])
def test_checkpoints_with_a_top_level_rope_theta_load_with_the_same_outputs(rotary, tmp_path):
    """tests/fixtures/zpx_v1_* were saved by the code before rope_parameters (make_zpx_fixtures.py)."""
    folder = f"{__file__.rsplit('/', 1)[0]}/fixtures/zpx_v1_{rotary}"
    expected = load_file(f"{folder}/expected_logits.safetensors")
    model = ZPXForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    assert model.config.rope_parameters == {"rope_type": "default", "rope_theta": 500.0}
    assert model.config.rope_theta == 500.0
    with torch.no_grad():
        logits = model(input_ids=expected["input_ids"]).logits
        cos, sin = model.model.rotary_emb(torch.zeros(1), expected["positions"])
    assert_close_eps(logits, expected["logits"], ulps=64)  # float64, written on another machine's BLAS
    assert_close_eps(cos, expected["cos"], ulps=4) and assert_close_eps(sin, expected["sin"], ulps=4)
    # on this machine the tables are bit for bit those of that code's formula (rotary_srpe.py at b864edc)
    head_dim, positions = model.config.head_dim, expected["positions"]
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    base = positions.float()[..., None] * inv_freq
    winding = base.mul(1.0 + 1.0 / 8.0) if rotary == "srpe" else base
    radius = torch.sin(base.mul(0.01)).mul_(0.1).add_(1.0) if rotary == "srpe" else 1.0
    assert torch.equal(cos, torch.cat([radius * torch.cos(winding)] * 2, -1))
    assert torch.equal(sin, torch.cat([radius * torch.sin(winding)] * 2, -1))
    # saved again: rope_parameters, no top-level rope_theta; reloaded the same
    model.save_pretrained(tmp_path)
    saved = (tmp_path / "config.json").read_text()
    assert '"rope_parameters"' in saved and '\n  "rope_theta"' not in saved
    again = ZPXForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    with torch.no_grad():
        assert torch.equal(again(input_ids=expected["input_ids"]).logits, logits)


def test_rope_parameters_round_trip_and_old_names(tmp_path):
    config = ZPXConfig(**SIZE, rotary="rope", max_position_embeddings=32, rope_parameters=rope_parameters("yarn"))
    config.save_pretrained(tmp_path)
    assert ZPXConfig.from_pretrained(tmp_path).rope_parameters == config.rope_parameters
    # transformers' older name, and theta at the top level beside it (Llama 3 configs)
    old = ZPXConfig(rotary="rope", rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_theta=500.0)
    assert old.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    config.rope_theta = 250.0  # the attribute writes rope_parameters, checked like any field
    assert config.rope_parameters["rope_theta"] == 250.0
    with pytest.raises(ValueError, match="`rope_theta`"):  # at once, as every field (transformers 5.17 and 5.25)
        config.rope_theta = -1.0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(rotary="srpe", rope_parameters={"rope_type": "linear", "factor": 2.0}), "SRPE"),
        (dict(rotary="none", rope_parameters={"rope_type": "yarn", "factor": 2.0}), "no rotary tables"),
        (dict(rotary="rope", rope_parameters={"rope_type": "ntk-by-parts"}), "rope types"),
        (dict(rotary="rope", rope_parameters={"rope_type": "linear"}), "factor"),
        (
            dict(rotary="rope", rope_parameters={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}),
            "partial_rotary_factor",
        ),
        (
            dict(rotary="rope", rope_parameters={"rope_type": "default", "rope_theta": 500.0}, rope_theta=1e4),
            "give one",
        ),
        (dict(rotary="rope", rope_parameters=[("rope_type", "default")]), "mapping"),
        (dict(rotary="rope", rope_parameters={"rope_type": "default", "rope_theta": float("nan")}), "rope_theta"),
    ],
)
def test_rope_parameters_the_tables_cannot_honour_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match) as error:
        ZPXConfig(**kwargs)
    assert "rope_" in str(error.value)
