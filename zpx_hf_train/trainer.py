"""The HF `Trainer` as the jobs use it: divergence stop, atomic final saves, marked checkpoints, CPU FSDP.

The run folder itself (lock, marker, resume choice) is `zpx_hf_train.run_folder`.

- `FiniteCheck` stops training at the first non-finite gradient or logged loss, naming the step
  (`Trainer` would otherwise log such a loss as a filtered average: 0.0 on the first steps).
- `GeometricTrainer` saves the final model into a staging folder and moves its files into place (a kill never
  leaves half a `model.safetensors` in the run folder), writes the run marker into every checkpoint (so a
  checkpoint copied elsewhere still names its run) and then its checksum manifest (`run_folder.write_manifest`),
  writes the family's model card atomically and, for an FSDP launch on CPU, shards the model with `fully_shard`
  and saves one full safetensors state dict (see `zpx_hf_train/distributed.py`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from .config import ConfigError
from .distributed import cpu_fsdp_requested, full_state_dict, shard_model, state_dict_digest
from .run_folder import RUN_MARKER, STAGING, atomic_write, atomic_write_json, publish_folder, write_manifest


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
                "lower training.learning_rate or check the data."  # `RunFolder` adds what the folder holds now
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
    """`Trainer` with the family's model card, a clear error when the Hub is unreachable, the Hub branch
    `hub_revision` created before training, and CPU FSDP."""

    card_text: str | None = None
    saved_digest: dict[str, Any] | None = None
    run_marker: dict[str, Any] | None = (
        None  # written into every checkpoint (`zpx_hf_train.run_folder.RunFolder.marker`)
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.cpu_fsdp = cpu_fsdp_requested()
        if self.cpu_fsdp:
            shard_model(kwargs["model"])  # before the optimizer sees the parameters
        super().__init__(*args, **kwargs)
        self._sharded: _Sharded | None = None

    def init_hf_repo(self, *args: Any, **kwargs: Any) -> None:
        # forwarded as given: transformers 5.17 takes `token` only, later releases also `private`
        try:
            super().init_hf_repo(*args, **kwargs)
            if self.args.hub_revision and self.is_world_process_zero():
                # `Trainer` uploads to this branch and never creates it: the push would fail after the whole run
                from huggingface_hub import HfApi

                if self.hub_model_id is None:  # init_hf_repo sets it
                    raise ValueError("the trainer names no Hub repo (hub_model_id)")
                HfApi().create_branch(self.hub_model_id, branch=self.args.hub_revision, exist_ok=True)
        except Exception as error:  # network, login or permission: before any training
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            name = self.args.hub_model_id or Path(self._get_output_dir(trial=None)).name
            raise ConfigError(
                f"key `training.push_to_hub`: cannot create the Hub repo {name!r} ({first}); check the network and "
                "your login (HF_TOKEN or `hf auth login`), or drop --push_to_hub."
            ) from error

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        if self.card_text is None:
            super().create_model_card(*args, **kwargs)
        elif self.is_world_process_zero():
            atomic_write(Path(self._get_output_dir(trial=None), "README.md"), self.card_text)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()  # every process has written its files (e.g. its rng_state_N.pth)
        folder = Path(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        save_position = getattr(self.train_dataset, "save", None)
        if save_position is not None and folder.is_dir():  # a streamed corpus: each process's position
            save_position(folder)
            self.accelerator.wait_for_everyone()
        if self.args.should_save and folder.is_dir():
            if self.run_marker is not None:
                atomic_write_json(folder / RUN_MARKER, {**self.run_marker, "finished": False})
            write_manifest(folder)  # last: a checkpoint without it was cut short (`checkpoint_problem`)

    def get_train_dataloader(self) -> Any:
        """A streamed corpus (`TextStream`, already this process's shard) is read in this process, unprepared:
        accelerate would otherwise dispatch or re-shard it, and its position must stay here to be saved."""
        from .data_pipeline import TextStream

        if not isinstance(self.train_dataset, TextStream):
            return super().get_train_dataloader()
        return torch.utils.data.DataLoader(
            self.train_dataset, batch_size=self.args.train_batch_size, collate_fn=self.data_collator, num_workers=0
        )

    def _wrap_model(self, model: Any, training: bool = True, dataloader: Any = None) -> Any:
        if not self.cpu_fsdp:
            return super()._wrap_model(model, training=training, dataloader=dataloader)
        if self._sharded is None:
            if self.model is None:  # Trainer's `model_init` builds it later; shard_model has run on `model=`
                raise ValueError("CPU FSDP shards the model given as `model=`; model_init is not supported with it.")
            self._sharded = _Sharded(self.model, self.accelerator.autocast)
        return self._sharded

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Checkpoints as `Trainer` saves them; the final model (into output_dir) through a staging folder whose
        files then replace the old ones one `os.replace` each."""
        run_folder = self._get_output_dir(trial=None)  # args.output_dir (TrainingArguments types it optional)
        target = output_dir or run_folder
        if os.path.abspath(target) == os.path.abspath(run_folder):
            staging = Path(run_folder, STAGING)
            self._save_model_to(str(staging))
            if self.args.should_save:
                publish_folder(staging, Path(target))
        else:
            self._save_model_to(target)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save_model_to(self, output_dir: str) -> None:
        if not self.cpu_fsdp:
            super().save_model(output_dir, _internal_call=True)
            return
        state = full_state_dict(self.model)  # a collective: every rank gathers, rank 0 keeps the tensors
        if self.args.should_save:
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


def build_model(model_config: Any, attn_implementation: str | None = None, init_from: str | None = None) -> Any:
    """A freshly initialised causal LM of the config's family (seeded by the caller), or the checkpoint `init_from`
    (`model.init_from`) with `model_config`, in float32, every weight loaded (else `ConfigError` naming one)."""
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if init_from is None:
        return AutoModelForCausalLM.from_config(model_config, **kwargs)
    fix = "drop the model: keys that change the weights"
    model: Any
    info: dict[str, list[Any]]
    try:
        # misc: from_pretrained's annotation omits the (model, loading info) pair output_loading_info=True returns
        model, info = AutoModelForCausalLM.from_pretrained(  # type: ignore[misc]
            init_from, config=model_config, dtype=torch.float32, output_loading_info=True, **kwargs
        )
    except RuntimeError as error:  # transformers raises on weights whose shapes differ from the config's
        if "mismatched" not in str(error):
            raise
        raise ConfigError(
            f"key `model.init_from` = {init_from!r}: the checkpoint does not fit the model config (weight shapes "
            f"differ); {fix}."
        ) from error
    problems = [(kind, keys) for kind, keys in info.items() if keys and kind != "error_msgs"]
    if problems:
        kind, keys = problems[0]
        raise ConfigError(
            f"key `model.init_from` = {init_from!r}: the checkpoint does not fit the model config ({kind}: "
            f"{sorted(keys)[0]}{f' and {len(keys) - 1} more' if len(keys) > 1 else ''}); {fix}."
        )
    return model


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
    model_only = training_args.save_only_model and training_args.save_strategy != "no"
    if model_only and not cpu_fsdp_requested() and training_args.process_index == 0:
        print(
            "warning: `training.save_only_model: true` saves model-only checkpoints; they hold no optimizer or "
            "schedule state, so this run cannot be resumed from them.",
            file=sys.stderr,
            flush=True,
        )
    from .data_pipeline import TextStream

    if isinstance(train_dataset, TextStream):
        training_args.ignore_data_skip = True  # a resumed stream continues from its saved position, never skips
    return GeometricTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        callbacks=[FiniteCheck(), *callbacks],
    )


__all__ = [
    "FiniteCheck",
    "GeometricTrainer",
    "RUN_MARKER",
    "TrainingDivergedError",
    "build_model",
    "build_trainer",
]
