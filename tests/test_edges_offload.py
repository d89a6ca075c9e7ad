"""accelerate disk and CPU offload on every family and Versor mixer, against the plain model and a same-size Llama.

Offloading replaces each module's forward with a hook that loads that module's own parameters just before its call
(they sit on the meta device otherwise), so any parameter read outside its module's call would see a meta tensor.
Every model here is float64, so offloaded and plain logits must agree to float64 rounding although the offloaded
run takes the modules' own calls instead of the fused paths."""

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_config
from helpers_llama import tiny_llama_config
from packaging.version import Version
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import zpx_hf  # noqa: F401

accelerate = pytest.importorskip("accelerate")

CASES = ("zpx", "pct", "versor-rra", "versor-gpa", "versor-hybrid", "llama")
# Upstream: accelerate before 1.15 refuses a whole-model disk map in `dispatch_model` ("use the `disk_offload`
# function instead"), for Llama too; `disk_offload` itself works there. Strict: the mark goes when it passes.
WHOLE_DISK_MAP = pytest.mark.xfail(
    Version(accelerate.__version__) < Version("1.15"),
    reason="accelerate < 1.15 refuses device_map={'': 'disk'} in dispatch_model (upstream, Llama too)",
    raises=ValueError,
    strict=True,
)
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


@WHOLE_DISK_MAP
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


def heldout_rows() -> dict[str, list[list[int]]]:
    ids = torch.randint(3, TINY_VOCAB, (3, 9), generator=torch.Generator().manual_seed(3))
    answer_mask = torch.zeros_like(ids)
    answer_mask[:, 5:] = 1
    return {
        "input_ids": ids.tolist(),
        "attention_mask": torch.ones_like(ids).tolist(),
        "labels": ids.tolist(),
        "answer_mask": answer_mask.tolist(),
    }


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("how", [pytest.param("from_pretrained_disk", marks=WHOLE_DISK_MAP), "disk_offload"])
def test_evaluation_sends_batches_to_the_execution_device_of_an_offloaded_model(case, how, tmp_path):
    # the first parameter of an offloaded model is on the meta device; batches sent there cannot run
    datasets = pytest.importorskip("datasets")
    from zpx_hf_train.evaluation import input_device, perplexity, task_accuracy

    rows = datasets.Dataset.from_dict(heldout_rows())
    model = tiny_model(case)
    expected = perplexity(model, rows, batch_size=2), task_accuracy(model, rows, batch_size=2)
    if how == "disk_offload":
        accelerate.disk_offload(model, tmp_path / "offload", execution_device=torch.device("cpu"))
    else:
        model.save_pretrained(tmp_path / "ckpt")
        model = AutoModelForCausalLM.from_pretrained(
            tmp_path / "ckpt", device_map={"": "disk"}, offload_folder=tmp_path / "offload", dtype=torch.float64
        )
    assert_parameters_offloaded(model)
    assert next(model.parameters()).device.type == "meta" and input_device(model) == torch.device("cpu")
    heldout, tasks = perplexity(model, rows, batch_size=2), task_accuracy(model, rows, batch_size=2)
    assert heldout["tokens"] == expected[0]["tokens"] == 3 * 8
    assert heldout["loss"] == pytest.approx(expected[0]["loss"], rel=TOLERANCE)
    assert tasks == expected[1]


def test_input_device_follows_the_device_map_as_transformers_does():
    from zpx_hf_train.evaluation import input_device

    model = tiny_model("zpx")
    model.hf_device_map = {"model.embed_tokens": "cpu", "model.layers": "disk", "lm_head": "cpu"}
    assert input_device(model) == torch.device("cpu")
    model.hf_device_map = {"model.embed_tokens": "disk", "model.layers.0": "cuda:1", "model.layers.1": "cuda:0"}
    assert input_device(model) == torch.device("cuda:1")  # offloaded embedding: it runs on the map's first accelerator
    model.hf_device_map = {"model.layers": "cuda:0", "model": "cuda:1"}
    assert input_device(model) == torch.device("cuda:1")  # the most specific entry that holds the embedding
