"""A `LlamaForCausalLM` of the tiny ZPX / PCT size, the baseline the edge tests run beside every family."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from conftest import TINY_VOCAB
from transformers import LlamaConfig

T = TypeVar("T")


# The tiny ZPX / PCT widths (hidden 32, 2 layers, 2 heads) as Llama-architecture config arguments.
TINY_LLAMA_SIZE = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=64,
)


def tiny_llama_config(**overrides) -> LlamaConfig:
    """Llama with the tiny ZPX / PCT widths (`TINY_LLAMA_SIZE`), `overrides` applied."""
    return LlamaConfig(**{**TINY_LLAMA_SIZE, **overrides})


def upstream_versions() -> str:
    """The versions an upstream break is seen under (torch, transformers, and peft / onnx where imported)."""
    import sys

    import torch
    import transformers

    names = [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    names += [f"{name} {sys.modules[name].__version__}" for name in ("peft", "onnx") if sys.modules.get(name)]
    return ", ".join(names)


def like_llama(llama: Callable[[], Any], ours: Callable[[], T], what: str) -> T:
    """Run `what` on a same-size Llama, then on our model. Where Llama works, ours must (its error fails the test);
    where Llama fails too, the break is upstream: the test is xfailed naming the versions and both errors, so the
    day a release breaks (or mends) it shows in the report, and the day Llama works again ours must."""
    import pytest

    try:
        llama()
    except Exception as llama_error:
        try:
            return ours()
        except Exception as error:
            pytest.xfail(
                f"upstream break: {what} fails on a same-size LlamaForCausalLM too under {upstream_versions()}: "
                f"Llama: {type(llama_error).__name__}: {str(llama_error)[:200]}; "
                f"ours: {type(error).__name__}: {str(error)[:200]}"
            )
    return ours()


def float64_norms(model):
    """`model` with every `LlamaRMSNorm` (Mistral's and Qwen2's are the same class renamed) computing
    `w * x / sqrt(mean(x^2) + eps)` in the input dtype.

    transformers' Llama rounds each norm's input to float32 (a float64 Llama is float32-accurate there), while the
    families' norms keep float64; for comparisons at float64 precision the reference's norms keep it too (the same
    formula; attention, rotary tables and MLP stay transformers' own)."""
    import types

    import torch

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    for module in model.modules():
        if type(module).__name__ in ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm"):
            module.forward = types.MethodType(forward, module)
    return model
