"""The pipeline is family-agnostic: every family's tiny config trains a few steps, saves a checkpoint with a
filled model card, and reloads through AutoModelForCausalLM."""

import json
from pathlib import Path

import pytest
import torch
from helpers_training import SMALL
from transformers import AutoModelForCausalLM

import zpx_hf
from zpx_hf_train.train import load_run_config, run_training

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = sorted(f for f in zpx_hf.FAMILIES if (ROOT / "configs" / f"{f}-tiny.yaml").exists())

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """family -> (output folder, run_training's result) of its tiny config's short run, trained once for this
    module: both tests below start from that same run (the LoRA test fine-tunes its saved checkpoint)."""
    runs = {}

    def get(family: str):
        if family not in runs:
            output_dir = tmp_path_factory.mktemp(family)
            run = load_run_config(
                str(ROOT / "configs" / f"{family}-tiny.yaml"), [*SMALL, "--output_dir", str(output_dir)]
            )
            runs[family] = output_dir, run_training(run)
        return runs[family]

    yield get
    runs.clear()


@pytest.mark.parametrize("family", FAMILIES)
def test_family_tiny_config_trains_saves_and_reloads(family, trained):
    output_dir, result = trained(family)
    assert result["trainer"].state.global_step == 2
    card = (output_dir / "README.md").read_text()
    assert f"- {family}" in card.split("---")[1] and "${" not in card
    assert (ROOT / "model_cards" / f"{family}.md").exists()
    assert (output_dir / "model.safetensors").exists() and (output_dir / "tokenizer.json").exists()
    model = AutoModelForCausalLM.from_pretrained(output_dir, trust_remote_code=True).eval()
    ids = torch.tensor([[1, 70, 71, 72, 73]])
    with torch.no_grad():
        expected = result["trainer"].model.eval()(input_ids=ids).logits
        torch.testing.assert_close(model(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_lora_default_targets_merge_exactly(family, tmp_path, trained):
    from zpx_hf.integration_peft import LORA_TARGET_MODULES
    from zpx_hf_train.finetune_lora import FinetuneArguments, LoraArguments, load_finetune_config, run_finetune

    base, _ = trained(family)
    lora = load_finetune_config(
        str(ROOT / "configs" / "zpx-tiny-lora.yaml"),
        [*SMALL, "--base_model", str(base), "--output_dir", str(tmp_path / "adapter"), "--target_modules", "default"],
    )
    lora[FinetuneArguments].merged_output_dir = None
    assert lora[LoraArguments].target_modules == ["default"]
    result = run_finetune(lora)
    assert result["metrics"]["merge_max_abs_logit_difference_float64"] < 1e-10
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    adapter_config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(adapter_config["target_modules"]) == sorted(LORA_TARGET_MODULES[family])  # the family default
