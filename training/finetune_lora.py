#!/usr/bin/env python
"""LoRA fine-tuning of a saved zpx-hf checkpoint with PEFT and the HF `Trainer`.

    python training/finetune_lora.py configs/zpx-tiny-lora.yaml [--base_model runs/zpx-tiny --max_steps 100 ...]
    accelerate launch --config_file configs/accelerate/ddp_cpu.yaml training/finetune_lora.py configs/zpx-tiny-lora.yaml

YAML layout: top-level `FinetuneArguments` (`base_model`, ...), `lora:` (`LoraArguments`), `data:` and
`training:` as in `training/train.py`. For ZPX the adapters go on the attention projections
(`q_proj, k_proj, v_proj, o_proj`) and the phase encoder (`to_log_r, to_theta, to_b`); other families
default to every linear layer but the LM head. The output folder holds the adapter (safetensors) and the
tokenizer; `merged_output_dir` also receives the merged, self-contained remote-code checkpoint.
After training, `merge_and_unload()` is checked against the adapter model on held-out inputs and the
largest logit difference is written to `metrics.json`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train import (  # noqa: E402
    ConfigError,
    DataArguments,
    RunConfig,
    build_datasets,
    build_trainer,
    cli_main,
    parse_config_file,
    resolve_resume,
    validate_data_args,
)

LORA_TARGETS = {"zpx": ["q_proj", "k_proj", "v_proj", "o_proj", "to_log_r", "to_theta", "to_b"]}


@dataclass
class FinetuneArguments:
    """Top-level keys of a LoRA config."""

    base_model: str | None = field(default=None, metadata={"help": "Checkpoint folder (or Hub id) to adapt."})
    trust_remote_code: bool = field(default=True, metadata={"help": "Load the checkpoint's own modelling code."})
    merged_output_dir: str | None = field(
        default=None, metadata={"help": "Also save the merged (LoRA folded in) full checkpoint here."}
    )


@dataclass
class LoraArguments:
    """The `lora:` section (peft.LoraConfig)."""

    rank: int = field(default=8, metadata={"help": "LoRA rank r."})
    alpha: float = field(default=16.0, metadata={"help": "LoRA scaling numerator lora_alpha."})
    dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA input."})
    target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Module names to adapt; null or [default]: the family's list, else all-linear."},
    )
    bias: str = field(default="none", metadata={"help": "peft bias mode: none, all or lora_only."})


def load_finetune_config(path: str, cli_args: Sequence[str] = ()) -> RunConfig:
    """Parse and validate a LoRA config; raises `ConfigError` naming the key before anything is loaded."""
    from transformers import TrainingArguments

    from zpx_hf.data_tasks import is_local_source

    run = parse_config_file(
        path,
        cli_args,
        top=FinetuneArguments,
        sections={"lora": LoraArguments, "data": DataArguments, "training": TrainingArguments},
        mappings=(),
    )
    base = run[FinetuneArguments].base_model
    if base is None:
        raise ConfigError(f"{path}: key `base_model` is missing: give the checkpoint folder to fine-tune.")
    if is_local_source(base) and not os.path.isfile(os.path.join(os.path.expanduser(base), "config.json")):
        raise ConfigError(
            f"{path}: key `base_model`: {base!r} is not a checkpoint folder (no config.json); "
            "train one first, e.g. `python training/main_job.py`."
        )
    lora = run[LoraArguments]
    if lora.rank < 1:
        raise ConfigError(f"{path}: key `lora.rank` = {lora.rank} must be >= 1.")
    if not 0 <= lora.dropout < 1:
        raise ConfigError(f"{path}: key `lora.dropout` = {lora.dropout} must be in [0, 1).")
    if lora.bias not in ("none", "all", "lora_only"):
        raise ConfigError(f"{path}: key `lora.bias` = {lora.bias!r} must be one of none, all, lora_only.")
    validate_data_args(path, run[DataArguments])
    return run


def lora_targets(model_type: str, requested: list[str] | None) -> list[str] | str:
    """The requested module names, or (for None / `[default]`) the family's list, else every linear layer."""
    if requested and requested != ["default"]:
        return requested
    return LORA_TARGETS.get(model_type, "all-linear")


def merged_logit_difference(peft_model: Any, inputs: dict[str, Any]) -> tuple[Any, float]:
    """Merge the adapter into the base weights; returns the merged model and max |logits(adapter) - logits(merged)|."""
    import torch

    peft_model.eval()
    with torch.no_grad():
        before = peft_model(**inputs).logits
        merged = peft_model.merge_and_unload()
        after = merged(**inputs).logits
    return merged, (before - after).abs().max().item()


def run_finetune(run: RunConfig, callbacks: Sequence = ()) -> dict[str, Any]:
    """LoRA-train, save the adapter, check and (optionally) save the merge, evaluate, write the report.

    Returns `{"output_dir", "metrics", "base_metrics", "train_metrics", "trainer", "merged", "datasets"}`.
    """
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments, set_seed

    from zpx_hf.evaluation import evaluate_model, write_report

    args, lora, data = run[FinetuneArguments], run[LoraArguments], run[DataArguments]
    training_args = run[TrainingArguments]
    resume = resolve_resume(training_args)
    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(args.base_model, trust_remote_code=args.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(args.base_model, trust_remote_code=args.trust_remote_code)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(max_positions, int) and data.seq_len > max_positions:
        if not getattr(model.config, "allow_longer_positions", False):
            raise ConfigError(f"key `data.seq_len` = {data.seq_len} exceeds the base model's {max_positions}.")
    datasets = build_datasets(data)
    batch = training_args.per_device_eval_batch_size
    base_metrics = evaluate_model(model, datasets["heldout"], datasets["tasks"], batch)

    set_seed(training_args.seed)
    targets = lora_targets(model.config.model_type, lora.target_modules)
    peft_config = LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias=lora.bias,
    )
    peft_model = get_peft_model(model, peft_config)
    trainable, total = peft_model.get_nb_trainable_parameters()
    if training_args.label_names is None:
        training_args.label_names = ["labels"]
    trainer = build_trainer(peft_model, tokenizer, training_args, datasets["train"], datasets["heldout"], callbacks)
    train_output = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()  # adapter_model.safetensors + adapter_config.json + tokenizer
    train_metrics = dict(train_output.metrics)

    metrics: dict[str, Any] = {}
    merged = None
    if trainer.is_world_process_zero():
        probe = datasets["heldout"] if datasets["heldout"] is not None else next(iter(datasets["tasks"].values()))
        rows = probe[: min(len(probe), 8)]
        device = next(peft_model.parameters()).device
        inputs = {key: torch.tensor(rows[key], device=device) for key in ("input_ids", "attention_mask")}
        merged, difference = merged_logit_difference(peft_model, inputs)
        metrics = evaluate_model(merged, datasets["heldout"], datasets["tasks"], batch)
        metrics["merge_max_abs_logit_difference"] = difference
        details = {
            "base_model": args.base_model,
            "target_modules": ", ".join(targets) if isinstance(targets, list) else targets,
            "rank": lora.rank,
            "alpha": lora.alpha,
            "trainable_parameters": trainable,
            "total_parameters": total,
            "steps": trainer.state.global_step,
            "final_train_loss": round(train_metrics.get("train_loss", float("nan")), 4),
            "train_runtime_s": round(train_metrics.get("train_runtime", 0.0), 1),
        }
        details.update({f"base {k}": v for k, v in _flat(base_metrics).items()})
        history = trainer.state.log_history
        write_report(training_args.output_dir, metrics, history, title="LoRA fine-tune", details=details)
        if args.merged_output_dir:
            merged.save_pretrained(args.merged_output_dir)
            tokenizer.save_pretrained(args.merged_output_dir)
    trainer.accelerator.wait_for_everyone()
    if training_args.push_to_hub:
        trainer.push_to_hub(commit_message="LoRA adapter trained with zpx-hf training/finetune_lora.py")
    train_metrics["total_runtime"] = time.time() - started
    return {
        "output_dir": training_args.output_dir,
        "metrics": metrics,
        "base_metrics": base_metrics,
        "train_metrics": train_metrics,
        "trainer": trainer,
        "merged": merged,
        "datasets": datasets,
    }


def _flat(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    if "heldout" in metrics:
        out["perplexity"] = round(metrics["heldout"]["perplexity"], 3)
    for name, result in metrics.get("tasks", {}).items():
        out[f"{name} accuracy"] = round(result["token_accuracy"], 3)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    def done(result: dict) -> str:
        difference = result["metrics"]["merge_max_abs_logit_difference"]
        return f"merge check: max |logit difference| = {difference:.2e}\nadapter saved to {result['output_dir']}"

    return cli_main(argv, __doc__, load_finetune_config, run_finetune, done)


if __name__ == "__main__":
    sys.exit(main())
