"""Train, evaluate and save any zpx-hf family from a YAML config with the HF `Trainer`.

    zpx-train configs/zpx-tiny.yaml [--max_steps 100 --output_dir runs/x ...]     (or python -m zpx_hf_train.train)
    accelerate launch --config_file configs/accelerate/ddp_cpu.yaml -m zpx_hf_train.train configs/zpx-tiny.yaml
    HF_TOKEN=... zpx-train configs/zpx-tiny.yaml --push_to_hub --hub_model_id you/zpx-tiny

YAML layout: top-level `ModelArguments` (`model_type`, `attn_implementation`) and `RunArguments`
(`overwrite_output_dir`, `inspect`), `model:` (keyword arguments of the family's config class), `data:`
(`DataArguments`) and `training:` (`transformers.TrainingArguments`). Command-line flags override any field.
The output folder is a self-contained remote-code checkpoint (safetensors, code, byte tokenizer, model card)
plus `metrics.json`, `report.md` and `loss_curve.png` (and `inspection/` pictures with `inspect: true`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .cli import cli_main
from .config import ConfigError, ModelArguments, RunArguments, RunConfig, build_model_config, parse_config_file
from .data import (
    TASK_SPECS,
    DataArguments,
    build_datasets,
    check_streaming_training,
    corpus_tokenizer,
    dataset_tags,
    validate_data_args,
)
from .distributed import configure_launch, gather_objects, local_parameter_count
from .job import open_run, publish, train_and_save
from .report import card_data, model_card_template, render_model_card, write_report
from .tokenizer import (
    config_tokenizer,
    describe_tokenizer,
    fit_model_config,
    parse_tokenizer_spec,
    tokenizer_model_kwargs,
)
from .trainer import build_model, build_trainer

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_run_config(path: str, cli_args: Sequence[str] = ()) -> RunConfig:
    """Parse and fully validate a training config; raises `ConfigError` before anything is built."""
    from transformers import TrainingArguments

    run = parse_config_file(
        path,
        cli_args,
        tops=(ModelArguments, RunArguments),
        sections={"data": DataArguments, "training": TrainingArguments},
        mappings=("model",),
    )
    data = run[DataArguments]
    validate_data_args(path, data)
    check_streaming_training(path, data, run[TrainingArguments])
    model_args = run[ModelArguments]
    spec = parse_tokenizer_spec(path, data.tokenizer)
    tokenizer = config_tokenizer(path, spec, data.seq_len)  # None: trained on the corpus when the run starts
    kwargs = tokenizer_model_kwargs(path, run.mappings["model"], spec, tokenizer)
    run.model_config = build_model_config(
        path, model_args.model_type, kwargs, data.seq_len, model_args.attn_implementation, tokenizer
    )
    return run


def config_name(path: str) -> str:
    """The config file as a card may name it: relative to the repository, else its file name."""
    resolved = Path(path).resolve()
    return resolved.relative_to(REPO_ROOT).as_posix() if resolved.is_relative_to(REPO_ROOT) else resolved.name


def inspect_checkpoint(output_dir: str) -> None:
    """Draw the checkpoint's geometry into `output_dir/inspection/` (`zpx_hf_train.inspection`)."""
    from .inspection import inspect_run

    inspect_run(output_dir)


def run_training(run: RunConfig, callbacks: Sequence = ()) -> dict[str, Any]:
    """Train, save (model + code + tokenizer), evaluate, write report and card; push when asked.

    Steps (`zpx_hf_train.job`): open the run folder, build data and model, train and save, evaluate, report and
    card, publish. Returns `{"run", "output_dir", "metrics", "train_metrics", "trainer", "model", "datasets"}`;
    `model` is the trained model on the main process (under FSDP: the saved checkpoint reloaded whole).
    """
    from transformers import TrainingArguments, set_seed

    model_args, data, training_args = run[ModelArguments], run[DataArguments], run[TrainingArguments]
    spec = parse_tokenizer_spec(run.path, data.tokenizer)
    with open_run(run, "zpx-train", run.model_config.model_type) as folders:
        # every process takes the tokenizer first (a trained one is process 0's, shared by a collective), then
        # process 0 tokenizes the corpus and the others reuse its cached files
        tokenizer = resumed_tokenizer(spec, folders.resume, data.seq_len)
        tokenizer = tokenizer if tokenizer is not None else corpus_tokenizer(data)
        with training_args.main_process_first(desc="tokenizing the corpus"):
            datasets = build_datasets(data, tokenizer)
        if spec.kind == "train":  # its size is known now: the model follows it
            fit_model_config(run.model_config, run.mappings["model"], tokenizer, spec.vocab_size)
        set_seed(training_args.seed)
        model = build_model(run.model_config, model_args.attn_implementation, run.mappings["model"].get("init_from"))
        trainer = build_trainer(model, tokenizer, training_args, datasets["train"], datasets["eval"], callbacks)
        train_metrics = train_and_save(trainer, folders)
        per_rank = gather_objects(local_parameter_count(trainer.model))
        metrics: dict[str, Any] = {}
        model = trainer.model
        if trainer.is_world_process_zero():
            model, metrics = evaluate_trained(run, trainer, datasets, train_metrics, per_rank)
        publish(trainer, folders, f"{run.model_config.model_type}: trained with zpx-hf zpx-train", train_metrics)
    return {
        "run": run,
        "output_dir": training_args.output_dir,
        "metrics": metrics,
        "train_metrics": train_metrics,
        "trainer": trainer,
        "model": model,
        "datasets": datasets,
    }


def resumed_tokenizer(spec: Any, resume: Any, seq_len: int) -> Any:
    """A resumed run's trained tokenizer: the one its checkpoint saved (never trained again, so the ids the
    weights learned stay); None when there is nothing to resume or the tokenizer is not trained."""
    if spec.kind != "train" or resume is None or resume.checkpoint is None:
        return None
    from transformers import AutoTokenizer

    folder = Path(resume.checkpoint)
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(
            f"key `training.resume_from_checkpoint`: {folder.name} holds no tokenizer.json, so the tokenizer this run "
            "trained is lost; train into a new --output_dir."
        )
    print(f"data.tokenizer: reusing the tokenizer saved in {folder.name} (not trained again)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.model_max_length = seq_len  # set after loading: as a keyword it would also reach the model's config
    return tokenizer


def evaluate_trained(
    run: RunConfig, trainer: Any, datasets: dict[str, Any], train_metrics: dict[str, Any], per_rank: list[int]
) -> tuple[Any, dict[str, Any]]:
    """Main process: inspect (when asked), evaluate the saved model, write report and card; `(model, metrics)`."""
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    from zpx_hf_train.distributed import machine_count
    from zpx_hf_train.evaluation import evaluate_model

    data, training_args = run[DataArguments], run[TrainingArguments]
    output_dir = training_args.output_dir
    model = trainer.model
    if trainer.cpu_fsdp:  # the sharded model runs only with every rank: evaluate the saved checkpoint
        model = AutoModelForCausalLM.from_pretrained(output_dir)
    if run[RunArguments].inspect:
        inspect_checkpoint(output_dir)
    eval_started = time.time()
    metrics = evaluate_model(
        model,
        datasets["heldout"],
        datasets["tasks"],
        training_args.per_device_eval_batch_size,
        heldout_bytes=datasets["heldout_bytes"],
    )
    num_params = sum(p.numel() for p in model.parameters())
    details = {
        "model_type": run.model_config.model_type,
        "parameters": num_params,
        "steps": trainer.state.global_step,
        "world_size": training_args.world_size,
        "machines": machine_count(training_args.world_size),
        "parallelism": configure_launch(),
        "effective_batch": training_args.per_device_train_batch_size
        * training_args.world_size
        * training_args.gradient_accumulation_steps,
        "seq_len": data.seq_len,
        "packing": datasets["packing"],  # whether the training rows were packed (data.packing)
        "learning_rate": training_args.learning_rate,
        "final_train_loss": round(train_metrics.get("train_loss", float("nan")), 4),
        "train_runtime_s": round(train_metrics.get("train_runtime", 0.0), 1),
        "eval_runtime_s": round(time.time() - eval_started, 1),
        "torch_threads": torch.get_num_threads(),
    }
    if len(per_rank) > 1:
        details["parameters_per_rank"] = per_rank
    if trainer.saved_digest is not None:
        details["saved_state_dict"] = trainer.saved_digest
    name = training_args.hub_model_id or Path(output_dir).resolve().name
    write_report(output_dir, metrics, trainer.state.log_history, title=name, details=details)
    trainer.card_text = model_card(run, datasets, name, num_params, details, metrics)
    trainer.create_model_card()
    return model, metrics


def model_card(
    run: RunConfig, datasets: dict[str, Any], name: str, num_params: int, details: dict, metrics: dict
) -> str:
    """The family's model card of a trained run."""
    from transformers import TrainingArguments

    data, training_args = run[DataArguments], run[TrainingArguments]
    model_section = dict(run.mappings["model"])
    if "init_from" in model_section:  # a local folder: named, never its absolute path (the card may be published)
        model_section["init_from"] = Path(str(model_section["init_from"])).name
    model_section.setdefault("vocab_size", run.model_config.vocab_size)
    model_type = run.model_config.model_type
    tags = ["zpx-hf", model_type, "custom_code", "text-generation", "geometric-attention"]
    datasets_used = dataset_tags(data)
    context = {
        "model_type": model_type,
        "model_name": name,
        "repo_id": training_args.hub_model_id or f"path/to/{name}",
        "config_file": config_name(run.path),
        "tokenizer": describe_tokenizer(data, datasets["tokenizer"]),
        "config": {**model_section, "parameters": f"{num_params:,}"},
        "data_description": "\n".join(f"- {line}" for line in datasets["description"]),
        "training": details,
        "metrics": metrics,
        "output_dir": training_args.output_dir,
    }
    corpus = datasets_used[0] if data.text_source != "none" else None
    metadata = card_data(model_name=name, tags=tags, datasets=datasets_used, metrics=metrics, corpus=corpus)
    return render_model_card(model_card_template(model_type), context, metadata)


def recall_rows(result: dict, data: DataArguments) -> list[dict]:
    """`report.recall_results` of a finished run, counting answer tokens in its held-out task sets, against each
    task's copy floor at the run's task parameters."""
    from .report import recall_floor, recall_results

    tasks = result["datasets"]["tasks"]
    # position 0 is BOS, never an answer: every answer_mask entry is an evaluated answer token
    answer_tokens = {name: sum(map(sum, dataset["answer_mask"])) for name, dataset in tasks.items()}
    floors = {name: recall_floor(name, TASK_SPECS[name].params(data)) for name in tasks}
    return recall_results(result["metrics"], answer_tokens, floors)


def warn_unlearned(recall: list[dict], model_type: str, learning_rate: float, prog: str) -> None:
    """A warning on stderr for each recall task below the bar, one more when none reached it, and one when the lr
    is above the range at which the family learned recall in the evidence suite (`report.lr_hint`)."""
    from .report import RECALL_BAR, lr_hint

    for row in recall:
        if row["verdict"] != "learned":
            print(
                f"{prog}: WARNING: recall task {row['task']} is {row['verdict']} (answer-token accuracy "
                f"{row['token_accuracy']:.3f}, copy floor {row['floor']:.3f}, bar {RECALL_BAR}): this run did not "
                "learn it.",
                file=sys.stderr,
            )
    if recall and not any(row["verdict"] == "learned" for row in recall):
        print(
            f"{prog}: WARNING: no recall task reached answer-token accuracy {RECALL_BAR} in this run: a newcomer "
            "sees a model that did not learn recall (a shorter budget than the config's, or tasks this size "
            "cannot learn in it).",
            file=sys.stderr,
        )
    hint = lr_hint(model_type, learning_rate)
    if hint and any(row["verdict"] != "learned" for row in recall):
        print(f"{prog}: WARNING: {hint}.", file=sys.stderr)


def finished(result: dict[str, Any]) -> str:
    """zpx-train's last lines: each recall task's verdict (a WARNING for each one not learned, with the lr hint),
    then where the model went."""
    from transformers import TrainingArguments

    from .report import recall_table

    run = result["run"]
    recall = recall_rows(result, run[DataArguments])
    if recall:
        print(recall_table(recall))
        warn_unlearned(recall, run.model_config.model_type, run[TrainingArguments].learning_rate, "zpx-train")
    return f"saved to {result['output_dir']}"


def main(argv: Sequence[str] | None = None) -> int:
    """`zpx-train CONFIG [--flag value ...]`."""
    return cli_main(argv, __doc__, load_run_config, run_training, finished)


if __name__ == "__main__":
    sys.exit(main())
