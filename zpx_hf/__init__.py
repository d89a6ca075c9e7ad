"""zpx-hf: geometric attention families for Hugging Face transformers.

Importing the package registers every family with the Auto classes and marks the model
classes for remote-code export, so `save_pretrained` writes a self-contained checkpoint
that loads with `trust_remote_code=True` where `zpx_hf` is not installed. Each family's PEFT defaults
(`integration_peft.py`) are registered when `peft` is imported (at once if it already is): importing
zpx_hf imports no optional package (peft, torchao, vllm).
"""

import importlib

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
)

from .configuration_pct import PCTConfig
from .configuration_versor import VersorConfig
from .configuration_zpx import ZPXConfig
from .conversion_llama import convert_llama_to_zpx
from .integration_imports import after_import
from .modeling_pct import PCTForCausalLM, PCTForSequenceClassification, PCTModel
from .modeling_versor import VersorForCausalLM, VersorForSequenceClassification, VersorModel
from .modeling_zpx import ZPXForCausalLM, ZPXForSequenceClassification, ZPXModel

__version__ = "0.1.0"

FAMILIES = {
    "zpx": (ZPXConfig, ZPXModel, ZPXForCausalLM, ZPXForSequenceClassification),
    "pct": (PCTConfig, PCTModel, PCTForCausalLM, PCTForSequenceClassification),
    "versor": (VersorConfig, VersorModel, VersorForCausalLM, VersorForSequenceClassification),
}


def _register(config_class, model_class, causal_lm_class, classification_class) -> None:
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModel.register(config_class, model_class, exist_ok=True)
    AutoModelForCausalLM.register(config_class, causal_lm_class, exist_ok=True)
    AutoModelForSequenceClassification.register(config_class, classification_class, exist_ok=True)
    config_class.register_for_auto_class("AutoConfig")
    model_class.register_for_auto_class("AutoModel")
    causal_lm_class.register_for_auto_class("AutoModelForCausalLM")
    classification_class.register_for_auto_class("AutoModelForSequenceClassification")


for _classes in FAMILIES.values():
    _register(*_classes)

# default LoRA targets, Versor LoRA, prefix-tuning refusal (see integration_peft), once peft is imported
after_import("peft", lambda: importlib.import_module(f"{__name__}.integration_peft"))

__all__ = [
    "ZPXConfig",
    "ZPXModel",
    "ZPXForCausalLM",
    "ZPXForSequenceClassification",
    "PCTConfig",
    "PCTModel",
    "PCTForCausalLM",
    "PCTForSequenceClassification",
    "VersorConfig",
    "VersorModel",
    "VersorForCausalLM",
    "VersorForSequenceClassification",
    "FAMILIES",
    "convert_llama_to_zpx",
]
