"""The HF `Trainer` as the jobs use it: run-folder guard, resume choice, divergence stop, CPU FSDP.

- `prepare_output_dir` writes a run marker (`zpx_run.json`, the config fingerprint) and refuses a folder
  that holds another run's files unless the user asks to overwrite it or to resume the same run.
- `resolve_resume` picks the newest *complete* checkpoint (one with `trainer_state.json`; a kill during a
  save leaves one without) and says which one it resumes.
- `FiniteCheck` stops training at the first non-finite gradient or logged loss, naming the step
  (`Trainer` would otherwise log such a loss as a filtered average: 0.0 on the first steps).
- `GeometricTrainer` writes the family's model card and, for an FSDP launch on CPU, shards the model with
  `fully_shard` and saves one full safetensors state dict (see `training/distributed.py`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from .config import ConfigError
from .distributed import cpu_fsdp_requested, full_state_dict, shard_model, state_dict_digest

RUN_MARKER = "zpx_run.json"
TRAINER_STATE = "trainer_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class TrainingDivergedError(RuntimeError):
    """A loss or gradient became non-finite; the message names the step."""


class FiniteCheck(TrainerCallback):
    """Raise `TrainingDivergedError` at the first non-finite gradient (before the optimizer step) or logged loss."""

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if args.fp16 or model is None:  # fp16's gradient scaler skips steps with inf gradients by design
            return
        from torch.distributed.tensor import DTensor

        bad = ""
        for name, param in model.named_parameters():
            grad = param.grad
            if grad is None:
                continue
            grad = grad.to_local() if isinstance(grad, DTensor) else grad
            if not torch.isfinite(grad).all():
                bad = name
                break
        flag = torch.tensor([float(bool(bad))], device=next(model.parameters()).device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)  # FSDP: shards differ per rank
        if flag.item():
            where = f"the gradient of `{bad}`" if bad else "a gradient on another process"
            raise TrainingDivergedError(
                f"training stopped at step {state.global_step + 1}: {where} is not finite (nan or inf); "
                f"lower training.learning_rate or check the data; earlier checkpoints in {args.output_dir} are intact."
            )

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        for key in ("loss", "eval_loss"):
            value = (logs or {}).get(key)
            if isinstance(value, float) and not math.isfinite(value):
                raise TrainingDivergedError(
                    f"training stopped at step {state.global_step}: the logged {key} is {value}; "
                    "lower training.learning_rate or check the data."
                )


class _Sharded(torch.nn.Module):
    """A model sharded in place by `fully_shard`, handed to `Trainer` as already wrapped so accelerate does not
    wrap it again in DDP; forward runs under accelerate's autocast (mixed precision of the launch)."""

    def __init__(self, module: torch.nn.Module, autocast: Any) -> None:
        super().__init__()
        self.module = module
        self.autocast = autocast

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.autocast():
            return self.module(*args, **kwargs)


class GeometricTrainer(Trainer):
    """`Trainer` with the family's model card, a clear error when the Hub is unreachable, and CPU FSDP."""

    card_text: str | None = None
    saved_digest: dict[str, Any] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.cpu_fsdp = cpu_fsdp_requested()
        if self.cpu_fsdp:
            shard_model(kwargs["model"])  # before the optimizer sees the parameters
        super().__init__(*args, **kwargs)
        self._sharded: _Sharded | None = None

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        try:
            super().init_hf_repo(token=token, private=private)
        except Exception as error:  # network, login or permission: before any training
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            name = self.args.hub_model_id or Path(self.args.output_dir).name
            raise ConfigError(
                f"key `training.push_to_hub`: cannot create the Hub repo {name!r} ({first}); check the network and "
                "your login (HF_TOKEN or `hf auth login`), or drop --push_to_hub."
            ) from error

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        if self.card_text is None:
            return super().create_model_card(*args, **kwargs)
        if self.is_world_process_zero():
            Path(self.args.output_dir, "README.md").write_text(self.card_text, encoding="utf-8")

    def _wrap_model(self, model: Any, training: bool = True, dataloader: Any = None) -> Any:
        if not self.cpu_fsdp:
            return super()._wrap_model(model, training=training, dataloader=dataloader)
        if self._sharded is None:
            self._sharded = _Sharded(self.model, self.accelerator.autocast)
        return self._sharded

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if not self.cpu_fsdp:
            return super().save_model(output_dir, _internal_call)
        state = full_state_dict(self.model)  # a collective: every rank gathers, rank 0 keeps the tensors
        if self.args.should_save:
            output_dir = output_dir or self.args.output_dir
            gathered = dict(state)  # save_pretrained consumes the dict it is given
            self._save(output_dir, state_dict=state)
            from safetensors import safe_open

            with safe_open(os.path.join(output_dir, "model.safetensors"), "pt") as f:
                saved = set(f.keys())
            common = saved & set(gathered)  # tied weights may appear once in the gather, once in the file
            self.saved_digest = {
                "sha256": state_dict_digest(gathered, common),
                "only_in_file": sorted(saved - common),
                "only_in_gather": sorted(set(gathered) - common),
            }
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)


def build_model(model_config: Any, attn_implementation: str | None = None) -> Any:
    """A freshly initialised causal LM of the config's family (seeded by the caller)."""
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return AutoModelForCausalLM.from_config(model_config, **kwargs)


def build_trainer(
    model: Any, tokenizer: Any, training_args: Any, train_dataset: Any, eval_dataset: Any, callbacks: Sequence = ()
) -> GeometricTrainer:
    """`GeometricTrainer` with `FiniteCheck` first; the NaN filter is off (a non-finite loss stops the run) and
    `labels` is the label column (so evaluation logs `eval_loss` for the loss curve)."""
    from transformers import default_data_collator

    training_args.logging_nan_inf_filter = False
    if training_args.label_names is None:  # evaluation reports eval_loss only when it knows the label columns
        training_args.label_names = ["labels"]
    if training_args.eval_strategy != "no" and eval_dataset is None:
        raise ConfigError("key `training.eval_strategy` is set but there is no evaluation data; set it to 'no'.")
    if cpu_fsdp_requested():
        if training_args.resume_from_checkpoint:
            raise ConfigError("key `training.resume_from_checkpoint`: FSDP on CPU cannot resume (model-only saves).")
        if training_args.save_strategy != "no" and not training_args.save_only_model:
            raise ConfigError(
                "FSDP on CPU saves model-only checkpoints: set `training.save_only_model: true` or "
                "`training.save_strategy: no`."
            )
    return GeometricTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        callbacks=[FiniteCheck(), *callbacks],
    )


def _checkpoints(output_dir: str) -> list[Path]:
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found)]


def prepare_output_dir(training_args: Any, fingerprint: str, overwrite: bool, config_path: str) -> str | None:
    """Check the output folder, choose the checkpoint to resume (or None), then write the run marker.

    A folder holding another run is refused unless `overwrite` (which deletes its checkpoints and pictures,
    so a later `resume last` cannot pick an old run's weights) or a resume of the same run: the marker's `fingerprint`
    (`RunConfig.fingerprint`) must match this config's. A folder holding only a marker counts as empty."""
    folder = Path(training_args.output_dir)
    marker = folder / RUN_MARKER
    with training_args.main_process_first(desc="output_dir check", local=False):
        entries = [p for p in folder.iterdir() if not p.name.startswith(".")] if folder.is_dir() else []
        recorded = json.loads(marker.read_text(encoding="utf-8")).get("fingerprint") if marker.is_file() else None
        resume_asked = (training_args.resume_from_checkpoint or "").lower() not in ("", "false", "none")
        if entries and [p.name for p in entries] != [RUN_MARKER] and not overwrite:
            if resume_asked and recorded != fingerprint:
                what = "no run marker" if recorded is None else f"a run of another config ({recorded})"
                raise ConfigError(
                    f"key `training.output_dir`: {folder} holds {what}, not this config ({fingerprint}); resume "
                    "only into the folder of the same run, or pass --overwrite_output_dir true to start over."
                )
            if not resume_asked:
                raise ConfigError(
                    f"key `training.output_dir`: {folder} is not empty (an earlier run); pass "
                    "--resume_from_checkpoint last to continue it, --overwrite_output_dir true to replace it, "
                    "or choose another output_dir."
                )
        if overwrite and resume_asked:
            raise ConfigError(
                "keys `overwrite_output_dir` and `training.resume_from_checkpoint` contradict each other; drop one."
            )
        resume = resolve_resume(training_args)
        if training_args.process_index == 0:
            if overwrite:  # the old run's checkpoints and pictures must not pass for this run's
                for stale in [*_checkpoints(str(folder)), folder / "inspection"]:
                    if stale.is_dir():
                        shutil.rmtree(stale)
            folder.mkdir(parents=True, exist_ok=True)
            config_name = Path(config_path).name
            marker.write_text(json.dumps({"fingerprint": fingerprint, "config": config_name}) + "\n", encoding="utf-8")
    return resume


def resolve_resume(training_args: Any) -> str | None:
    """`resume_from_checkpoint`: a checkpoint folder, or `last`/`true` for the newest complete one in output_dir.

    A checkpoint without `trainer_state.json` (a save that was killed) is skipped, and the choice is printed."""
    value = training_args.resume_from_checkpoint
    if value is None or value.lower() in ("false", "none", ""):
        return None
    if value.lower() in ("last", "true"):
        found = _checkpoints(training_args.output_dir)
        complete = [p for p in found if (p / TRAINER_STATE).is_file()]
        if not complete:
            incomplete = f" ({', '.join(p.name for p in found)} incomplete: no {TRAINER_STATE})" if found else ""
            raise ConfigError(
                f"key `training.resume_from_checkpoint` = {value!r}: no complete checkpoint in "
                f"{training_args.output_dir}{incomplete}; train without it first or name a checkpoint folder."
            )
        chosen = complete[-1]
        skipped = [p.name for p in found[found.index(chosen) + 1 :]]
        if training_args.process_index == 0:
            note = f" (skipped incomplete {', '.join(skipped)}: no {TRAINER_STATE})" if skipped else ""
            print(f"resuming from {chosen}{note}", flush=True)
    else:
        chosen = Path(value)
        if not (chosen / TRAINER_STATE).is_file():
            raise ConfigError(
                f"key `training.resume_from_checkpoint`: {value!r} is not a complete checkpoint folder "
                f"(no {TRAINER_STATE})."
            )
    step = json.loads((chosen / TRAINER_STATE).read_text(encoding="utf-8")).get("global_step", 0)
    if 0 < training_args.max_steps <= step:
        raise ConfigError(
            f"key `training.max_steps` = {training_args.max_steps}: {chosen.name} already reached step {step}, "
            "so resuming would train nothing; raise --max_steps."
        )
    return str(chosen)


__all__ = [
    "FiniteCheck",
    "GeometricTrainer",
    "RUN_MARKER",
    "TrainingDivergedError",
    "build_model",
    "build_trainer",
    "prepare_output_dir",
    "resolve_resume",
]
