"""torch.export with dynamic batch and sequence, and ONNX through the dynamo exporter run by onnxruntime, at
shapes other than the example's; logits within 1e-4 of eager (every family, and Llama beside them).

Versor's RRA mixer (and so the hybrid) exports through its "export" kernel (ops_rra_export.py: real
arithmetic, a scan traced once for every length), which "auto" picks under export; it is tested here
against the eager kernels in float64.
"""

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_config
from torch.export import Dim
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import zpx_hf  # noqa: F401

EXAMPLE = (2, 12)
OTHER_SHAPES = ((3, 7), (1, 20))  # batch 1 and a longer sequence than the example
CASES = ("llama", "zpx", "pct", "versor-gpa", "versor-rra", "versor-hybrid")


class Logits(torch.nn.Module):
    """input_ids -> logits, no cache: what a serving graph computes."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def build(case: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if case == "llama":
        config = LlamaConfig(
            vocab_size=TINY_VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=64,
        )
        return Logits(LlamaForCausalLM(config).eval())
    return Logits(AutoModelForCausalLM.from_config(make_tiny_config(case)).eval())


def token_ids(batch: int, length: int) -> torch.Tensor:
    return torch.randint(3, TINY_VOCAB, (batch, length), generator=torch.Generator().manual_seed(batch * length))


DYNAMIC = ({0: Dim("batch", max=32), 1: Dim("sequence", min=2, max=64)},)


def assert_close_to_eager(out: torch.Tensor, eager: torch.Tensor) -> None:
    assert out.shape == eager.shape
    assert (out - eager).abs().max() <= 1e-4, (out - eager).abs().max()


@pytest.mark.parametrize("case", CASES)
def test_torch_export_dynamic_batch_and_sequence(case):
    model = build(case)
    program = torch.export.export(model, (token_ids(*EXAMPLE),), dynamic_shapes=DYNAMIC, strict=False)
    exported = program.module()
    for shape in OTHER_SHAPES:
        ids = token_ids(*shape)
        with torch.no_grad():
            assert_close_to_eager(exported(ids), model(ids))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_onnx_dynamo_export_runs_in_onnxruntime(case, tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    model = build(case)
    program = torch.onnx.export(
        model,
        (token_ids(*EXAMPLE),),
        dynamo=True,
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_shapes=DYNAMIC,
    )
    program.save(str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for shape in OTHER_SHAPES:
        ids = token_ids(*shape)
        (logits,) = session.run(None, {"input_ids": ids.numpy()})
        with torch.no_grad():
            assert_close_to_eager(torch.from_numpy(logits), model(ids))
