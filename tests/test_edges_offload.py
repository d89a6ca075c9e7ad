"""accelerate disk and CPU offload on every family and Versor mixer, against the plain model and a same-size Llama.

Offloading replaces each module's forward with a hook that loads that module's own parameters just before its call
(they sit on the meta device otherwise), so any parameter read outside its module's call would see a meta tensor.
Every model here is float64, so offloaded and plain logits must agree to float64 rounding although the offloaded
run takes the modules' own calls instead of the fused paths."""

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_config
from helpers_llama import tiny_llama_config
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import zpx_hf  # noqa: F401

accelerate = pytest.importorskip("accelerate")

CASES = ("zpx", "pct", "versor-rra", "versor-gpa", "versor-hybrid", "llama")
TOLERANCE = 1e-10  # float64: summation-order differences are ~1e-15 of logits of order 1


def tiny_model(case: str):
    torch.manual_seed(0)
    if case == "llama":
        config = tiny_llama_config()
        return LlamaForCausalLM(config).double().eval()
    return AutoModelForCausalLM.from_config(make_tiny_config(case)).double().eval()


def tokens() -> torch.Tensor:
    return torch.randint(3, TINY_VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))


def assert_parameters_offloaded(model) -> None:
    meta = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    assert meta, "nothing was offloaded: the test would not exercise the hooks"


@pytest.mark.parametrize("case", CASES)
def test_disk_offloaded_from_pretrained_matches_the_plain_model(case, tmp_path):
    model = tiny_model(case)
    ids = tokens()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        expected_generation = model.generate(input_ids=ids[:, :5], max_new_tokens=4, do_sample=False)
    model.save_pretrained(tmp_path / "ckpt")
    offloaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "ckpt", device_map={"": "disk"}, offload_folder=tmp_path / "offload", dtype=torch.float64
    ).eval()
    assert_parameters_offloaded(offloaded)
    with torch.no_grad():
        logits = offloaded(input_ids=ids).logits
        generation = offloaded.generate(input_ids=ids[:, :5], max_new_tokens=4, do_sample=False)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, expected, rtol=0, atol=TOLERANCE)
    assert torch.equal(generation, expected_generation)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("how", ["disk_offload", "cpu_offload"])
def test_accelerate_offload_helpers_match_the_plain_model(case, how, tmp_path):
    model = tiny_model(case)
    ids = tokens()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    if how == "disk_offload":
        accelerate.disk_offload(model, tmp_path / "offload", execution_device=torch.device("cpu"))
    else:
        accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert_parameters_offloaded(model)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=TOLERANCE)
