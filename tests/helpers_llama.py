"""A `LlamaForCausalLM` of the tiny ZPX / PCT size, the baseline the edge tests run beside every family."""

from __future__ import annotations

from conftest import TINY_VOCAB
from transformers import LlamaConfig

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
