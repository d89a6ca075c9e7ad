"""PCT defaults of issue 21 (docs/design.md §4.2-4.3): tau "log_learnable" (tau_h = exp(log_tau_h)) at tau_init, b_h =
-log(train_context_length); checkpoints saved before them (tests/fixtures/pct_v1_*, written by commit 041f866;
pct_v2_*, defaults version 2, by c259d4b: tests/fixtures/make_pct_fixtures.py) load with their saved values and
give the logits that code gave: parameters bit for bit, logits to float32 rounding (the fixtures were written on one
CPU, and another CPU's vector width and BLAS build sum in another order)."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_close_eps
from safetensors.torch import load_file
from test_pct_ops import complex_formula, make_inputs

from zpx_hf import PCTConfig, PCTForCausalLM
from zpx_hf.configuration_common import LOGIT_SCALE_LIMIT
from zpx_hf.ops_pct import HAS_TRITON, pct_attention

FIXTURES = Path(__file__).resolve().parent / "fixtures"
pytestmark = pytest.mark.usefixtures("single_thread")


def assert_same_logits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # another CPU's summation order moved these logits by ~1e-7 (~4 float32 roundings of the largest, 0.25); 64 of
    # them (1.9e-6) leave room for other vector widths and sit below a b_h moved by 1e-3 (8.7e-6: the test below)
    assert_close_eps(actual, expected, ulps=LOGIT_ULPS)


LOGIT_ULPS = 64


def load_old(folder: Path) -> tuple[PCTForCausalLM, dict]:
    model, info = PCTForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval(), load_file(str(FIXTURES / folder.name / "expected_logits.safetensors"))


@pytest.mark.parametrize("tau", ["sqrt_d", "learnable"])
def test_checkpoint_saved_before_issue_21_gives_its_logits(tau):
    folder = FIXTURES / f"pct_v1_{tau}"
    model, expected = load_old(folder)
    config = model.config
    assert (config.tau, config.train_context_length, config.defaults_version) == (tau, 64, 3)
    saved = load_file(str(folder / "model.safetensors"))
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), saved[name]), name  # the saved b_h / tau, not re-initialised ones
    with torch.no_grad():
        logits = model(input_ids=expected["input_ids"]).logits
    assert_same_logits(logits, expected["logits"])


def test_the_logit_tolerance_sees_a_gate_bias_off_by_a_thousandth():
    """The float32 tolerance above still tells the saved b_h from one moved by 1e-3 (a re-derived or re-initialised
    b_h moves by far more), so those tests can fail."""
    model, expected = load_old(FIXTURES / "pct_v1_sqrt_d")
    with torch.no_grad():
        model.model.layers[0].self_attn.gate_bias.add_(1e-3)
        logits = model(input_ids=expected["input_ids"]).logits
    with pytest.raises(AssertionError):
        assert_same_logits(logits, expected["logits"])


def test_old_config_omitting_defaulted_fields_keeps_the_old_defaults(tmp_path):
    """A config.json from before issue 21 without `tau` (a writer that drops defaulted fields) means tau "sqrt_d"
    and b_h from max_position_embeddings, not today's defaults: same parameters, same logits."""
    folder = tmp_path / "pct_v1_sqrt_d"
    shutil.copytree(FIXTURES / "pct_v1_sqrt_d", folder)
    stored = json.loads((folder / "config.json").read_text())
    for field in ("tau", "gate_bias_init"):
        del stored[field]
    (folder / "config.json").write_text(json.dumps(stored))
    model, expected = load_old(folder)
    assert model.config.tau == "sqrt_d" and model.config.train_context_length == 64
    assert model.model.layers[0].self_attn.fixed_tau == math.sqrt(8)
    with torch.no_grad():
        assert_same_logits(model(input_ids=expected["input_ids"]).logits, expected["logits"])
    # the same file re-saved today states every default explicitly and loads the same
    model.save_pretrained(tmp_path / "resaved")
    resaved = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert (resaved["tau"], resaved["train_context_length"], resaved["defaults_version"]) == ("sqrt_d", 64, 3)


def test_version_2_checkpoint_keeps_tau_20_and_gives_its_logits(tmp_path):
    """defaults_version 2 wrote `tau_init: null` for "log_learnable" from 20: loaded, re-initialised (a fresh
    model from that config.json) and re-saved, it still means 20, and the saved log_tau give that code's logits."""
    folder = FIXTURES / "pct_v2_log_learnable"
    assert json.loads((folder / "config.json").read_text())["tau_init"] is None
    model, expected = load_old(folder)
    assert (model.config.tau, model.config.initial_tau, model.config.train_context_length) == ("log_learnable", 20, 40)
    saved = load_file(str(folder / "model.safetensors"))
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), saved[name]), name
    with torch.no_grad():
        assert_same_logits(model(input_ids=expected["input_ids"]).logits, expected["logits"])
    fresh = PCTForCausalLM(PCTConfig.from_pretrained(folder))
    assert torch.equal(fresh.model.layers[0].self_attn.log_tau.detach(), torch.full((2,), math.log(20.0)))
    model.save_pretrained(tmp_path)
    resaved = json.loads((tmp_path / "config.json").read_text())
    assert (resaved["tau_init"], resaved["defaults_version"]) == (20.0, 3)


def test_new_defaults_round_trip(tmp_path):
    torch.manual_seed(0)
    config = PCTConfig(vocab_size=48, hidden_size=32, intermediate_size=48, num_attention_heads=2)
    assert (config.tau, config.initial_tau, config.train_context_length) == ("log_learnable", 5.0, 512)
    model = PCTForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.log_tau.add_(torch.tensor([0.3, -0.2]))
    model.save_pretrained(tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert (stored["defaults_version"], stored["tau_init"]) == (3, 5.0)
    loaded = PCTForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(3, 48, (2, 9))
    for ours, theirs in zip(model.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(ours, theirs)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tau": "sqrt_d", "tau_init": 10.0}, "tau_init"),
        ({"tau": 4.0, "tau_init": 10.0}, "tau_init"),
        ({"tau_init": 1e5}, "tau_init"),
        ({"tau_init": 0.0}, "tau_init"),
        ({"train_context_length": 0}, "train_context_length"),
        ({"defaults_version": 4}, "defaults_version"),
        ({"defaults_version": 0}, "defaults_version"),
    ],
)
def test_invalid_defaults_fields_name_themselves(fields, message):
    with pytest.raises(ValueError, match=message):
        PCTConfig(hidden_size=32, num_attention_heads=2, **fields)


def test_log_tau_is_capped_at_the_logit_scale_limit():
    model = PCTForCausalLM(PCTConfig(vocab_size=48, hidden_size=32, intermediate_size=48, num_attention_heads=2))
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        attention.log_tau.fill_(30.0)  # e^30 ~ 1e13: inf in float16
    assert torch.equal(attention.temperature().detach(), torch.full((2,), LOGIT_SCALE_LIMIT))
    model.half()  # log(65504) rounds up in float16 (11.094): its exp would be inf there
    attention.log_tau.data.fill_(math.log(LOGIT_SCALE_LIMIT))
    assert torch.equal(attention.temperature().detach(), torch.full((2,), LOGIT_SCALE_LIMIT))
    assert torch.isfinite(attention.temperature().half()).all()


KERNEL_CASES = [("naive", 37, torch.float64), ("panel", 37, torch.float64), ("decode", 1, torch.float64)]
if HAS_TRITON:  # TRITON_INTERPRET=1 on CPU (conftest), fp32 only
    KERNEL_CASES.append(("triton", 37, torch.float32))


@pytest.mark.parametrize(("kernel", "l_q", "dtype"), KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_log_tau_gradient_of_every_kernel_matches_float64_formula(kernel, l_q, dtype):
    """d out / d log_tau_h through each kernel's tau-per-head gradient and exp, against autograd through the
    complex128 formula (docs/design.md §4.1) with tau_h = exp(log_tau_h)."""
    (q, k, v, tau, bias), mask, grad = make_inputs((2, 3, l_q, 37, 16), padded=True, dtype=dtype)
    log_tau = tau.detach().log().requires_grad_()
    out = pct_attention(q, k, v, log_tau.exp(), bias, causal=l_q > 1, key_padding_mask=mask, kernel=kernel)
    (actual,) = torch.autograd.grad(out, log_tau, grad.to(out.dtype))
    ref_log_tau = log_tau.detach().double().requires_grad_()
    args = [t.detach().double() for t in (q, k, v)]
    expected_out = complex_formula(*args, ref_log_tau.exp(), bias.detach().double(), l_q > 1, mask)
    (expected,) = torch.autograd.grad(expected_out, ref_log_tau, grad.double())
    assert expected.abs().min() > 1e-3  # a gradient that could be wrong
    if dtype == torch.float64:
        assert_close_eps(actual, expected, ulps=1024)
    else:
        assert_close_eps(actual.double(), expected, ulps=256, dtype=torch.float32)


def test_zpx_train_sets_the_training_length_from_the_data():
    from zpx_hf_train.config import build_model_config

    assert build_model_config("run.yaml", "pct", {}, seq_len=96).train_context_length == 96
    explicit = build_model_config("run.yaml", "pct", {"train_context_length": 300}, seq_len=96)
    assert explicit.train_context_length == 300  # the user's value wins
    assert not hasattr(build_model_config("run.yaml", "zpx", {}, seq_len=96), "train_context_length")
