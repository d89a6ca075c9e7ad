"""Config checks on every construction path, and numeric ranges that stop where values give NaN.

Each limit is tested just inside (the model builds and its outputs are finite, in the dtype the limit is
about) and just outside (a `ValueError` naming the field); where the limit is measured in the model, the
value past it is also shown to give NaN when the check is bypassed.
"""

import inspect
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import FAMILY_CASES, TINY_VOCAB, make_tiny_config
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import zpx_hf
from zpx_hf.configuration_common import LOGIT_SCALE_LIMIT
from zpx_hf.configuration_versor import RRA_FULL_GROWTH_LIMIT, RRA_SCALE_LIMIT
from zpx_hf.rotary_srpe import SpiralRotaryEmbedding
from zpx_hf.tokenization_bytes import build_byte_tokenizer

FLOAT16_MAX = torch.finfo(torch.float16).max
JUST_OUTSIDE = 1 + 1e-6


def saved(tmp_path, case="zpx", **overrides):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(make_tiny_config(case, **overrides)).save_pretrained(tmp_path)
    return tmp_path


# ----------------------------------------------------------------------------------------- every path


def test_from_pretrained_overrides_are_checked(tmp_path):
    folder = saved(tmp_path)
    with pytest.raises(ValueError, match="`lambda_angle`=nan"):
        AutoModelForCausalLM.from_pretrained(folder, lambda_angle=float("nan"))
    with pytest.raises(ValueError, match="`srpe_a`=5.0"):
        AutoConfig.from_pretrained(folder, srpe_a=5.0)
    with pytest.raises(ValueError, match="`pad_token_id`=-5"):  # not a field rule: checked by from_dict's validate
        AutoConfig.from_pretrained(folder, pad_token_id=-5)
    with pytest.raises(ValueError, match="`head_dim`"):  # each override valid alone, the combination is not
        AutoConfig.from_pretrained(folder, head_dim=7)
    config = AutoConfig.from_pretrained(folder, srpe_a=0.5)  # a valid override still loads
    assert config.srpe_a == 0.5


def test_config_json_edited_on_disk_is_checked(tmp_path):
    folder = saved(tmp_path)
    stored = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**stored, "lambda_sphere": float("inf")}))
    with pytest.raises(ValueError, match="`lambda_sphere`"):
        AutoModelForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize("case", ["zpx", "pct", "versor-hybrid"])
def test_assignment_is_checked_and_model_build_validates(case):
    config = make_tiny_config(case)
    with pytest.raises(ValueError, match="`rms_norm_eps`"):
        config.rms_norm_eps = float("nan")
    assert config.rms_norm_eps == 1e-6  # the bad value was not stored
    config.pad_token_id = TINY_VOCAB  # not a field rule: caught where the model is built
    with pytest.raises(ValueError, match="`pad_token_id`"):
        AutoModelForCausalLM.from_config(config)


def test_from_dict_of_the_base_class_is_checked():
    stored = make_tiny_config("pct").to_dict()
    with pytest.raises(ValueError, match="`tau`"):
        zpx_hf.PCTConfig.from_dict(stored, tau=float("inf"))
    with pytest.raises(ValueError, match="`head_dim`"):
        zpx_hf.PCTConfig.from_dict(stored, head_dim=7)


# ----------------------------------------------------------------------------------------- every rule


def values_breaking(rule):
    """Values just past each bound of a `Rule` (and of its kind), so a new field or bound is covered without a
    hand-written case: a check removed from the table fails here."""
    if rule.kind == "bool":
        return [1, "true", None]
    if rule.kind == "choice":
        return ["not-a-choice", None]
    step = 1 if rule.kind == "int" else None

    def past(bound, direction):  # the nearest value beyond `bound`
        return bound + direction * (step or max(abs(bound), 1.0) * 1e-6)

    values = [1.5, "1"] if rule.kind == "int" else [float("nan"), float("inf"), "1.0", True]
    if rule.positive:
        values += [0, past(0, -1)]
    if rule.minimum is not None:
        values.append(past(rule.minimum, -1))
    if rule.maximum is not None:
        values.append(past(rule.maximum, +1))
    if rule.above is not None:
        values.append(rule.above)
    if rule.below is not None:
        values.append(rule.below)
    if not rule.optional:
        values.append(None)
    return values


def none_means_default(config_class, field):
    """Whether `__init__` reads None as "derive the default" (head_dim = hidden_size // heads, PCT's tau ...)."""
    for klass in config_class.__mro__:
        parameter = inspect.signature(klass.__init__).parameters.get(field) if "__init__" in vars(klass) else None
        if parameter is not None:
            return parameter.default is None
    return False


RULE_CASES = [
    pytest.param(case, field, value, id=f"{case}-{field}-{value!r}")
    for case in FAMILY_CASES
    for field, rule in type(make_tiny_config(case)).field_rules.items()
    for value in values_breaking(rule)
    if not (value is None and none_means_default(type(make_tiny_config(case)), field))
]


@pytest.mark.parametrize("case,field,value", RULE_CASES)
def test_every_rule_refuses_the_values_past_it(case, field, value):
    with pytest.raises(ValueError, match=f"`{field}`"):
        make_tiny_config(case, **{field: value})
    config = make_tiny_config(case)
    with pytest.raises(ValueError, match=f"`{field}`"):
        setattr(config, field, value)


def test_rule_cases_cover_every_positive_field():
    positive = {
        (case, field)
        for case in FAMILY_CASES
        for field, r in type(make_tiny_config(case)).field_rules.items()
        if r.positive
    }
    assert {("pct", "qk_norm_eps"), ("versor-hybrid", "gpa_eps"), ("zpx", "rms_norm_eps")} <= positive
    for case, field in positive:
        values = [p.values[2] for p in RULE_CASES if p.values[:2] == (case, field)]
        assert 0 in values and any(isinstance(v, (int, float)) and v < 0 for v in values), (case, field)


# ----------------------------------------------------------------------------------------- type and token ids


def test_string_vocab_size_names_the_field():
    with pytest.raises(ValueError, match=r"`vocab_size`='260'.*write 260"):
        zpx_hf.ZPXConfig(vocab_size="260")


@pytest.mark.parametrize("field", ["pad_token_id", "bos_token_id", "eos_token_id"])
@pytest.mark.parametrize("value", [-5, -1, TINY_VOCAB, TINY_VOCAB + 10, 1.5, True])
def test_special_token_ids_lie_in_the_vocabulary(field, value):
    with pytest.raises(ValueError, match=f"`{field}`.*vocab_size={TINY_VOCAB}"):
        make_tiny_config("zpx", **{field: value})


def test_last_token_id_and_none_are_accepted():
    config = make_tiny_config("zpx", pad_token_id=TINY_VOCAB - 1, bos_token_id=None, eos_token_id=[2, TINY_VOCAB - 1])
    model = AutoModelForCausalLM.from_config(config)
    assert model.model.embed_tokens.padding_idx == TINY_VOCAB - 1


@pytest.mark.parametrize("field", ["dtype", "torch_dtype"])
def test_dtype_in_config_json_names_the_field(field, tmp_path):
    folder = saved(tmp_path)
    stored = json.loads((folder / "config.json").read_text())
    stored.pop("dtype")
    for bad in ("bogus", "auto", "Tensor", 16):
        (folder / "config.json").write_text(json.dumps({**stored, field: bad}))
        with pytest.raises(ValueError, match=f"`{field}`={bad!r} is invalid: expected a torch dtype name"):
            AutoModelForCausalLM.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({**stored, field: "bfloat16"}))
    assert AutoConfig.from_pretrained(folder).dtype == torch.bfloat16
    assert make_tiny_config("zpx", dtype=torch.float16).dtype == torch.float16


# ----------------------------------------------------------------------------------------- logit scales


LOGIT_SCALES = [
    ("zpx", "lambda_angle", 1),
    ("zpx", "lambda_angle", -1),
    ("zpx", "lambda_sphere", 1),
    ("pct", "tau", 1),
    ("pct", "tau_init", 1),
    ("versor-gpa", "gpa_gamma_init", 1),
    ("versor-gpa", "gpa_gamma_init", -1),
]
# the other ZPX lambda at 0: their magnitudes add up (see below)
OTHER = {"lambda_angle": {"lambda_sphere": 0.0}, "lambda_sphere": {"lambda_angle": 0.0}}


def test_logit_scale_limit_is_the_float16_maximum():
    assert LOGIT_SCALE_LIMIT == FLOAT16_MAX


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("case,field,sign", LOGIT_SCALES)
def test_logit_scales_at_the_limit_stay_finite_in_float16(case, field, sign, implementation):
    torch.manual_seed(0)
    config = make_tiny_config(case, **{field: sign * LOGIT_SCALE_LIMIT}, **OTHER.get(field, {}))
    ids = torch.randint(3, TINY_VOCAB, (2, 12))
    for dtype in (torch.float32, torch.float16):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation).to(dtype).eval()
        with torch.no_grad():
            assert torch.isfinite(model(ids).logits).all(), dtype


@pytest.mark.parametrize("case,field,sign", LOGIT_SCALES)
def test_logit_scales_past_the_limit_are_refused(case, field, sign):
    for value in (sign * LOGIT_SCALE_LIMIT * JUST_OUTSIDE, sign * 1e308):
        with pytest.raises(ValueError, match=f"`{field}`.*float16"):
            make_tiny_config(case, **{field: value}, **OTHER.get(field, {}))


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("sphere_sign", [1, -1])
def test_zpx_lambdas_summing_to_the_limit_stay_finite_in_float16(sphere_sign, implementation):
    half = LOGIT_SCALE_LIMIT / 2
    torch.manual_seed(0)
    config = make_tiny_config("zpx", lambda_angle=half, lambda_sphere=sphere_sign * half)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation).half().eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(3, TINY_VOCAB, (2, 12))).logits).all()
    with pytest.raises(ValueError, match=r"`lambda_angle`.*\|lambda_angle\| \+ \|lambda_sphere\|"):
        make_tiny_config("zpx", lambda_angle=half * JUST_OUTSIDE, lambda_sphere=sphere_sign * half)


def test_zpx_lambdas_past_the_summed_limit_give_nan_in_float16():
    # the check bypassed on the built layers: both at the maximum overflow the float16 eager score
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_tiny_config("zpx"), attn_implementation="eager").half().eval()
    for layer in model.model.layers:
        layer.self_attn.lambda_angle = layer.self_attn.lambda_sphere = LOGIT_SCALE_LIMIT
    with torch.no_grad():
        assert not torch.isfinite(model(torch.randint(3, TINY_VOCAB, (2, 12))).logits).all()


# ----------------------------------------------------------------------------------------- SRPE winding


def test_srpe_k_minus_one_would_ignore_positions_and_is_refused():
    rotary = SpiralRotaryEmbedding(16, k_s=-1.0, a_s=0.0)  # the module itself, below the config check
    x = torch.ones(1, 6, 16)
    cos, sin = rotary(x, torch.arange(6)[None])
    assert torch.equal(cos, cos[:, :1].expand_as(cos)) and torch.equal(sin, sin[:, :1].expand_as(sin))
    for value in (-1.0, -2.0, -0.5, 0.0, 2.0**-24):
        with pytest.raises(ValueError, match="`srpe_k`.*positive"):
            make_tiny_config("zpx", srpe_k=value)


def test_srpe_k_just_above_the_limit_gives_finite_distinct_positions():
    config = make_tiny_config("zpx", srpe_k=2.0**-24 * 1.01)
    rotary = SpiralRotaryEmbedding(config.head_dim, k_s=config.srpe_k)
    cos, sin = rotary(torch.ones(1, 4, config.head_dim), torch.arange(4)[None])
    assert torch.isfinite(cos).all() and torch.isfinite(sin).all()
    assert not torch.equal(cos[:, 1], cos[:, 2])


# ----------------------------------------------------------------------------------------- Versor RRA


def saturated_rra(scale, **overrides):
    """One-layer-per-mixer RRA model whose tanh saturates (initializer_range 1): |B_t coefficients| ~ scale."""
    torch.manual_seed(0)
    fields = dict(mixer="rra", initializer_range=1.0, rra_bivector_scale=scale, **overrides)
    return AutoModelForCausalLM.from_config(make_tiny_config("versor-rra", **fields)).eval()


def test_compact_scale_limit_is_where_float32_overflows():
    # derivation (configuration_versor.RRA_SCALE_LIMIT): e^{4s} < e^{88.7} -> s < 22.2
    assert RRA_SCALE_LIMIT < math.log(torch.finfo(torch.float32).max) / 4 < 22.2
    ids = torch.randint(3, TINY_VOCAB, (2, 32))
    model = saturated_rra(RRA_SCALE_LIMIT)
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
        for layer in model.model.layers:  # the check bypassed: just past the derived overflow
            layer.mixer.bivector_scale = 22.5
        assert not torch.isfinite(model(ids).logits).all()
    for value in (RRA_SCALE_LIMIT * JUST_OUTSIDE, 1000.0):
        with pytest.raises(ValueError, match="`rra_bivector_scale`.*float32"):
            make_tiny_config("versor-rra", rra_bivector_scale=value)


def full_limit_scale(hidden_size, initializer_range, max_position_embeddings):
    per_scale = min(1.0, initializer_range * math.sqrt(6 * hidden_size / 32)) * math.sqrt(max_position_embeddings)
    return RRA_FULL_GROWTH_LIMIT / per_scale


def test_full_accumulation_bound_holds_the_coefficient_rms():
    # the derivation's premise: at initialisation the coefficients' RMS is <= s min(1, sigma sqrt(6H/32))
    for initializer_range in (0.02, 0.2):
        torch.manual_seed(0)
        config = make_tiny_config("versor-rra", initializer_range=initializer_range, rra_bivector_scale=1.0)
        model = AutoModelForCausalLM.from_config(config).eval()
        mixer = model.model.layers[0].mixer
        captured = {}
        hidden = model.model.layers[0].input_layernorm(model.model.embed_tokens(torch.randint(3, TINY_VOCAB, (4, 64))))
        with torch.no_grad():
            captured["rms"] = mixer.bivectors(hidden).pow(2).mean().sqrt().item()
        bound = min(1.0, initializer_range * math.sqrt(6 * config.hidden_size / 32))
        assert 0.5 * bound < captured["rms"] <= 1.05 * bound, (initializer_range, captured, bound)


def test_full_accumulation_limit_just_inside_and_outside():
    hidden, sigma, length = 128, 0.02, 512
    limit = full_limit_scale(hidden, sigma, length)
    fields = dict(
        mixer="rra",
        rra_accumulate="full",
        hidden_size=hidden,
        initializer_range=sigma,
        max_position_embeddings=length,
        num_hidden_layers=1,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_tiny_config("versor-rra", rra_bivector_scale=0.999 * limit, **fields))
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(3, TINY_VOCAB, (1, length))).logits).all()
    for scale in (1.001 * limit, 2.0, 5.0):  # the scale 2 (NaN from 769) and 5 (from 132)
        with pytest.raises(ValueError, match='`rra_bivector_scale`.*"full".*compact'):
            make_tiny_config("versor-rra", rra_bivector_scale=scale, **fields)
    # a GPA-only model has no RRA: the accumulation mode is not checked
    make_tiny_config("versor-gpa", rra_bivector_scale=5.0, **{**fields, "mixer": "gpa"})


def test_full_accumulation_past_the_limit_reaches_nan_where_the_analysis_says():
    # the measured law: NaN where rho sqrt(t) ~ 4.3-5.5; s = 2 here gives rho ~ 0.19 -> NaN near t ~ 500-800
    hidden, sigma = 128, 0.02
    torch.manual_seed(0)
    fields = dict(mixer="rra", rra_accumulate="full", hidden_size=hidden, initializer_range=sigma, num_hidden_layers=1)
    config = make_tiny_config("versor-rra", max_position_embeddings=1024, rra_bivector_scale=0.5, **fields)
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    for layer in model.model.layers:
        layer.mixer.bivector_scale = 2.0  # the check bypassed, as the configuration
    captured = {}
    model.model.layers[0].mixer.register_forward_hook(lambda module, args, out: captured.update(out=out[0]))
    with torch.no_grad():
        model(torch.randint(3, TINY_VOCAB, (1, 1024)))
    finite = torch.isfinite(captured["out"][0]).all(-1)
    first_nan = int((~finite).nonzero()[0]) if not finite.all() else None
    assert first_nan is not None and 4.0 / 0.2 < math.sqrt(first_nan) < 6.0 / 0.15, first_nan


# ----------------------------------------------------------------------------------------- unknown keys
# What transformers 4.x wrote for every config (`to_dict()` / `use_diff=False`): a config.json from any tool
# built on it may carry these, and none is a typo.
TRANSFORMERS_4_KEYS = dict(
    return_dict=True, output_hidden_states=False, output_attentions=False, torchscript=False, torch_dtype="float32",
    use_bfloat16=False, tf_legacy_loss=False, pruned_heads={}, tie_word_embeddings=False, chunk_size_feed_forward=0,
    is_encoder_decoder=False, is_decoder=False, cross_attention_hidden_size=None, add_cross_attention=False,
    tie_encoder_decoder=False, max_length=20, min_length=0, do_sample=False, early_stopping=False, num_beams=1,
    num_beam_groups=1, diversity_penalty=0.0, temperature=1.0, top_k=50, top_p=1.0, typical_p=1.0,
    repetition_penalty=1.0, length_penalty=1.0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0,
    bad_words_ids=None, num_return_sequences=1, output_scores=False, return_dict_in_generate=False,
    forced_bos_token_id=None, forced_eos_token_id=None, remove_invalid_values=False,
    exponential_decay_length_penalty=None, suppress_tokens=None, begin_suppress_tokens=None, architectures=None,
    finetuning_task=None, id2label={"0": "LABEL_0", "1": "LABEL_1"}, label2id={"LABEL_0": 0, "LABEL_1": 1},
    tokenizer_class=None, prefix=None, sep_token_id=None, decoder_start_token_id=None, task_specific_params=None,
    problem_type=None, _name_or_path="", _commit_hash=None, _attn_implementation_autoset=True,
    transformers_version="4.57.1",
)  # fmt: skip


def unknown_key_warnings(record):
    return [str(w.message) for w in record if "has no effect" in str(w.message)]


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_unknown_config_key_warns_naming_the_nearest_field(case, tmp_path):
    config_class = type(make_tiny_config(case))
    with pytest.warns(UserWarning, match=r"`hiden_size`=64 is not a \w+Config field.*did you mean `hidden_size`"):
        config = make_tiny_config(case, hiden_size=64)
    assert config.hidden_size != 64  # the typo left the width at its default: why it must be said
    with pytest.warns(UserWarning, match=r"`zzz_qqq`=1 .*check the spelling"):
        config_class(zzz_qqq=1)
    folder = saved(tmp_path, case)
    stored = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**stored, "num_hiden_layers": 6}))
    with pytest.warns(UserWarning, match="`num_hiden_layers`=6.*did you mean `num_hidden_layers`"):
        AutoModelForCausalLM.from_pretrained(folder)
    with pytest.warns(UserWarning, match="`rms_norm_esp`=0.1.*did you mean `rms_norm_eps`"):  # an override
        AutoConfig.from_pretrained(folder, rms_norm_esp=0.1)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_keys_transformers_passes_do_not_warn(case, tmp_path, recwarn):
    folder = saved(tmp_path, case)  # config.json with auto_map, architectures, dtype, transformers_version
    AutoConfig.from_pretrained(folder)
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16, attn_implementation="eager")
    AutoConfig.from_pretrained(folder, num_labels=3, use_cache=False)
    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    config = AutoConfig.from_pretrained(folder)
    type(config).from_dict(config.to_dict())
    type(config)(**{**config.to_dict(), **TRANSFORMERS_4_KEYS})
    stored = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**stored, **TRANSFORMERS_4_KEYS}))
    AutoModelForCausalLM.from_pretrained(folder)
    build_byte_tokenizer().save_pretrained(folder)
    AutoTokenizer.from_pretrained(folder, add_bos_token=True)  # its arguments reach AutoConfig.from_pretrained too
    AutoConfig.from_pretrained(folder, gguf_file=None)  # as lm-eval's HFLM loads it
    assert unknown_key_warnings(recwarn) == []


def test_saved_pct_checkpoints_of_earlier_versions_load_without_unknown_key_warnings(recwarn):
    for name in ("pct_v1_learnable", "pct_v1_sqrt_d", "pct_v2_log_learnable"):
        AutoModelForCausalLM.from_pretrained(Path(__file__).parent / "fixtures" / name)
    assert unknown_key_warnings(recwarn) == []
