"""The steps every training job takes, shared by `zpx-train` and `zpx-finetune-lora`:

1. `open_run`: lock and check each folder the job writes (`zpx_hf_train.run_folder.RunFolder`), choose the
   checkpoint to resume, mark the folders as this run's.
2. `train_and_save`: train (or, for a run a kill stopped after its last step, only finish it), then save the
   final model atomically.
3. The job evaluates and writes its report (`zpx_hf_train.report.write_report`) and cards (`write_card`).
4. `publish`: mark the folders finished, then push to the Hub when asked.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import ConfigError, RunArguments, RunConfig
from .run_folder import TRAINER_STATE, Resume, RunFolder, RunIdentity, atomic_write


@dataclass
class RunFolders:
    """The folders a job writes (the output folder first), its identity and the checkpoint it resumes."""

    folders: list[RunFolder]
    identity: RunIdentity
    resume: Resume | None
    started: float = field(default_factory=time.time)

    @property
    def marker(self) -> dict[str, Any]:
        return self.folders[0].marker()


def _resume_asked(training_args: Any) -> bool:
    return (training_args.resume_from_checkpoint or "").lower() not in ("", "false", "none")


@contextmanager
def open_run(
    run: RunConfig,
    job: str,
    model_type: str | None,
    extra: Sequence[tuple[str, str]] = (),
    inputs: dict[str, str] | None = None,
) -> Iterator[RunFolders]:
    """Hold every folder the job writes for the `with` block: `training.output_dir`, then each `(key, folder)` of
    `extra` (e.g. `merged_output_dir`: an overwrite there replaces only this job's own outputs, never another
    run); none may be one of `inputs` (`{"base model": folder}`). Process 0 checks and marks them first; an
    exception in the block undoes an overwrite (see `RunFolder`)."""
    from transformers import TrainingArguments

    training_args = run[TrainingArguments]
    identity = RunIdentity(run.fingerprint(), job, model_type, Path(run.path).name)
    common = {
        "overwrite": run[RunArguments].overwrite_output_dir,
        "resume_asked": _resume_asked(training_args),
        "inputs": inputs,
        "main_process": training_args.process_index == 0,
    }
    with ExitStack() as stack:
        with training_args.main_process_first(desc="output_dir check", local=False):
            folders = [
                stack.enter_context(
                    RunFolder(training_args.output_dir, identity, **common, training_args=training_args)
                )
            ]
            for key, folder in extra:
                extra_folder = RunFolder(folder, identity, **common, key=key, overwrites_only=job)
                folders.append(stack.enter_context(extra_folder))
        yield RunFolders(folders, identity, folders[0].resume)


def train_and_save(trainer: Any, run: RunFolders) -> dict[str, Any]:
    """Train from `run.resume` and save the final model; the train metrics. A checkpoint that reached max_steps
    is not trained again (`Trainer` would take one more step): its weights and state are loaded, and the run
    only finishes (final save, then the job's evaluation and report)."""
    trainer.run_marker = run.marker
    resume = run.resume
    if resume is not None and resume.finish_only:
        from transformers import TrainerState

        load_checkpoint_weights(trainer.model, resume.checkpoint)
        trainer.state = TrainerState.load_from_json(str(Path(resume.checkpoint, TRAINER_STATE)))
        metrics: dict[str, Any] = {"train_runtime": 0.0, "finished_from": Path(resume.checkpoint).name}
    else:
        if resume is not None and hasattr(trainer.train_dataset, "restore"):  # a streamed corpus's position
            try:
                trainer.train_dataset.restore(resume.checkpoint)
            except ValueError as error:
                raise ConfigError(f"key `training.resume_from_checkpoint`: {error}") from error
        metrics = dict(trainer.train(resume_from_checkpoint=resume.checkpoint if resume else None).metrics)
    trainer.save_model()
    return metrics


def load_checkpoint_weights(model: Any, checkpoint: str) -> None:
    """Load a checkpoint's weights into `model` in place: a PEFT adapter (`adapter_model.safetensors`) or a full
    model (single-file or sharded, through `from_pretrained`, so tied weights are handled as on load)."""
    folder = Path(checkpoint)
    if (folder / "adapter_model.safetensors").is_file():
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
        # attr-defined: peft annotates the result as `namedtuple` (the factory); it is load_state_dict's key lists
        unexpected = result.unexpected_keys  # type: ignore[attr-defined]
        if unexpected:
            raise ConfigError(
                f"{folder}: adapter weights the model does not have: {unexpected[:5]}; finish this run "
                "with the adapter config that wrote it, or train into a new --output_dir"
            )
        return
    saved = type(model).from_pretrained(folder, dtype="auto")
    model.load_state_dict(saved.state_dict(), strict=True)


def weights_mismatch(folder: str | os.PathLike[str]) -> str | None:
    """Where a local checkpoint's safetensors weights disagree with the shapes its `config.json` builds (a weight
    the config makes another shape), or None; read from the file headers and a meta-device model, so a mismatch is
    named in one line before `from_pretrained` logs its table and raises."""
    import torch
    from safetensors import SafetensorError, safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    place = Path(folder)
    files = sorted(place.glob("*.safetensors"))
    if not (place / "config.json").is_file() or not files:
        return None
    try:
        config = AutoConfig.from_pretrained(place)  # a registered family only: never the folder's own code
        with torch.device("meta"):
            expected = {
                name: list(t.shape) for name, t in AutoModelForCausalLM.from_config(config).state_dict().items()
            }
    except (ValueError, KeyError, TypeError, OSError):
        return None  # not a family this package builds: from_pretrained reports it
    for file in files:
        try:
            with safe_open(file, "pt") as f:
                shapes = {name: list(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 - not a dict: no __iter__
        except SafetensorError:
            return None  # a truncated file: from_pretrained reports it
        for name, shape in shapes.items():
            if name in expected and expected[name] != shape:
                return (
                    f"{name} is {shape} in {file.name} but {expected[name]} by its config.json: the config is not "
                    "the one saved with these weights"
                )
    return None


def write_card(folder: str, text: str) -> None:
    """A folder's model card (`README.md`), written atomically."""
    atomic_write(Path(folder, "README.md"), text)


def publish(trainer: Any, run: RunFolders, commit_message: str, train_metrics: dict[str, Any]) -> None:
    """Mark every folder finished (after every process is done), then push the output folder when asked."""
    trainer.accelerator.wait_for_everyone()
    for folder in run.folders:
        folder.finish()
    if trainer.args.push_to_hub:
        trainer.push_to_hub(commit_message=commit_message)
    train_metrics["total_runtime"] = time.time() - run.started


__all__ = ["RunFolders", "open_run", "publish", "train_and_save", "weights_mismatch", "write_card"]
