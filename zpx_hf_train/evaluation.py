"""Evaluation for any causal LM of the package: held-out perplexity and exact synthetic-task accuracy.

Perplexity is the token-weighted mean next-token cross-entropy of the LM head only (the ZPX
centre-cancellation term is a regulariser, not part of the likelihood). Task accuracy counts an
answer position t correct when `argmax logits[t-1] == input_ids[t]`; `exact_match` needs every
answer token of an example right. Held-out bits per byte comes with its standard error over the held-out
blocks and, from `ngram_references`, byte n-gram models scored on the same tokens. Reports, plots and model
cards are written by `zpx_hf_train.report`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
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
    row_nll, row_tokens = [], []
    for batch in _batches(dataset, batch_size):
        mask = batch.get("attention_mask")
        logits = model(
            input_ids=batch["input_ids"].to(device), attention_mask=None if mask is None else mask.to(device)
        ).logits.float()
        labels = batch["labels"][:, 1:].to(device)
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), labels, ignore_index=-100, reduction="none"
        ).double()
        row_nll += nll.sum(-1).tolist()
        row_tokens += (labels != -100).sum(-1).tolist()
    model.train(was_training)
    total_tokens, total_nll = sum(row_tokens), sum(row_nll)
    loss = total_nll / max(total_tokens, 1)
    se = _ratio_standard_error(row_nll, row_tokens)  # nats per token
    per_byte = 1 / math.log(2) if num_bytes is None else total_tokens / max(num_bytes, 1) / math.log(2)
    metrics = {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "bits_per_byte": loss / math.log(2) if num_bytes is None else total_nll / math.log(2) / max(num_bytes, 1),
        "tokens": total_tokens,
        "sequences": len(row_nll),
        "bits_per_byte_se": None if se is None else se * per_byte,
    }
    if num_bytes is not None:
        metrics["bytes"] = num_bytes
    return metrics


def _ratio_standard_error(nll: list[float], tokens: list[int]) -> float | None:
    """Standard error of sum(nll) / sum(tokens) over sequences (the delta method for a ratio of means,
    se^2 = sum((nll_i - loss tokens_i)^2) / (n (n - 1) mean(tokens)^2)); None under two sequences."""
    n = len(nll)
    if n < 2 or sum(tokens) == 0:
        return None
    loss = sum(nll) / sum(tokens)
    residual = sum((x - loss * t) ** 2 for x, t in zip(nll, tokens))
    return math.sqrt(residual / (n * (n - 1))) / (sum(tokens) / n)


def ngram_references(train: Any, heldout: Any, orders: Sequence[int] = (3, 5)) -> dict[str, float]:
    """Bits per token of n-gram models over the byte tokenizer's ids (`zpx_hf_train.ngram`), trained on the
    training text blocks read in order as one stream and scored on exactly the positions `perplexity` scores:
    every held-out block's labels from its second token on, the context inside the block (as the model's)."""
    from zpx_hf.tokenization_bytes import VOCAB_SIZE

    from .ngram import NgramModel

    stream = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in train["input_ids"]])
    blocks = [
        (np.asarray(ids, dtype=np.int64), np.asarray(labels))
        for ids, labels in zip(heldout["input_ids"], heldout["labels"])
    ]
    out = {}
    for order in orders:
        model = NgramModel(order, alphabet=VOCAB_SIZE).fit(stream)
        bits = [model.bits(ids, np.flatnonzero(labels[1:] != -100) + 1) for ids, labels in blocks]
        out[f"byte {order}-gram"] = float(np.concatenate(bits).mean())
    return out


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


__all__ = ["evaluate_model", "input_device", "ngram_references", "perplexity", "task_accuracy"]
