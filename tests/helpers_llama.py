"""A `LlamaForCausalLM` of the tiny ZPX / PCT size, the baseline the edge tests run beside every family."""

from __future__ import annotations

from conftest import TINY_VOCAB
from transformers import LlamaConfig


def tiny_llama_config(**overrides) -> LlamaConfig:
    """Llama with the tiny ZPX / PCT widths (hidden 32, 2 layers, 2 heads), `overrides` applied."""
    kwargs = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)
