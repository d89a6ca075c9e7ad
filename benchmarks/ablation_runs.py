"""One ablation run: task data, the training loop and the task's evaluation, for one (variant, task, seed).

Token tasks draw fresh examples every step from `zpx_hf_train.data_tasks` / `zpx_hf_train.data_geometry` (training
seeds never meet the fixed test seed EVAL_SEED or the validation seed VAL_SEED), so a run is a sample of the
task distribution, not a fixed training set. Evaluation keeps every example's answer hits (a hex bitstring in
the row) for the bootstrap; evidence sizes also record validation curves and flop_counter FLOPs. Optimiser:
AdamW, linear warm-up, then a constant learning rate, gradient clipping 1.0; with a constant rate a run of
N steps is the first N steps of a longer one, which is what the calibration measures. N-body: teacher-forced
next-state training on the protocol's trajectories (`ablation_nbody`), then an autoregressive rollout with
validation, test and zero-shot metrics.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ablation_models import SequenceRegressor, build_model, family_of, variant_revision
from ablation_nbody import NBODY, nbody_reference, run_nbody  # the N-body task: benchmarks/ablation_nbody.py
from ablation_stats import encode_bits
from measure import clock  # benchmarks/measure.py: the one wall clock of every benchmark

EVAL_SEED = 10_000  # test data: the same for every training seed and variant
VAL_SEED = 20_000  # validation data (lr selection, curves): its own seed, distinct from test and training seeds
# a token task's example generator, where the task name is a protocol of another task's data
GENERATOR = {"passkey_long": "passkey"}


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
    protocol: str = ""  # protocol id recorded in every row (a changed protocol gets a new id)
    lrs: tuple[float, ...] = ()  # learning-rate grid, selected on validation (empty: the budget's lr only)
    checkpoints: tuple[float, ...] = ()  # fractions of the step budget at which validation accuracy is recorded
    val_examples: int = 0  # validation examples (trained length), 0: no validation

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SizeSpec:
        budgets = {task: TaskBudget(**b) for task, b in data["budgets"].items()}
        tuples = {k: tuple(data[k]) for k in ("passkey_multiples", "lrs", "checkpoints") if k in data}
        return cls(**{**data, "budgets": budgets, **tuples})

    def lr_grid(self, task: str) -> tuple[float, ...]:
        return self.lrs or (self.budgets[task].lr,)

    def multiples(self, task: str) -> tuple[int, ...]:
        """Evaluated multiples of the trained length: the extrapolation protocol (passkey) or 1x only."""
        return self.passkey_multiples if task == "passkey" else (1,)

    def passkey_lengths(self, task: str = "passkey") -> list[int]:
        length = self.budgets[task].params["length"]
        return [length * m for m in self.multiples(task)]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a results jsonl; a line cut by an interruption (the last one) is ignored."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one row to a results jsonl, flushed to disk: a finished run survives an interruption."""
    with open(path, "a") as log:
        log.write(json.dumps(row) + "\n")
        log.flush()
        os.fsync(log.fileno())


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
    from zpx_hf_train.data_geometry import spiral_examples
    from zpx_hf_train.data_tasks import listops_examples, mqar_examples, passkey_examples, selective_copy_examples

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


def answer_hits(model: torch.nn.Module, rows: list[dict[str, Any]], batch_size: int) -> np.ndarray:
    """[examples, answers] correctness of the greedy next-token prediction at each answer position, the
    quantity `zpx_hf_train.evaluation.task_accuracy` sums (every example of these tasks has the same number of
    answer tokens), kept per example so the statistics can resample evaluation examples."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    hits = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = as_batch(rows[start : start + batch_size])
            input_ids = batch["input_ids"].to(device)
            logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"].to(device)).logits
            mask = batch["answer_mask"][:, 1:].bool()
            correct = (logits[:, :-1].argmax(-1).cpu() == input_ids[:, 1:].cpu()) & mask
            answers = mask.sum(-1)
            if int(answers.min()) != int(answers.max()) or int(answers.min()) == 0:
                raise ValueError("answer_hits: examples must have the same, non-zero number of answer tokens.")
            hits.append(correct[mask].reshape(len(answers), -1).numpy())
    model.train(was_training)
    return np.concatenate(hits)


def hit_metrics(hits: np.ndarray, prefix: str, bits: bool) -> dict[str, Any]:
    """Answer accuracy (per answer token), exact match (per example), and optionally the hits as a bitstring."""
    out: dict[str, Any] = {f"{prefix}accuracy": float(hits.mean()), f"{prefix}exact_match": float(hits.all(-1).mean())}
    if bits:
        out[f"{prefix}bits"] = encode_bits(hits.reshape(-1))
        out[f"{prefix}shape"] = list(hits.shape)
    return out


def evaluate_lm(
    model: torch.nn.Module, task: str, spec: SizeSpec, budget: TaskBudget, split: str = "test"
) -> dict[str, Any]:
    """Answer accuracy (token and exact match) with per-example hits; the needle at every evaluated length;
    text: perplexity/byte. `split="val"`: the validation set (VAL_SEED, `spec.val_examples`, trained length),
    keys prefixed `val_`."""
    from zpx_hf_train.evaluation import perplexity

    val = split == "val"
    seed, prefix = (VAL_SEED, "val_") if val else (EVAL_SEED, "")
    if task == "text":
        blocks = text_blocks(budget.params, True)
        if val:  # the held-out documents' other half: validation blocks never overlap the test blocks
            blocks = blocks[len(blocks) // 2 :]
        elif spec.val_examples:
            blocks = blocks[: len(blocks) // 2]
        rows = [{"input_ids": b, "attention_mask": [1] * len(b), "labels": b} for b in blocks]
        return {f"{prefix}perplexity": perplexity(model, Rows(rows), batch_size=16)["perplexity"]}
    if task in ("passkey", "passkey_long"):
        result = {}
        lengths = list(zip(spec.multiples(task), spec.passkey_lengths(task)))
        for multiple, length in lengths[:1] if val else lengths:
            num = spec.val_examples if val else spec.passkey_eval_examples
            rows = lm_examples(task, num, seed, budget.params, length=length)
            hits = answer_hits(model, rows, batch_size=max(1, 4096 // length))
            metrics = hit_metrics(hits, "", bits=not val)
            for key, value in metrics.items():
                name = {"accuracy": "passkey_digit_acc", "exact_match": "passkey_em"}.get(key, f"passkey_{key}")
                result[f"{prefix}{name}@{multiple}x"] = value
        return result
    rows = lm_examples(task, spec.val_examples if val else spec.eval_examples, seed, budget.params)
    return hit_metrics(answer_hits(model, rows, 64), prefix, bits=not val)


# the validation metric of a task's lr selection and curves: (key, higher is better)
SELECTION = {
    "mqar": ("val_accuracy", True),
    "selective_copy": ("val_accuracy", True),
    "spiral": ("val_accuracy", True),
    "listops": ("val_accuracy", True),
    "passkey": ("val_passkey_digit_acc@1x", True),
    "passkey_long": ("val_passkey_digit_acc@1x", True),
    "text": ("val_perplexity", False),
    "nbody": ("val_position_mse", False),
}


def step_flops(model: torch.nn.Module, loss_fn: Callable[[int], torch.Tensor]) -> int:
    """FLOPs of one training step (forward + backward of one batch) as counted by torch.utils.flop_counter
    (matrix products and attention; elementwise ops are not counted); the gradients are discarded."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss_fn(0).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


# ---- one job --------------------------------------------------------------------------------------


def config_hash(model: torch.nn.Module) -> str:
    """sha1 of the model config's JSON (`to_json_string`), 12 hex digits: the exact model a row trained."""
    config = (model.backbone if isinstance(model, SequenceRegressor) else model).config
    return hashlib.sha1(config.to_json_string().encode()).hexdigest()[:12]


def curve_probe(
    model: torch.nn.Module, task: str, spec: SizeSpec, budget: TaskBudget, curve: list[list[float]]
) -> tuple[Callable[[int], bool], int]:
    """(probe, every) for `train_loop`: at each checkpoint step (fractions `spec.checkpoints` of the budget) the
    validation metric is appended to `curve` as [step, value]; training never stops early."""
    key = SELECTION[task][0]
    marks = {max(1, round(f * budget.steps)) for f in spec.checkpoints}
    every = math.gcd(*marks)

    def probe(step: int) -> bool:
        if step in marks:
            curve.append([step, evaluate_lm(model, task, spec, budget, "val")[key]])
            model.train()
        return False

    return probe, every


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One (variant, task, seed, lr) training + evaluation; never raises (errors are recorded in the row).

    The row carries its provenance: commit and dirty flag (`job["commit"]`), the model config's hash, lr, seed,
    protocol id, the task budget's fingerprint (lr excluded: the grid is part of the protocol) and the variant's
    revision where it has one."""
    torch.set_num_threads(job.get("threads", 1))
    spec = SizeSpec.from_dict(job["spec"])
    task, variant, seed = job["task"], job["variant"], job["seed"]
    budget = spec.budgets[task]
    row: dict[str, Any] = {"variant": variant, "task": task, "seed": seed, "budget": budget.fingerprint()}
    if variant_revision(variant) is not None:
        row["variant_revision"] = variant_revision(variant)
    if job.get("lr") is not None:
        budget = replace(budget, lr=float(job["lr"]))
    row.update({"lr": budget.lr, "protocol": spec.protocol, **job.get("commit", {})})
    row.update({k: job["width"][k] for k in ("hidden", "intermediate", "params")})
    start = clock()
    try:
        torch.manual_seed(seed)
        device = job.get("device", "cpu")
        io = io_shape(task, budget, spec)
        model = build_model(variant, job["width"], spec.layers, spec.heads, io).to(device)
        row["config_hash"] = config_hash(model)
        seconds = job.get("seconds")
        if task == "nbody":
            row.update(run_nbody(model, budget, seed, device, seconds))
        else:
            loss_fn = lm_loss_fn(model, task, budget, seed, device)
            row["flops_per_step"] = step_flops(model, loss_fn)
            curve: list[list[float]] = []
            probe, every = (None, 0)
            if spec.checkpoints and spec.val_examples and seconds is None:
                probe, every = curve_probe(model, task, spec, budget, curve)
            row.update(train_loop(model, loss_fn, budget, seconds, probe, every))
            row["train_flops"] = row["flops_per_step"] * row["steps_done"]
            if spec.val_examples:
                row.update(evaluate_lm(model, task, spec, budget, "val"))
                if curve:
                    row["val_curve"] = curve
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
    "GENERATOR",
    "SELECTION",
    "VAL_SEED",
    "answer_hits",
    "append_row",
    "read_rows",
    "config_hash",
    "evaluate_lm",
    "hit_metrics",
    "step_flops",
    "Rows",
    "SizeSpec",
    "TaskBudget",
    "WALL_CLOCK_STEP_CAP",
    "as_batch",
    "io_shape",
    "lm_examples",
    "lm_loss_fn",
    "nbody_reference",
    "run_job",
    "task_seq_len",
    "train_loop",
]
