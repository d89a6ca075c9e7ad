"""PEFT LoRA on ZPX: targets the attention projections and the phase encoder, trains (loss drops), saves,
reloads, and `merge_and_unload` gives the adapter model's logits: to float64 rounding when compared in float64
(the merge is exact algebra), and within 64 fp32 eps x max |logit| for the fp32 merged weights. The base model
loads without remote code unless asked, a missing local base is an error, and the cards name no local path."""

from pathlib import Path

import pytest
import torch
import yaml
from peft import PeftModel
from transformers import AutoModelForCausalLM

from zpx_hf import ZPXConfig, ZPXForCausalLM
from zpx_hf.tokenization_bytes import build_byte_tokenizer
from zpx_hf_train.config import ConfigError
from zpx_hf_train.finetune_lora import (
    FinetuneArguments,
    base_model_source,
    load_finetune_config,
    run_finetune,
)

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "zpx-micro"
    torch.manual_seed(0)
    # A random base stands in for a trained one. With the default 0.02 init the LM head is so flat that no
    # adapter behind the final norm can move the loss; 0.2 gives it a pretrained-like logit range.
    config = ZPXConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        phase_channels=4,
        initializer_range=0.2,
    )
    ZPXForCausalLM(config).save_pretrained(path)
    build_byte_tokenizer().save_pretrained(path)
    return str(path)


def _lora_config(tmp_path, base, **training):
    raw = yaml.safe_load((ROOT / "configs" / "zpx-tiny-lora.yaml").read_text())
    raw["base_model"] = base
    raw["merged_output_dir"] = str(tmp_path / "merged")
    raw["data"].update(seq_len=64, train_examples_per_task=512, eval_examples_per_task=32, mqar_num_pairs=6)
    raw["training"].update(
        output_dir=str(tmp_path / "adapter"), max_steps=40, per_device_train_batch_size=16, learning_rate=1e-2,
        logging_steps=5, disable_tqdm=True, warmup_steps=0, **training,
    )  # fmt: skip
    path = tmp_path / "lora.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_lora_trains_saves_reloads_and_merges_exactly(tmp_path, base_checkpoint):
    result = run_finetune(load_finetune_config(_lora_config(tmp_path, base_checkpoint)))
    peft_model = result["trainer"].model
    adapted = {name.split(".")[-2] for name, _ in peft_model.named_parameters() if "lora_A" in name}
    assert not adapted  # merged in place by the merge check; the names are checked on the reloaded adapter below

    losses = [e["loss"] for e in result["trainer"].state.log_history if "loss" in e]
    assert losses[-1] < losses[0] - 0.5, losses
    # float64: W x + s B(A x) vs (W + s B A) x differ only by float64 rounding (~1e-15 x |logit|)
    assert result["metrics"]["merge_max_abs_logit_difference_float64"] < 1e-10
    accuracy = result["metrics"]["tasks"]["mqar"]["token_accuracy"]
    assert accuracy > result["base_metrics"]["tasks"]["mqar"]["token_accuracy"]

    adapter_dir = Path(result["output_dir"])
    assert (adapter_dir / "adapter_model.safetensors").exists() and (adapter_dir / "adapter_config.json").exists()
    assert not (adapter_dir / "model.safetensors").exists()
    assert (adapter_dir / "tokenizer.json").exists() and (adapter_dir / "metrics.json").exists()

    base = AutoModelForCausalLM.from_pretrained(base_checkpoint, trust_remote_code=True)
    reloaded = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    wrapped = {name for name, module in reloaded.named_modules() if hasattr(module, "lora_A")}
    targets = yaml.safe_load((ROOT / "configs" / "zpx-tiny-lora.yaml").read_text())["lora"]["target_modules"]
    assert {name.rsplit(".", 1)[-1] for name in wrapped} == set(targets)
    assert len(wrapped) == 2 * len(targets)
    assert any(".phase_encoder.to_theta" in name for name in wrapped)

    ids = torch.tensor(result["datasets"]["tasks"]["mqar"][:4]["input_ids"])
    with torch.no_grad():
        adapter_logits = reloaded(input_ids=ids).logits
        merged_logits = result["merged"].eval()(input_ids=ids).logits
        saved_merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", trust_remote_code=True).eval()
        saved_logits = saved_merged(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(base_checkpoint, trust_remote_code=True).eval()
        base_logits = base(input_ids=ids).logits
    # fp32 merged weights W + s B A are rounded once more than the adapter's path: bound by eps x logit magnitude
    fp32_bound = 64 * torch.finfo(torch.float32).eps * adapter_logits.abs().max().item()
    torch.testing.assert_close(merged_logits, adapter_logits, atol=fp32_bound, rtol=0)
    torch.testing.assert_close(saved_logits, adapter_logits, atol=fp32_bound, rtol=0)
    assert (adapter_logits - base_logits).abs().max() > 1e-3  # the adapter changed the model
    assert not any("lora" in name for name, _ in saved_merged.named_parameters())

    # the same comparison in float64, independently of the training job: reloaded adapter vs its own merge
    base64 = AutoModelForCausalLM.from_pretrained(base_checkpoint).to(torch.float64)
    adapter64 = PeftModel.from_pretrained(base64, str(adapter_dir)).eval()
    with torch.no_grad():
        expected = adapter64(input_ids=ids).logits
        merged64 = adapter64.merge_and_unload()(input_ids=ids).logits
    assert expected.dtype == torch.float64
    torch.testing.assert_close(merged64, expected, atol=1e-10 * expected.abs().max().item(), rtol=0)

    # the base loaded through zpx_hf (no remote code), and nothing written names a local path
    assert type(result["merged"]).__module__.startswith("zpx_hf."), type(result["merged"]).__module__
    for folder in (adapter_dir, tmp_path / "merged"):
        for name in ("README.md", "adapter_config.json", "config.json", "report.md", "metrics.json"):
            if (folder / name).exists():
                assert str(tmp_path) not in (folder / name).read_text(), folder / name
    adapter_card = (adapter_dir / "README.md").read_text()
    merged_card = (tmp_path / "merged" / "README.md").read_text()
    for card in (adapter_card, merged_card):
        header = card.split("---")[1]
        assert "license: apache-2.0" in header and "model-index:" in header and "zpx-micro" in card
    assert "library_name: peft" in adapter_card and "PeftModel.from_pretrained" in adapter_card
    assert "library_name: transformers" in merged_card and "merge_and_unload" in merged_card


def test_lora_base_model_is_local_unless_marked_and_remote_code_is_opt_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a relative name that looks like a Hub id is a local folder: missing is an error, never a Hub download
    with pytest.raises(ConfigError, match=r"`base_model`: 'runs/zpx-tiny' is not a checkpoint folder.*hf://"):
        load_finetune_config(_lora_config(tmp_path, "runs/zpx-tiny"))
    assert FinetuneArguments().trust_remote_code is False
    assert base_model_source("hf://someone/zpx") == ("someone/zpx", "someone/zpx")
    assert base_model_source("runs/zpx-tiny") == ("runs/zpx-tiny", None)


def test_lora_config_errors_name_the_key(tmp_path, base_checkpoint):
    with pytest.raises(ConfigError, match="`base_model`"):
        load_finetune_config(_lora_config(tmp_path, str(tmp_path / "missing-checkpoint")))
    path = _lora_config(tmp_path, base_checkpoint)
    raw = yaml.safe_load(Path(path).read_text())
    raw["lora"]["rnk"] = 4
    Path(path).write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="`lora.rnk`"):
        load_finetune_config(path)
    with pytest.raises(ConfigError, match="`lora.rank`"):
        load_finetune_config(_lora_config(tmp_path, base_checkpoint), ["--rank", "0"])
