"""One run of the suite: train one (variant, task, seed, lr) and evaluate it into a result row.

Evaluation keeps every example's answer hits (a hex bitstring in the row) for the bootstrap; evidence sizes also
record validation curves and flop_counter FLOPs. N-body: teacher-forced next-state training on the protocol's
trajectories (`nbody`), then an autoregressive rollout with validation, test and zero-shot metrics.
"""

from __future__ import annotations

import hashlib
import math
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.evidence.models import SequenceRegressor, build_model, family_of, variant_revision
from benchmarks.evidence.nbody import run_nbody
from benchmarks.evidence.protocol import EVAL_SEED, SELECTION, VAL_SEED, SizeSpec, TaskBudget
from benchmarks.evidence.stats import encode_bits
from benchmarks.evidence.tasks import Rows, as_batch, io_shape, lm_examples, lm_loss_fn, text_blocks
from benchmarks.evidence.training import train_loop
from benchmarks.measure import clock
from zpx_hf_train.evaluation import perplexity


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


def step_flops(model: torch.nn.Module, loss_fn: Callable[[int], torch.Tensor]) -> int:
    """FLOPs of one training step (forward + backward of one batch) as counted by torch.utils.flop_counter
    (matrix products and attention; elementwise ops are not counted); the gradients are discarded."""
    with FlopCounterMode(display=False) as counter:
        loss_fn(0).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


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
        if task == "nbody":
            row.update(run_nbody(model, budget, seed, device))
        else:
            loss_fn = lm_loss_fn(model, task, budget, seed, device)
            row["flops_per_step"] = step_flops(model, loss_fn)
            curve: list[list[float]] = []
            probe, every = (None, 0)
            if spec.checkpoints and spec.val_examples:
                probe, every = curve_probe(model, task, spec, budget, curve)
            row.update(train_loop(model, loss_fn, budget, probe, every))
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
