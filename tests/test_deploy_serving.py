"""Serving through softmax engines: ZPX reaches transformers' global AttentionInterface with the standard
signature (augmented q^ / k^, zero-padded values, the standard scale 1/sqrt(d)) and computes its own logits
there; PCT and Versor refuse softmax-engine implementations by name, saying why. ZPX's tensor-parallel plan."""

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_config
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import zpx_hf
from zpx_hf.configuration_zpx import ENGINE_HEAD_MULTIPLE

RECORDING = "zpx_test_recording_sdpa"
CALLS = []


def recording_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A stand-in engine: records what it is given and runs transformers' own SDPA attention (which groups keys
    by the module's `num_key_value_groups`, as for Llama)."""
    CALLS.append(
        {"shapes": (query.shape, key.shape, value.shape), "scaling": scaling, "kwargs": set(kwargs)}
        | {"groups": module.num_key_value_groups}
    )
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)


AttentionInterface.register(RECORDING, recording_sdpa)
AttentionMaskInterface.register(RECORDING, sdpa_mask)
DOCUMENTS = [(0, 0, 4), (0, 4, 10), (1, 0, 7), (1, 7, 10)]  # (row, start, stop) of the packed rows below


def zpx_model(**overrides):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_tiny_config("zpx", **overrides)).eval().double()


def test_zpx_is_backend_compatible_and_pct_versor_are_not():
    families = zpx_hf.FAMILIES
    assert families["zpx"][2].is_backend_compatible()  # ZPXForCausalLM
    assert not families["pct"][2].is_backend_compatible()
    assert not families["versor"][2].is_backend_compatible()


@pytest.mark.parametrize("key_heads", [2, 1])
def test_global_attention_function_gives_zpx_logits(key_heads):
    """Full heads and multi-query: grouped keys reach the engine with num_key_value_heads heads."""
    model = zpx_model(num_key_value_heads=key_heads)
    ids = torch.randint(3, TINY_VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        reference = model(ids, attention_mask=mask).logits
        model.set_attn_implementation(RECORDING)
        CALLS.clear()
        logits = model(ids, attention_mask=mask, engine_metadata="threaded").logits
    keep = mask.bool()
    torch.testing.assert_close(logits[keep], reference[keep], atol=1e-10, rtol=1e-10)
    assert len(CALLS) == model.config.num_hidden_layers  # every layer went through the engine
    config = model.config
    width = config.head_dim + 5 * config.phase_channels  # d + 5C
    padded = -(-width // ENGINE_HEAD_MULTIPLE) * ENGINE_HEAD_MULTIPLE
    assert config.engine_head_dim == padded  # the head size an engine's KV cache is sized by
    for call in CALLS:
        assert call["scaling"] == config.head_dim**-0.5  # S = scaling q^ . k^: q^ carries lambda / (C scaling)
        assert all(shape[-1] == padded for shape in call["shapes"])
        assert [shape[1] for shape in call["shapes"]] == [2, key_heads, key_heads]
        assert call["groups"] == 2 // key_heads
        assert "engine_metadata" in call["kwargs"]  # the model's kwargs reach the attention function


def test_packed_rows_through_an_engine_stay_inside_their_documents():
    """Position ids restarting at 0 (DataCollatorWithFlattening): the engine's mask keeps each document to itself,
    as ZPX's own kernels do; an engine that takes no mask function (flash's kind) refuses packed rows in one line."""
    model = zpx_model()
    ids = torch.randint(3, TINY_VOCAB, (2, 10), generator=torch.Generator().manual_seed(5))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 0, 1, 2]])
    with torch.no_grad():
        alone = [model(ids[row : row + 1, start:stop]).logits for row, start, stop in DOCUMENTS]
        model.set_attn_implementation(RECORDING)
        CALLS.clear()
        packed = model(ids, position_ids=positions).logits
        assert len(CALLS) == model.config.num_hidden_layers
        for (row, start, stop), want in zip(DOCUMENTS, alone):
            torch.testing.assert_close(packed[row : row + 1, start:stop], want, atol=1e-10, rtol=1e-10)
    # flash (CUDA only, so its mask step is called directly) and hub kernels build no mask from a mask function
    from zpx_hf.modeling_zpx import engine_attention_mask

    hidden = torch.zeros(2, 10, model.config.hidden_size)
    documents = torch.tensor([[0] * 4 + [1] * 6, [0] * 7 + [1] * 3])
    for implementation in ("flash_attention_2", "kernels-community/flash-attn2"):
        with pytest.raises(ValueError, match="packed rows .*'sdpa'") as error:
            engine_attention_mask(model.config, implementation, hidden, None, None, 0, documents)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("key_heads", [2, 1])
def test_global_attention_function_generates_zpx_tokens(key_heads):
    model = zpx_model(num_key_value_heads=key_heads)
    ids = torch.randint(3, TINY_VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    reference = model.generate(ids, max_new_tokens=8, do_sample=False)
    model.set_attn_implementation(RECORDING)
    CALLS.clear()
    tokens = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(tokens, reference)
    assert len(CALLS) == 8 * model.config.num_hidden_layers  # prefill + 7 cached steps, every layer


@pytest.mark.parametrize(
    "case, reason", [("pct", "sigmoid gate"), ("versor-gpa", "bivector"), ("versor-rra", "rotor state")]
)
@pytest.mark.parametrize("implementation", ["flash_attention_2", "flex_attention", RECORDING])
def test_pct_and_versor_refuse_softmax_engines_by_name(case, reason, implementation):
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=reason) as error:
        AutoModelForCausalLM.from_config(make_tiny_config(case), attn_implementation=implementation)
    assert implementation in str(error.value) and "\n" not in str(error.value)
    model = AutoModelForCausalLM.from_config(make_tiny_config(case))
    with pytest.raises(ValueError, match=reason):
        model.set_attn_implementation(implementation)


@pytest.mark.slow
def test_zpx_flex_attention_gives_zpx_logits():
    """transformers' own flex_attention (compiled on CPU) computes ZPX through the same engine path."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_tiny_config("zpx")).eval()
    ids = torch.randint(3, TINY_VOCAB, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = model(ids).logits
        model.set_attn_implementation("flex_attention")
        logits = model(ids).logits
    scale = reference.abs().max()
    assert (logits - reference).abs().max() <= 64 * torch.finfo(torch.float32).eps * scale


@pytest.mark.parametrize("key_heads", [4, 2])
def test_zpx_tp_plan_names_real_linears_and_shards_by_heads(key_heads):
    """`base_model_tp_plan`: every rule names `nn.Linear`s of the backbone (and every backbone projection but the
    embedding has a rule), and the sharding is exact: two emulated ranks, each with half the heads (colwise rows of
    q, k, v and the phase encoder) and half of o_proj's columns (rowwise), sum to the full attention output; the
    MLP likewise (float64); with full and grouped heads (each rank then holds half the key-value heads, k, v and
    their phase rows, and the query heads they serve). Tensor parallelism itself needs several processes."""
    import re

    def wildcard(name):
        return re.sub(r"\.\d+\.", ".*.", name)

    model = zpx_model(num_attention_heads=4, num_key_value_heads=key_heads)
    backbone = model.model
    plan = backbone.config.base_model_tp_plan
    linears = {name for name, module in backbone.named_modules() if isinstance(module, torch.nn.Linear)}
    for rule in plan:
        matched = [name for name in linears if re.fullmatch(rule.replace("*", r"\d+"), name)]
        assert len(matched) == backbone.config.num_hidden_layers, rule
    assert {wildcard(name) for name in linears} == set(plan)

    tp = 2
    config = backbone.config
    layer = backbone.layers[0]
    hidden = torch.randn(2, 7, config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(7)[None].expand(2, -1)
    rotary = backbone.position_embeddings(hidden, positions)
    with torch.no_grad():
        full_attention = layer.self_attn(hidden, rotary)[0]
        full_mlp = layer.mlp(hidden)
        shard_config = make_tiny_config(
            "zpx",
            num_attention_heads=config.num_attention_heads // tp,
            num_key_value_heads=config.num_key_value_heads // tp,
            head_dim=config.head_dim,
            intermediate_size=config.intermediate_size // tp,
        )
        attention_sum = torch.zeros_like(full_attention)
        mlp_sum = torch.zeros_like(full_mlp)
        for rank in range(tp):
            shard = type(model)(shard_config).double().eval()
            for name, parameter in shard.model.layers[0].named_parameters():
                source = layer.get_parameter(name)
                style = plan.get(wildcard(f"layers.0.{name.rsplit('.', 1)[0]}"))
                if style == "colwise":  # output rows (and biases) by heads
                    source = source.chunk(tp, dim=0)[rank]
                elif style == "rowwise":  # input columns by heads (a bias would be added once, after the sum)
                    assert name.endswith("weight"), name
                    source = source.chunk(tp, dim=1)[rank]
                parameter.copy_(source)
            attention_sum += shard.model.layers[0].self_attn(hidden, rotary)[0]
            mlp_sum += shard.model.layers[0].mlp(hidden)
    torch.testing.assert_close(attention_sum, full_attention, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(mlp_sum, full_mlp, atol=1e-12, rtol=1e-12)


def test_zpx_learnable_lambdas_under_a_head_shard_refuse_by_name():
    """The TP plan shards heads but not the per-head lambdas: a rank's attention with half the heads and all the
    lambdas stops naming `learnable_lambdas` and `tp_plan`, instead of broadcasting the wrong heads' lambdas."""
    shard = zpx_model(num_attention_heads=2, num_key_value_heads=2, learnable_lambdas=True)
    attention = shard.model.layers[0].self_attn
    full_heads = 4  # the lambdas of the unsharded model, as a rank would hold them
    attention.lambda_angle_heads = torch.nn.Parameter(torch.zeros(full_heads, dtype=torch.float64))
    attention.lambda_sphere_heads = torch.nn.Parameter(torch.zeros(full_heads, dtype=torch.float64))
    ids = torch.randint(4, shard.config.vocab_size, (1, 6))
    for kernel in ("eager", "sdpa"):
        shard.set_attn_implementation(kernel)
        with pytest.raises(ValueError, match="learnable_lambdas: 4 per-head lambdas for 2 query heads.*tp_plan"):
            shard(ids)
