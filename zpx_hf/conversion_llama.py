"""A Llama-architecture checkpoint (Llama, Mistral, Qwen2) as a ZPX checkpoint with the same logits at step 0.

ZPX with both lambdas 0 and `rotary="rope"` is softmax attention with RoPE (docs/design.md §3), so every weight of
the source keeps its place and meaning: embeddings, q/k/v/o projections (and their biases), the SwiGLU MLP, the
RMS norms and the LM head, with the source's `rope_parameters`. What ZPX adds starts where it changes nothing: the
phase encoder is initialised as in a new model and the per-head lambdas (`learnable_lambdas`) start at 0, where
the score is the source's and the lambdas still receive a gradient (docs/design.md §3.9).

    convert_llama_to_zpx("path/to/llama", "path/to/zpx")      # or: zpx-convert path/to/llama path/to/zpx

Whatever the map cannot carry exactly stops the conversion with one line naming it (`ConversionError`): another
architecture, a config field without a ZPX equivalent, a sliding window shorter than the context, an activation
other than SiLU. Grouped- and multi-query sources keep their `num_key_value_heads`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from .configuration_zpx import ZPXConfig

# Source architectures and how their attention projections carry biases: Qwen2 has q/k/v biases and none on
# o_proj, Llama one switch (`attention_bias`) for all four, Mistral none.
SOURCE_ARCHITECTURES = {
    "LlamaForCausalLM": "attention_bias",
    "MistralForCausalLM": None,
    "Qwen2ForCausalLM": "qkv",
}
# Families whose attention is not softmax over q.k: no weight of a softmax model computes what theirs do.
REFUSED_TARGETS = {
    "pct": "PCT's attention is sigmoid-gated phase coherence of complex features, not softmax over q.k, so no map "
    "from a real softmax model's weights gives the source's outputs",
    "versor": "Versor's mixers are multivector rotor recurrences and geometric-product attention, not softmax over "
    "q.k, so no map from a real softmax model's weights gives the source's outputs",
}
# Source config fields carried to the ZPX config with the same meaning.
COPIED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "max_position_embeddings",
    "rope_parameters",
    "rms_norm_eps",
    "initializer_range",
    "attention_dropout",
    "attention_bias",
    "mlp_bias",
    "tie_word_embeddings",
    "num_key_value_heads",  # grouped-query sources keep their key-value heads (docs/design.md §3.8)
    "use_cache",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)
# Fields read by the checks below (`zpx_config_from`), and fields without effect on the source's outputs:
# `pretraining_tp` (transformers 5's Llama no longer reads it), the Hub and serialisation bookkeeping.
CHECKED_FIELDS = (
    "hidden_act",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
)
IGNORED_FIELDS = (
    "pretraining_tp",
    "architectures",
    "model_type",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "_name_or_path",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "id2label",
    "label2id",
    "problem_type",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "auto_map",
)
# Tokenizer and generation files copied beside the converted weights when the source has them.
COPIED_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


class ConversionError(ValueError):
    """A source checkpoint the conversion cannot carry exactly; the one-line message names what and why."""


def zpx_config_from(source: Any, phase_channels: int = 8, learnable_lambdas: bool = True) -> ZPXConfig:
    """The ZPX config whose model at lambdas 0 computes what `source` (a Llama, Mistral or Qwen2 config) does."""
    architectures = list(getattr(source, "architectures", None) or [])
    architecture = architectures[0] if len(architectures) == 1 else None
    if architecture not in SOURCE_ARCHITECTURES:
        raise ConversionError(
            f"source architecture {architectures or source.model_type!r} is not supported: zpx-convert takes "
            f"{', '.join(SOURCE_ARCHITECTURES)}."
        )
    fields = source.to_dict()
    unknown = sorted(set(fields) - set(COPIED_FIELDS) - set(CHECKED_FIELDS) - set(IGNORED_FIELDS))
    if unknown:
        raise ConversionError(
            f"source config field `{unknown[0]}`={fields[unknown[0]]!r} has no ZPX equivalent, so the converted model "
            "could not compute what the source does."
        )
    if source.hidden_act != "silu":
        raise ConversionError(
            f"source config field `hidden_act`={source.hidden_act!r}: ZPX's feed-forward layer is SwiGLU with SiLU."
        )
    layer_types = set(getattr(source, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ConversionError(f"source config field `layer_types`={sorted(layer_types)}: ZPX layers attend fully.")
    window = getattr(source, "sliding_window", None)
    if window is not None and window < source.max_position_embeddings:
        raise ConversionError(
            f"source config field `sliding_window`={window} is shorter than max_position_embeddings="
            f"{source.max_position_embeddings}: ZPX has no sliding-window attention, so outputs past {window} tokens "
            "would differ."
        )
    kwargs = {field: fields[field] for field in COPIED_FIELDS if field in fields}
    if SOURCE_ARCHITECTURES[architecture] == "qkv":
        kwargs["attention_bias"] = True  # o_proj gets a zero bias (`convert_llama_to_zpx`)
    if window is not None:  # a window at least the context: exact up to it, so longer inputs are refused
        kwargs["allow_longer_positions"] = False
    try:
        return ZPXConfig(
            **kwargs,
            rotary="rope",
            lambda_angle=0.0,
            lambda_sphere=0.0,
            learnable_lambdas=learnable_lambdas,
            phase_channels=phase_channels,
            center_loss_weight=0.0,
            architectures=["ZPXForCausalLM"],
        )
    except ValueError as error:
        raise ConversionError(f"the source config gives a ZPX config that is invalid: {error}") from error


def convert_llama_to_zpx(
    source: str | Path,
    output: str | Path,
    *,
    phase_channels: int = 8,
    learnable_lambdas: bool = True,
    seed: int = 0,
    overwrite: bool = False,
    family: str = "zpx",
) -> Path:
    """Write a ZPX checkpoint to `output` (safetensors, remote code, the source's tokenizer and generation files, a
    model card) whose logits equal those of the local checkpoint folder `source`; returns `output`.

    `phase_channels`: C of the new phase encoder (initialised from `seed`); `learnable_lambdas`: per-head lambdas
    trained from 0 (else both stay fixed at 0 and the model stays the source's); `family`: only "zpx" (PCT and
    Versor are refused, `REFUSED_TARGETS`). Raises `ConversionError` naming
    what cannot be carried (also a missing source, or a non-empty `output` unless `overwrite`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .modeling_zpx import ZPXForCausalLM

    source, output = Path(source), Path(output)
    if not (source / "config.json").is_file():
        raise ConversionError(f"source {str(source)!r} is not a checkpoint folder (it has no config.json).")
    if output.resolve() == source.resolve():
        raise ConversionError(f"output {str(output)!r} is the source folder; choose another folder.")
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not overwrite:
        raise ConversionError(f"output {str(output)!r} exists and is not empty; choose another folder or overwrite.")
    if family != "zpx":
        reason = REFUSED_TARGETS.get(family, f"{family!r} is not a family this package converts into")
        raise ConversionError(f"conversion into {family!r} is refused: {reason}; convert into 'zpx'.")
    source_config = AutoConfig.from_pretrained(source, local_files_only=True)
    config = zpx_config_from(source_config, phase_channels, learnable_lambdas)
    source_model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype="auto")
    dtype = source_model.dtype
    torch.manual_seed(seed)
    # arg-type: transformers wraps `PreTrainedModel.to` in `functools.wraps`, which mypy does not bind to the instance
    model = ZPXForCausalLM(config).to(dtype)  # type: ignore[arg-type]
    state = source_model.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False)
    added = {key for key in missing if ".phase_encoder." in key or "lambda_" in key or key.endswith("o_proj.bias")}
    if unexpected or set(missing) - added:
        problem = sorted(unexpected) or sorted(set(missing) - added)
        raise ConversionError(f"the source weights do not map onto ZPX's: `{problem[0]}` has no counterpart.")
    with torch.no_grad():
        for key in missing:
            if key.endswith("o_proj.bias"):  # Qwen2 has none: 0 keeps the source's outputs
                model.get_parameter(key).zero_()
    model.eval()
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    for name in COPIED_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, output / name)
    (output / "README.md").write_text(model_card(source, source_config, config, sorted(added)), encoding="utf-8")
    return output


def model_card(source: Path, source_config: Any, config: ZPXConfig, added: list[str]) -> str:
    """What a converted checkpoint is: its source (by folder name: a card never holds a local path), what is exact,
    what is new and learned."""
    architecture = source_config.architectures[0]
    new = sorted({key.split(".layers.", 1)[-1].split(".", 1)[-1].removesuffix(".weight") for key in added})
    learned = "; per-head lambdas trained from 0" if config.learnable_lambdas else ""
    zero_bias = "; the source has no `o_proj` bias: it starts at 0" if "self_attn.o_proj.bias" in new else ""
    return f"""---
library_name: transformers
tags:
- zpx-hf
- zpx
- custom_code
- converted
---

# ZPX converted from {architecture}

Converted with zpx-hf `zpx-convert` from the checkpoint folder `{source.name}` ({architecture}, model type
`{source_config.model_type}`, {source_config.num_hidden_layers} layers, hidden size {source_config.hidden_size},
{source_config.num_attention_heads} heads).

- **Exact at step 0**: with `lambda_angle = lambda_sphere = 0` and `rotary="rope"` ZPX is softmax attention with
  the source's RoPE (`rope_parameters` = `{config.rope_parameters}`), so this model's logits are the source's
  (tests/test_conversion_llama.py: float64 within 1e-10, float32 within rounding, greedy generation identical).
- **Kept** from the source: embeddings, q/k/v/o projections and their biases, the SwiGLU MLP, the RMS norms, the
  LM head, the tokenizer and generation settings.
- **New**: {", ".join(f"`{name}`" for name in new)} (the phase encoder with {config.phase_channels} channels per head,
  initialised as in a new ZPX model{learned}{zero_bias}).
  At lambdas 0 the phase encoder changes nothing and receives no gradient until the lambdas move off 0.

Load with `AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)`, or continue training with
`zpx-train` and `model: {{init_from: path}}` (docs/training.md).
"""


__all__ = [
    "ConversionError",
    "SOURCE_ARCHITECTURES",
    "convert_llama_to_zpx",
    "zpx_config_from",
]
