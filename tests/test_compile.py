"""torch.compile: a training step of every family and every Versor mixer is one graph, forward and backward.
Versor runs as its hybrid, whose two layers are one RRA and one GPA mixer (`VersorConfig.layer_mixer`, the only
place the mixer choice enters the model), so its step traces both mixers' code; an all-RRA or all-GPA model
would trace a subset of it.

The step (forward with labels and a padded attention mask, as `Trainer` passes them) is compiled with
`fullgraph=True`, so any graph break raises, by the `aot_eager` backend: AOTAutograd traces the backward
into a graph too (an untraceable backward fails the compile), and it skips inductor's C++ code generation,
which is slow on a CPU. Loss and every gradient must equal the eager step's (same weights, same batch) to a
tolerance of a few float32 ulps of each tensor's magnitude. Both attention implementations are compiled:
`"sdpa"` (the fast paths) and `"eager"` (the readable references) for each family (Versor's hybrid holds both
fast paths and both references, the sequential RRA and the materialised GPA). The tiled fast paths get tiles of
4 rows / keys, so the 9-token batch crosses several tiles as long sequences do.
"""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILY_CASES, make_tiny_config

import zpx_hf
from zpx_hf import ops_gpa_chunk, ops_pct_panel

CASES = FAMILY_CASES
RUNS = [
    pytest.param(case, implementation, id=f"{case}-{implementation}")
    for case in CASES
    for implementation in ("sdpa", "eager")
]
# |compiled - eager| <= ULPS * eps(float32) * max|eager| per tensor: the graph may reorder float32 sums.
ULPS = 64


def training_batch(vocab_size: int) -> dict[str, torch.Tensor]:
    """Two sequences of 9 tokens, the second left-padded by 3, with labels ignoring the padding."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, vocab_size, (2, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0
    input_ids[1, :3] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def loss_and_grads(model: torch.nn.Module, step, batch: dict[str, torch.Tensor]):
    model.zero_grad(set_to_none=True)
    loss = step(**batch)
    loss.backward()
    return loss.detach(), {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_close_ulps(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    bound = ULPS * torch.finfo(torch.float32).eps * max(1.0, float(expected.abs().max()))
    error = float((actual.double() - expected.double()).abs().max())
    assert error <= bound, f"{name}: compiled differs from eager by {error:.3g} > {bound:.3g}"


@pytest.mark.parametrize(("case", "implementation"), RUNS)
def test_training_step_compiles_to_one_graph_and_matches_eager(case: str, implementation: str, monkeypatch) -> None:
    monkeypatch.setattr(ops_pct_panel, "PANEL_ROWS", 4)
    monkeypatch.setattr(ops_gpa_chunk, "PANEL", 4)
    monkeypatch.setattr(ops_gpa_chunk, "BLOCK", 4)
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = make_tiny_config(case)
    model = zpx_hf.FAMILIES[case.split("-")[0]][2](config)
    model.set_attn_implementation(implementation)
    model.train()
    batch = training_batch(config.vocab_size)

    def step(**inputs: torch.Tensor) -> torch.Tensor:
        return model(**inputs).loss

    eager_loss, eager_grads = loss_and_grads(model, step, batch)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    compiled_loss, compiled_grads = loss_and_grads(model, compiled, batch)

    assert torch.isfinite(eager_loss)
    assert_close_ulps(compiled_loss, eager_loss, "loss")
    assert compiled_grads.keys() == eager_grads.keys()
    assert len(eager_grads) == sum(1 for p in model.parameters() if p.requires_grad)
    for name, grad in eager_grads.items():
        assert_close_ulps(compiled_grads[name], grad, name)


def test_compiled_input_checks_are_eager_only() -> None:
    """The value checks (token range) run in eager mode and are skipped, not broken on, when compiling."""
    torch._dynamo.reset()
    config = make_tiny_config("zpx")
    model = zpx_hf.FAMILIES["zpx"][2](config)
    bad = torch.full((1, 4), config.vocab_size + 5)
    with pytest.raises(ValueError, match="input_ids"):
        model(input_ids=bad)
    explanation = torch._dynamo.explain(lambda ids: model(input_ids=ids).logits)(torch.zeros(1, 4, dtype=torch.long))
    assert explanation.graph_break_count == 0, [reason.reason for reason in explanation.break_reasons]
    assert explanation.graph_count == 1
