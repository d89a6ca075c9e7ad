"""LoRA fine-tuning of a saved zpx-hf checkpoint with PEFT and the HF `Trainer`.

    zpx-finetune-lora configs/zpx-tiny-lora.yaml [--base_model runs/zpx-tiny --max_steps 100 ...]
    accelerate launch --config_file configs/accelerate/ddp_cpu.yaml \
        -m zpx_hf_train.finetune_lora configs/zpx-tiny-lora.yaml

YAML layout: top-level `FinetuneArguments` (`base_model`, ...) and `RunArguments`, `lora:` (`LoraArguments`),
`data:` and `training:` as in `zpx-train`. `base_model` is a local checkpoint folder; a model on the Hub is
named `hf://owner/name`, so a missing folder is an error and never a Hub download. Model code saved with the
checkpoint runs only with `trust_remote_code: true` (zpx-hf families load with the installed package).
`lora.target_modules: [default]` (or null) takes the family's PEFT default (`zpx_hf.integration_peft`:
the query and value projections; Versor's grade-wise LoRA); the shipped ZPX config lists the attention
projections and the phase encoder. The output folder holds the adapter (safetensors), the tokenizer and an
adapter model card; `merged_output_dir` receives the merged, self-contained checkpoint with its own card.
After training, `merge_and_unload()` is checked against the adapter model in float64 (the merge is exact
algebra, W x + s B(A x) = (W + s B A) x, so only float64 rounding remains) and the largest logit difference
is written to `metrics.json`.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cli import cli_main
from .config import ConfigError, RunArguments, RunConfig, check_positions, parse_config_file
from .data import DataArguments, build_datasets, check_streaming_training, dataset_tags, validate_data_args
from .job import open_run, publish, train_and_save, weights_mismatch, write_card
from .report import card_data, mapping_table, model_card_template, render_model_card, write_report
from .run_folder import STAGING, publish_folder
from .trainer import build_trainer

HUB_PREFIX = "hf://"


@dataclass
class FinetuneArguments:
    """Top-level keys of a LoRA config."""

    base_model: str | None = field(
        default=None, metadata={"help": "Checkpoint folder to adapt, or hf://owner/name for a Hub model."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Run the model code saved with the checkpoint (only for code you trust)."}
    )
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


def base_model_source(base: str) -> tuple[str, str | None]:
    """`(what from_pretrained loads, Hub id or None)`: `hf://owner/name` is a Hub id, anything else a folder."""
    if base.startswith(HUB_PREFIX):
        return base[len(HUB_PREFIX) :], base[len(HUB_PREFIX) :]
    return os.path.expanduser(base), None


def load_finetune_config(path: str, cli_args: Sequence[str] = ()) -> RunConfig:
    """Parse and validate a LoRA config; raises `ConfigError` naming the key before anything is loaded."""
    from transformers import TrainingArguments

    run = parse_config_file(
        path,
        cli_args,
        tops=(FinetuneArguments, RunArguments),
        sections={"lora": LoraArguments, "data": DataArguments, "training": TrainingArguments},
    )
    base = run[FinetuneArguments].base_model
    if base is None:
        raise ConfigError(f"{path}: key `base_model` is missing: give the checkpoint folder to fine-tune.")
    location, hub_id = base_model_source(base)
    if hub_id is None and not os.path.isfile(os.path.join(location, "config.json")):
        raise ConfigError(
            f"{path}: key `base_model`: {base!r} is not a checkpoint folder (no config.json); train one first "
            f"(e.g. `zpx-main`), or write {HUB_PREFIX}owner/name for a model on the Hugging Face Hub."
        )
    lora = run[LoraArguments]
    if lora.rank < 1:
        raise ConfigError(f"{path}: key `lora.rank` = {lora.rank} must be >= 1.")
    if not 0 <= lora.dropout < 1:
        raise ConfigError(f"{path}: key `lora.dropout` = {lora.dropout} must be in [0, 1).")
    if lora.bias not in ("none", "all", "lora_only"):
        raise ConfigError(f"{path}: key `lora.bias` = {lora.bias!r} must be one of none, all, lora_only.")
    merged = run[FinetuneArguments].merged_output_dir
    if merged and os.path.abspath(merged) == os.path.abspath(run[TrainingArguments].output_dir):
        raise ConfigError(
            f"{path}: key `merged_output_dir` = {merged!r} is the adapter's `training.output_dir`; give it a folder "
            "of its own."
        )
    if run[DataArguments].tokenizer != "bytes":
        raise ConfigError(
            f"{path}: key `data.tokenizer` = {run[DataArguments].tokenizer!r}: a LoRA fine-tune reads its data with "
            "the base model's own tokenizer; remove data.tokenizer."
        )
    validate_data_args(path, run[DataArguments])
    check_streaming_training(path, run[DataArguments], run[TrainingArguments])
    return run


def lora_targets(model_type: str, requested: list[str] | None) -> list[str] | str:
    """The requested module names, or (for None / `[default]`) the family's PEFT default, else every linear layer."""
    from zpx_hf.integration_peft import LORA_TARGET_MODULES

    if requested and requested != ["default"]:
        return requested
    return list(LORA_TARGET_MODULES.get(model_type) or []) or "all-linear"  # a family without a default: every linear


def merged_logit_difference(peft_model: Any, inputs: dict[str, Any]) -> float:
    """max |logits(adapter) - logits(merged)| of a float64 copy of `peft_model` (the model itself is untouched).

    In exact arithmetic the two are equal; float64 leaves ~1e-15 relative noise, where fp32 would leave ~1e-6
    (max |logit| x 2^-23 x the depth of the sums), the size of the effect a wrong merge could hide behind."""
    import torch

    reference = copy.deepcopy(peft_model).to(torch.float64).eval()
    with torch.no_grad():
        before = reference(**inputs).logits
        after = reference.merge_and_unload()(**inputs).logits
    return (before - after).abs().max().item()


def load_base(args: FinetuneArguments) -> tuple[Any, Any]:
    """Tokenizer and model of `base_model`; remote code only when `trust_remote_code` is set."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import zpx_hf  # noqa: F401 - registers the families, so their checkpoints load without remote code

    if args.base_model is None:  # (load_config refuses such a config first)
        raise ConfigError("key `base_model` is missing: give the checkpoint folder to fine-tune.")
    location, hub_id = base_model_source(args.base_model)
    mismatch = None if hub_id else weights_mismatch(location)
    if mismatch:
        raise ConfigError(f"key `base_model` = {args.base_model!r}: {mismatch}; use the folder as training saved it.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=args.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(location, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError, SafetensorError) as error:  # SafetensorError: truncated weights
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            f"key `base_model` = {args.base_model!r} cannot be loaded ({first}); a checkpoint with its own model "
            "code needs `trust_remote_code: true`, and only for code you trust."
        ) from error
    return tokenizer, model


def check_lora_targets(model: Any, targets: list[str] | str) -> None:
    """Every requested target must name a module of the model (PEFT's rule: the full name, or its last parts);
    PEFT itself drops unmatched names silently yet lists them in `adapter_config.json`."""
    import torch

    if not isinstance(targets, list):
        return
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in names)]
    if missing:
        linear = sorted(
            {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        raise ConfigError(
            f"key `lora.target_modules`: {', '.join(missing)} match no module of the base model "
            f"({model.config.model_type}); its linear layers are {', '.join(linear)} (or write [default])."
        )


def build_peft_model(model: Any, lora: LoraArguments, base_name: str) -> tuple[Any, list[str] | str]:
    """The base model wrapped with LoRA on its checked targets; `adapter_config.json` names `base_name`."""
    from peft import LoraConfig, TaskType, get_peft_model

    targets = lora_targets(model.config.model_type, lora.target_modules)
    check_lora_targets(model, targets)
    peft_config = LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora.rank,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft annotates int; the scale alpha / r takes any number
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias=lora.bias,  # type: ignore[arg-type]  # load_config checked it is one of peft's three literals
    )
    try:
        peft_model = get_peft_model(model, peft_config)
    except ValueError as error:  # peft: none of the target modules is in the model
        raise ConfigError(f"key `lora.target_modules` = {targets!r}: {' '.join(str(error).split())}") from None
    peft_model.peft_config["default"].base_model_name_or_path = base_name  # never a local path
    return peft_model, targets


def base_model_type(location: str) -> str | None:
    """The family named in a local base checkpoint's config.json (None for a Hub base)."""
    path = Path(location, "config.json")
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def run_finetune(run: RunConfig, callbacks: Sequence = ()) -> dict[str, Any]:
    """LoRA-train, save the adapter, check and (optionally) save the merge, evaluate, write report and cards.

    Steps (`zpx_hf_train.job`): open the run folders (the adapter's and `merged_output_dir`, neither the base
    model's), load and evaluate the base, train and save the adapter, merge, evaluate, report and cards,
    publish. Returns `{"output_dir", "metrics", "base_metrics", "train_metrics", "trainer", "merged", "datasets"}`.
    """
    from transformers import TrainingArguments, set_seed

    from zpx_hf_train.evaluation import evaluate_model

    args, lora, data = run[FinetuneArguments], run[LoraArguments], run[DataArguments]
    training_args = run[TrainingArguments]
    location, hub_id = base_model_source(args.base_model)
    extra = [("merged_output_dir", args.merged_output_dir)] if args.merged_output_dir else []
    inputs = {"base model": location} if hub_id is None else {}
    with open_run(run, "zpx-finetune-lora", base_model_type(location), extra, inputs) as folders:
        tokenizer, model = load_base(args)
        check_positions("base_model", model.config, data.seq_len)
        datasets = build_datasets(data, tokenizer)  # the base's tokenizer: the ids its weights learned
        base_metrics = evaluate_model(
            model,
            datasets["heldout"],
            datasets["tasks"],
            training_args.per_device_eval_batch_size,
            heldout_bytes=datasets["heldout_bytes"],
        )
        set_seed(training_args.seed)
        base_name = hub_id or Path(args.base_model).resolve().name
        peft_model, targets = build_peft_model(model, lora, base_name)
        trainer = build_trainer(peft_model, tokenizer, training_args, datasets["train"], datasets["eval"], callbacks)
        train_metrics = train_and_save(trainer, folders)  # adapter_model.safetensors + adapter_config.json + tokenizer
        metrics: dict[str, Any] = {}
        merged = None
        if trainer.is_world_process_zero():
            details = {
                "base_model": base_name,
                "target_modules": ", ".join(targets) if isinstance(targets, list) else targets,
                "rank": lora.rank,
                "alpha": lora.alpha,
                **dict(zip(("trainable_parameters", "total_parameters"), peft_model.get_nb_trainable_parameters())),
                "steps": trainer.state.global_step,
                "packing": datasets["packing"],
                "final_train_loss": round(train_metrics.get("train_loss", float("nan")), 4),
                "train_runtime_s": round(train_metrics.get("train_runtime", 0.0), 1),
                **{f"base {k}": v for k, v in _flat(base_metrics).items()},
            }
            metrics, merged = evaluate_and_merge(run, trainer, tokenizer, datasets, details)
        publish(trainer, folders, "LoRA adapter trained with zpx-hf zpx-finetune-lora", train_metrics)
    return {
        "output_dir": training_args.output_dir,
        "metrics": metrics,
        "base_metrics": base_metrics,
        "train_metrics": train_metrics,
        "trainer": trainer,
        "merged": merged,
        "datasets": datasets,
    }


def evaluate_and_merge(
    run: RunConfig, trainer: Any, tokenizer: Any, datasets: dict[str, Any], details: dict[str, Any]
) -> tuple[dict[str, Any], Any]:
    """Main process: the float64 merge check, the adapter's metrics, report and adapter card; then the merged
    model, saved atomically to `merged_output_dir` (when set) with its card. Returns `(metrics, merged model)`."""
    import torch
    from transformers import TrainingArguments

    from zpx_hf_train.evaluation import evaluate_model

    args, training_args = run[FinetuneArguments], run[TrainingArguments]
    peft_model = trainer.model
    probe = datasets["heldout"] if datasets["heldout"] is not None else next(iter(datasets["tasks"].values()))
    rows = probe[: min(len(probe), 8)]
    device = next(peft_model.parameters()).device
    inputs = {key: torch.tensor(rows[key], device=device) for key in ("input_ids", "attention_mask")}
    difference = merged_logit_difference(peft_model, inputs)
    adapter_metrics = evaluate_model(
        peft_model,
        datasets["heldout"],
        datasets["tasks"],
        training_args.per_device_eval_batch_size,
        heldout_bytes=datasets["heldout_bytes"],
    )
    metrics = {**adapter_metrics, "merge_max_abs_logit_difference_float64": difference}
    output_dir = training_args.output_dir
    write_report(output_dir, metrics, trainer.state.log_history, title="LoRA fine-tune", details=details)
    context = {
        "model_type": peft_model.config.model_type,
        "base_model": details["base_model"],
        "lora_table": mapping_table({k: details[k] for k in ("target_modules", "rank", "alpha")}),
        "data_description": "\n".join(f"- {line}" for line in datasets["description"]),
        "training": details,
        "metrics": adapter_metrics,
        "merge_difference": f"{difference:.1e}",
    }
    trainer.card_text = lora_card(run, "adapter", output_dir, context)
    trainer.create_model_card()
    merged = peft_model.merge_and_unload()
    if args.merged_output_dir:
        staging = Path(args.merged_output_dir, STAGING)
        merged.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        publish_folder(staging, Path(args.merged_output_dir))
        write_card(args.merged_output_dir, lora_card(run, "merged", args.merged_output_dir, context))
    return metrics, merged


def lora_card(run: RunConfig, kind: str, folder: str, context: dict[str, Any]) -> str:
    """The adapter's (`kind="adapter"`, library peft) or the merged model's card (`"merged"`, transformers)."""
    from transformers import TrainingArguments

    args, data, training_args = run[FinetuneArguments], run[DataArguments], run[TrainingArguments]
    _, hub_id = base_model_source(args.base_model)
    name = training_args.hub_model_id if kind == "adapter" and training_args.hub_model_id else Path(folder).name
    card_context = {
        **context,
        "model_name": name,
        "repo_id": training_args.hub_model_id or f"path/to/{name}",
        "output_dir": folder,
    }
    tags = ["zpx-hf", context["model_type"], "lora", "text-generation"]
    tags += ["peft"] if kind == "adapter" else ["custom_code", "merged-lora"]
    metadata = card_data(
        model_name=name,
        tags=tags,
        datasets=dataset_tags(data),
        metrics=context["metrics"],
        corpus=dataset_tags(data)[0] if data.text_source != "none" else None,
        base_model=hub_id,
        library_name="peft" if kind == "adapter" else "transformers",
    )
    return render_model_card(model_card_template(f"lora-{kind}"), card_context, metadata)


def _flat(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    if "heldout" in metrics:
        out["perplexity"] = round(metrics["heldout"]["perplexity"], 3)
    for name, result in metrics.get("tasks", {}).items():
        out[f"{name} accuracy"] = round(result["token_accuracy"], 3)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`zpx-finetune-lora CONFIG [--flag value ...]`."""

    def done(result: dict) -> str:
        difference = result["metrics"]["merge_max_abs_logit_difference_float64"]
        return (
            f"merge check (float64): max |logit difference| = {difference:.2e}\nadapter saved to {result['output_dir']}"
        )

    return cli_main(argv, __doc__, load_finetune_config, run_finetune, done)


if __name__ == "__main__":
    sys.exit(main())
