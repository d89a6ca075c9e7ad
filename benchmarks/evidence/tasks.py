"""Token tasks of the suite: example generators, sequence lengths, model input shapes, batches and the loss.

Token tasks draw fresh examples every step from `zpx_hf_train.data_tasks` / `zpx_hf_train.data_geometry`
(training seeds never meet the fixed test seed EVAL_SEED or the validation seed VAL_SEED), so a run is a sample
of the task distribution, not a fixed training set. `text` packs pydoc documents into blocks (held-out split).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.evidence.nbody import NBODY
from benchmarks.evidence.protocol import EVAL_SEED, VAL_SEED, SizeSpec, TaskBudget
from benchmarks.evidence.training import train_seed
from zpx_hf_train.data_geometry import spiral_examples
from zpx_hf_train.data_tasks import (
    listops_examples,
    mqar_examples,
    pack_documents,
    passkey_examples,
    pydoc_documents,
    selective_copy_examples,
    split_documents,
)

# a token task's example generator, where the task name is a protocol of another task's data
GENERATOR = {"passkey_long": "passkey"}


def task_seq_len(task: str, params: dict[str, Any]) -> int:
    """Tokens per example (BOS included) of a task with generator `params`."""
    if task == "mqar":
        return 2 + 2 * params["num_pairs"] + 2 * params.get("num_queries", params["num_pairs"])
    if task == "selective_copy":
        return 2 + params["num_positions"] + params["num_tokens"]
    if task == "spiral":
        return params["num_points"] + 3
    if task in ("passkey", "passkey_long", "text"):
        return params["length"]
    if task == "listops":  # BOS, an expression of at most max_length - 1 tokens, the marker, the value digit
        return params["max_length"] + 2
    if task == "nbody":
        return params["context"] + params["rollout"]
    raise ValueError(f"unknown task {task!r}.")


def io_shape(task: str, budget: TaskBudget, spec: SizeSpec) -> dict[str, int]:
    """Model input/output shape of a task (`features` for continuous sequences)."""
    if task == "nbody":
        return {"features": 2 * NBODY["bodies"] * NBODY["dim"], "max_pos": task_seq_len(task, budget.params)}
    train_length = task_seq_len(task, budget.params)
    return {"vocab": 260, "max_pos": train_length * max(spec.multiples(task)), "train_length": train_length}


def lm_examples(task: str, num: int, seed: int, params: dict[str, Any], length: int | None = None) -> list[dict]:
    """`num` examples of a token task from the package's generators (unpadded length = `task_seq_len`)."""
    task = GENERATOR.get(task, task)
    if task == "mqar":
        return mqar_examples(num, seed, **params)
    if task == "selective_copy":
        return selective_copy_examples(num, seed, **params)
    if task == "passkey":
        extra = {k: v for k, v in params.items() if k != "length"}
        return passkey_examples(num, seed, seq_len=length or params["length"], **extra)
    if task == "spiral":
        return spiral_examples(num, seed, **params)
    if task == "listops":  # expressions vary in length: padded on the right to the longest; split by data seed
        split = {EVAL_SEED: "test", VAL_SEED: "val"}.get(seed, "train")
        return listops_examples(num, seed, split=split, seq_len=task_seq_len(task, params), **params)
    raise ValueError(f"no generator for task {task!r}.")


def as_batch(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack equal-length example dicts (all four columns) into tensors."""
    keys = ("input_ids", "attention_mask", "labels", "answer_mask")
    return {k: torch.tensor([r[k] for r in rows]) for k in keys if k in rows[0]}


class Rows:
    """The slicing/len protocol of `zpx_hf_train.evaluation` over a list of example dicts (no `datasets` copy)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: slice) -> dict[str, list]:
        part = self.rows[index]
        return {k: [r[k] for r in part] for k in part[0]}


def lm_loss_fn(model: torch.nn.Module, task: str, budget: TaskBudget, seed: int, device: str) -> Callable:
    """Loss of a fresh batch per step (text: random blocks of the packed training corpus)."""
    if task == "text":
        blocks = torch.tensor(text_blocks(budget.params, heldout=False))
        generator = torch.Generator().manual_seed(train_seed(seed, 0))

        def text_loss(step: int) -> torch.Tensor:
            ids = blocks[torch.randint(0, len(blocks), (budget.batch,), generator=generator)].to(device)
            return model(input_ids=ids, labels=ids, use_cache=False).loss

        return text_loss

    def task_loss(step: int) -> torch.Tensor:
        batch = as_batch(lm_examples(task, budget.batch, train_seed(seed, step), budget.params))
        return model(
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
            labels=batch["labels"].to(device),
            use_cache=False,
        ).loss

    return task_loss


def text_blocks(params: dict[str, Any], heldout: bool) -> list[list[int]]:
    train_docs, heldout_docs = split_documents(pydoc_documents(), 0.1, seed=0)
    if heldout:
        return pack_documents(heldout_docs, params["length"], params["eval_blocks"])
    return pack_documents(train_docs, params["length"], params["train_blocks"])
