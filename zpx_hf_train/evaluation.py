"""Evaluation for any causal LM of the package: held-out perplexity and exact synthetic-task accuracy.

Perplexity is the token-weighted mean next-token cross-entropy of the LM head only (the ZPX
centre-cancellation term is a regulariser, not part of the likelihood). Task accuracy counts an
answer position t correct when `argmax logits[t-1] == input_ids[t]`; `exact_match` needs every
answer token of an example right. Reports, plots and model cards are written by `zpx_hf_train.report`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch


def _batches(dataset: Any, batch_size: int) -> Iterable[dict[str, torch.Tensor]]:
    columns = ("input_ids", "attention_mask", "labels", "answer_mask")
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        yield {key: torch.tensor(rows[key]) for key in columns if key in rows}


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a batch must go: the device the input embedding runs on, not where the first parameter sits (under
    accelerate's CPU/disk offload the weights wait on the meta device and a hook runs each module on its
    execution device). With an `hf_device_map`, transformers' rule (`Trainer`): the embedding's own accelerator,
    else the map's first accelerator, else the CPU. A module without `get_input_embeddings`: its first parameter's."""
    input_embeddings = getattr(model, "get_input_embeddings", None)
    if input_embeddings is None:
        return next(model.parameters()).device
    embeddings = input_embeddings()
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        name = next(name for name, module in model.named_modules() if module is embeddings)
        placed = sorted(  # the map's entries that hold the embedding, most specific first
            (prefix for prefix in device_map if prefix in ("", name) or name.startswith(prefix + ".")), key=len
        )[::-1]
        candidates = [device_map[prefix] for prefix in placed] + list(device_map.values())
        accelerators = [device for device in candidates if device not in ("cpu", "disk")]
        return torch.device(accelerators[0]) if accelerators else torch.device("cpu")
    # accelerate's cpu_offload / disk_offload helpers (no device map): the hook's execution device
    hooks = [getattr(embeddings, "_hf_hook", None)]
    hooks += list(getattr(hooks[0], "hooks", ()))  # a SequentialHook holds several
    for hook in hooks:
        execution_device = getattr(hook, "execution_device", None)
        if execution_device is not None:
            return torch.device(execution_device)
    return embeddings.weight.device


@torch.no_grad()
def perplexity(
    model: torch.nn.Module, dataset: Any, batch_size: int = 32, num_bytes: int | None = None
) -> dict[str, float]:
    """Held-out LM metrics over a dataset with `input_ids`, `labels` (and optionally `attention_mask`).

    Perplexity is per token. `num_bytes`: the UTF-8 bytes the scored tokens stand for, for a tokenizer that is not
    byte-level (`data.build_datasets`' `heldout_bytes`): bits per byte = total bits / bytes, and `bytes` is reported;
    None: one token is one byte (the byte tokenizer)."""
    was_training = model.training
    model.eval()
    device = input_device(model)
    total_nll, total_tokens = 0.0, 0
    for batch in _batches(dataset, batch_size):
        mask = batch.get("attention_mask")
        logits = model(
            input_ids=batch["input_ids"].to(device), attention_mask=None if mask is None else mask.to(device)
        ).logits.float()
        labels = batch["labels"][:, 1:].to(device)
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
        )
        total_nll += nll.item()
        total_tokens += int((labels != -100).sum())
    model.train(was_training)
    loss = total_nll / max(total_tokens, 1)
    metrics = {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "bits_per_byte": loss / math.log(2) if num_bytes is None else total_nll / math.log(2) / max(num_bytes, 1),
        "tokens": total_tokens,
    }
    if num_bytes is not None:
        metrics["bytes"] = num_bytes
    return metrics


@torch.no_grad()
def task_accuracy(model: torch.nn.Module, dataset: Any, batch_size: int = 32) -> dict[str, float]:
    """Token accuracy and exact match on the answer positions of a synthetic-task dataset."""
    was_training = model.training
    model.eval()
    device = input_device(model)
    correct_tokens = answer_tokens = correct_examples = examples = 0
    for batch in _batches(dataset, batch_size):
        input_ids = batch["input_ids"].to(device)
        logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"].to(device)).logits
        predicted = logits[:, :-1].argmax(-1)
        mask = batch["answer_mask"][:, 1:].to(device).bool()
        hits = (predicted == input_ids[:, 1:]) & mask
        correct_tokens += int(hits.sum())
        answer_tokens += int(mask.sum())
        correct_examples += int((hits.sum(-1) == mask.sum(-1)).sum())
        examples += input_ids.shape[0]
    model.train(was_training)
    return {
        "token_accuracy": correct_tokens / max(answer_tokens, 1),
        "exact_match": correct_examples / max(examples, 1),
        "examples": examples,
    }


def evaluate_model(
    model: torch.nn.Module,
    heldout: Any | None,
    tasks: Mapping[str, Any],
    batch_size: int = 32,
    heldout_bytes: int | None = None,
) -> dict[str, Any]:
    """`{"heldout": perplexity(...), "tasks": {name: task_accuracy(...)}}` (`heldout_bytes`: `perplexity`'s
    `num_bytes`)."""
    metrics: dict[str, Any] = {}
    if heldout is not None and len(heldout) > 0:
        metrics["heldout"] = perplexity(model, heldout, batch_size, heldout_bytes)
    metrics["tasks"] = {name: task_accuracy(model, data, batch_size) for name, data in tasks.items()}
    return metrics


__all__ = ["evaluate_model", "input_device", "perplexity", "task_accuracy"]
