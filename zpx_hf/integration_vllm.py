"""vLLM: serve ZPX through vLLM's Transformers backend (`vllm.LLM(model=..., model_impl="transformers")`).

ZPX attention is softmax attention on q^ . k^ (`ZPXAttention.engine_inputs`), so vLLM's own paged attention
computes it: `ZPXAttention.forward` looks the implementation up in `ALL_ATTENTION_FUNCTIONS` and calls it once
with the standard signature and `scaling=self.scaling`, which is what vLLM's Transformers backend finds in the
forward source. Its attention layers and paged KV cache are sized by the head size vLLM derives from the config,
`head_dim` by default; ZPX hands the engine `config.engine_head_dim` (d + 5C, padded to a multiple of 8), not
d. `register()` tells vLLM so, for `model_type="zpx"`. vLLM calls it in each of its processes through the plugin
entry point `vllm.general_plugins` (pyproject.toml) when zpx-hf is installed in vLLM's environment; otherwise
call it before `vllm.LLM(...)`. Only configuration: the model vLLM runs is the checkpoint's own remote code.
"""

from __future__ import annotations


def register() -> None:
    """Register vLLM's model-architecture convertor for ZPX checkpoints (idempotent; needs vLLM)."""
    import vllm.config  # noqa: F401  (first: the convertor module is imported through it, in a cycle otherwise)
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    class ZPXModelArchConfigConvertor(ModelArchConfigConvertorBase):
        """vLLM's default reading of a config, with the head size ZPX's attention hands the engine."""

        def get_head_size(self) -> int:
            return self.hf_text_config.engine_head_dim

    MODEL_ARCH_CONFIG_CONVERTORS.setdefault("zpx", ZPXModelArchConfigConvertor)


__all__ = ["register"]
