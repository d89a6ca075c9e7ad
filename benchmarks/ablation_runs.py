"""One ablation run: task data, the training loop and the task's evaluation, for one (variant, task, seed).

Token tasks draw fresh examples every step from `zpx_hf_train.data_tasks` / `zpx_hf_train.data_geometry` (training
seeds never meet the fixed evaluation seed), so a run is a sample of the task distribution, not a fixed
training set. Optimiser: AdamW, linear warm-up, then a constant learning rate, gradient clipping 1.0;
with a constant rate a run of N steps is the first N steps of a longer one, which is what the calibration
measures. N-body (`ablation_nbody`): teacher-forced next-state training on the protocol's trajectories, then an
autoregressive rollout with validation, test and zero-shot metrics.
"""

from __future__ import annotations

import hashlib
import json
import math
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from ablation_models import build_model, family_of
from ablation_nbody import NBODY, nbody_reference, run_nbody  # the N-body task lives in benchmarks/ablation_nbody.py
from measure import clock  # benchmarks/measure.py: the one wall clock of every benchmark

EVAL_SEED = 10_000  # evaluation data is the same for every training seed


@dataclass(frozen=True)
class TaskBudget:
    """Training budget and task shape of one task (identical for every variant)."""

    steps: int
    batch: int
    lr: float
    params: dict[str, Any] = field(default_factory=dict)  # generator parameters (see `task_seq_len`)
    weight_decay: float = 0.01
    warmup: int = 50

    def fingerprint(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class SizeSpec:
    """Model shape, per-task budgets and evaluation sizes of one suite size."""

    hidden: int
    layers: int
    heads: int
    budgets: dict[str, TaskBudget]
    eval_examples: int
    passkey_multiples: tuple[int, ...]
    passkey_eval_examples: int
    seeds: int
    versor_max_hidden: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SizeSpec:
        budgets = {task: TaskBudget(**b) for task, b in data["budgets"].items()}
        return cls(**{**data, "budgets": budgets, "passkey_multiples": tuple(data["passkey_multiples"])})

    def passkey_lengths(self) -> list[int]:
        length = self.budgets["passkey"].params["length"]
        return [length * m for m in self.passkey_multiples]


def task_seq_len(task: str, params: dict[str, Any]) -> int:
    """Tokens per example (BOS included) of a task with generator `params`."""
    if task == "mqar":
        return 2 + 2 * params["num_pairs"] + 2 * params.get("num_queries", params["num_pairs"])
    if task == "selective_copy":
        return 2 + params["num_positions"] + params["num_tokens"]
    if task == "spiral":
        return params["num_points"] + 3
    if task in ("passkey", "text"):
        return params["length"]
    if task == "nbody":
        return params["context"] + params["rollout"]
    raise ValueError(f"unknown task {task!r}.")


def io_shape(task: str, budget: TaskBudget, spec: SizeSpec) -> dict[str, int]:
    """Model input/output shape of a task (`features` for continuous sequences)."""
    if task == "nbody":
        return {"features": 2 * NBODY["bodies"] * NBODY["dim"], "max_pos": task_seq_len(task, budget.params)}
    max_pos = task_seq_len(task, budget.params)
    if task == "passkey":
        max_pos *= max(spec.passkey_multiples)
    return {"vocab": 260, "max_pos": max_pos}


def lm_examples(task: str, num: int, seed: int, params: dict[str, Any], length: int | None = None) -> list[dict]:
    """`num` examples of a token task from the package's generators (unpadded length = `task_seq_len`)."""
    from zpx_hf_train.data_geometry import spiral_examples
    from zpx_hf_train.data_tasks import mqar_examples, passkey_examples, selective_copy_examples

    if task == "mqar":
        return mqar_examples(num, seed, **params)
    if task == "selective_copy":
        return selective_copy_examples(num, seed, **params)
    if task == "passkey":
        extra = {k: v for k, v in params.items() if k != "length"}
        return passkey_examples(num, seed, seq_len=length or params["length"], **extra)
    if task == "spiral":
        return spiral_examples(num, seed, **params)
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


def train_seed(seed: int, step: int) -> int:
    return 1_000_003 * (seed + 1) + step


# ---- training -------------------------------------------------------------------------------------


WALL_CLOCK_STEP_CAP = 20  # a wall-clock-matched run stops at 20x the step budget even if time remains


def train_loop(
    model: torch.nn.Module,
    loss_fn: Callable[[int], torch.Tensor],
    budget: TaskBudget,
    seconds: float | None = None,
    probe: Callable[[int], bool] | None = None,
    probe_every: int = 0,
) -> dict[str, Any]:
    """AdamW, warm-up then constant lr; `loss_fn(step)` builds its own batch. Stops after `budget.steps`, or when
    `probe(step)` returns True (calibration). With `seconds` (wall-clock-matched rows) it trains for exactly that
    long instead, fewer or more steps than the budget (at most `WALL_CLOCK_STEP_CAP` times it)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=budget.lr, weight_decay=budget.weight_decay)
    warmup = max(1, budget.warmup)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    losses: list[float] = []
    model.train()
    start = clock()
    step = 0
    # A faster model matched on wall-clock trains more steps than the budget, not the budget's steps sooner.
    max_steps = budget.steps if seconds is None else budget.steps * WALL_CLOCK_STEP_CAP
    for step in range(max_steps):
        loss = loss_fn(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"training loss became {losses[-1]} at step {step}")
        if seconds is not None and clock() - start >= seconds:
            break
        if probe is not None and probe_every and (step + 1) % probe_every == 0 and probe(step + 1):
            break
    model.train()
    return {
        "steps_done": step + 1,
        "train_seconds": clock() - start,
        "final_train_loss": float(np.mean(losses[-20:])),
    }


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
    from zpx_hf_train.data_tasks import pack_documents, pydoc_documents, split_documents

    train_docs, heldout_docs = split_documents(pydoc_documents(), 0.1, seed=0)
    if heldout:
        return pack_documents(heldout_docs, params["length"], params["eval_blocks"])
    return pack_documents(train_docs, params["length"], params["train_blocks"])


def evaluate_lm(model: torch.nn.Module, task: str, spec: SizeSpec, budget: TaskBudget) -> dict[str, float]:
    """Answer accuracy (token and exact match); passkey at every evaluated length; text: perplexity/byte."""
    from zpx_hf_train.evaluation import perplexity, task_accuracy

    if task == "text":
        rows = [{"input_ids": b, "attention_mask": [1] * len(b), "labels": b} for b in text_blocks(budget.params, True)]
        return {"perplexity": perplexity(model, Rows(rows), batch_size=16)["perplexity"]}
    if task == "passkey":
        result = {}
        for multiple, length in zip(spec.passkey_multiples, spec.passkey_lengths()):
            rows = lm_examples(task, spec.passkey_eval_examples, EVAL_SEED, budget.params, length=length)
            metrics = task_accuracy(model, Rows(rows), batch_size=max(1, 4096 // length))
            result[f"passkey_em@{multiple}x"] = metrics["exact_match"]
            result[f"passkey_digit_acc@{multiple}x"] = metrics["token_accuracy"]
        return result
    metrics = task_accuracy(model, Rows(lm_examples(task, spec.eval_examples, EVAL_SEED, budget.params)), 64)
    return {"accuracy": metrics["token_accuracy"], "exact_match": metrics["exact_match"]}


# ---- one job --------------------------------------------------------------------------------------


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One (variant, task, seed) training + evaluation; never raises (errors are recorded in the row)."""
    torch.set_num_threads(job.get("threads", 1))
    spec = SizeSpec.from_dict(job["spec"])
    task, variant, seed = job["task"], job["variant"], job["seed"]
    budget = spec.budgets[task]
    row: dict[str, Any] = {"variant": variant, "task": task, "seed": seed, "budget": budget.fingerprint()}
    row.update({k: job["width"][k] for k in ("hidden", "intermediate", "params")})
    start = clock()
    try:
        torch.manual_seed(seed)
        device = job.get("device", "cpu")
        io = io_shape(task, budget, spec)
        model = build_model(variant, job["width"], spec.layers, spec.heads, io).to(device)
        seconds = job.get("seconds")
        if task == "nbody":
            row.update(run_nbody(model, budget, seed, device, seconds))
        else:
            row.update(train_loop(model, lm_loss_fn(model, task, budget, seed, device), budget, seconds))
            row.update(evaluate_lm(model, task, spec, budget))
        row["status"] = "ok"
    except Exception as error:  # recorded in the results as "not run" with the reason
        row["status"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
        row["traceback"] = traceback.format_exc(limit=3)
    row["family"] = family_of(variant)
    row["seconds"] = clock() - start
    return row


__all__ = [
    "EVAL_SEED",
    "Rows",
    "SizeSpec",
    "TaskBudget",
    "WALL_CLOCK_STEP_CAP",
    "as_batch",
    "evaluate_lm",
    "io_shape",
    "lm_examples",
    "lm_loss_fn",
    "nbody_reference",
    "run_job",
    "task_seq_len",
    "train_loop",
]
