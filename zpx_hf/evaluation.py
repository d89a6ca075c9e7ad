"""Evaluation for any causal LM of the package: held-out perplexity, exact synthetic-task accuracy,
and the written outputs (metrics JSON, Markdown report, loss-curve PNG, filled model card).

Perplexity is the token-weighted mean next-token cross-entropy of the LM head only (the ZPX
centre-cancellation term is a regulariser, not part of the likelihood). Task accuracy counts an
answer position t correct when `argmax logits[t-1] == input_ids[t]`; `exact_match` needs every
answer token of an example right. matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

import json
import math
import os
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

GENERIC_CARD = """---
library_name: transformers
license: ${license}
tags:
${tags_yaml}
datasets:
${datasets_yaml}
metrics:
- perplexity
- accuracy
---

# ${model_name}

A `${model_type}` causal language model trained with zpx-hf's `training/train.py` from `${config_file}`.
Load it with `trust_remote_code=True` (the modelling code ships with the checkpoint):

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("${repo_id}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("${repo_id}")
```

## Configuration
${config_table}

## Training data
${data_description}

## Training
${training_table}

## Evaluation
${metrics_table}
"""


def _batches(dataset: Any, batch_size: int) -> Iterable[dict[str, torch.Tensor]]:
    columns = ("input_ids", "attention_mask", "labels", "answer_mask")
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        yield {key: torch.tensor(rows[key]) for key in columns if key in rows}


@torch.no_grad()
def perplexity(model: torch.nn.Module, dataset: Any, batch_size: int = 32) -> dict[str, float]:
    """Held-out LM metrics over a dataset with `input_ids`, `labels` (and optionally `attention_mask`)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
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
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "bits_per_byte": loss / math.log(2),
        "tokens": total_tokens,
    }


@torch.no_grad()
def task_accuracy(model: torch.nn.Module, dataset: Any, batch_size: int = 32) -> dict[str, float]:
    """Token accuracy and exact match on the answer positions of a synthetic-task dataset."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
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
    model: torch.nn.Module, heldout: Any | None, tasks: Mapping[str, Any], batch_size: int = 32
) -> dict[str, Any]:
    """`{"heldout": perplexity(...), "tasks": {name: task_accuracy(...)}}`."""
    metrics: dict[str, Any] = {}
    if heldout is not None and len(heldout) > 0:
        metrics["heldout"] = perplexity(model, heldout, batch_size)
    metrics["tasks"] = {name: task_accuracy(model, data, batch_size) for name, data in tasks.items()}
    return metrics


def loss_points(log_history: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Training and evaluation loss points `(step, loss)` from `Trainer.state.log_history`."""
    train = [(int(e["step"]), float(e["loss"])) for e in log_history if "loss" in e and "step" in e]
    evals = [(int(e["step"]), float(e["eval_loss"])) for e in log_history if "eval_loss" in e and "step" in e]
    return {"train": train, "eval": evals}


def plot_loss_curve(log_history: Sequence[Mapping[str, Any]], path: str, title: str = "loss") -> str | None:
    """Write a loss-curve PNG; returns the path, or None when there is nothing to plot."""
    points = loss_points(log_history)
    if not points["train"] and not points["eval"]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for name, style in (("train", "-"), ("eval", "o--")):
        if points[name]:
            steps, losses = zip(*points[name])
            ax.plot(steps, losses, style, label=f"{name} loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def metrics_table(metrics: Mapping[str, Any]) -> str:
    """Markdown table of held-out and task metrics."""
    rows = ["| metric | value |", "|---|---|"]
    heldout = metrics.get("heldout")
    if heldout:
        rows.append(f"| held-out perplexity (per byte) | {heldout['perplexity']:.3f} |")
        rows.append(f"| held-out bits per byte | {heldout['bits_per_byte']:.3f} |")
    for name, result in metrics.get("tasks", {}).items():
        rows.append(f"| {name} answer-token accuracy | {result['token_accuracy']:.3f} |")
        rows.append(f"| {name} exact match | {result['exact_match']:.3f} |")
    return "\n".join(rows)


def _mapping_table(values: Mapping[str, Any]) -> str:
    rows = ["| key | value |", "|---|---|"]
    rows += [f"| `{key}` | `{value}` |" for key, value in values.items()]
    return "\n".join(rows)


def write_report(
    output_dir: str,
    metrics: Mapping[str, Any],
    log_history: Sequence[Mapping[str, Any]] = (),
    title: str = "evaluation",
    details: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Write `metrics.json`, `report.md` and `loss_curve.png` into `output_dir`; returns their paths."""
    os.makedirs(output_dir, exist_ok=True)
    paths = {"json": os.path.join(output_dir, "metrics.json"), "markdown": os.path.join(output_dir, "report.md")}
    payload = {"metrics": dict(metrics), "details": dict(details or {}), "loss_curve": loss_points(log_history)}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)
    png = plot_loss_curve(log_history, os.path.join(output_dir, "loss_curve.png"), title=title)
    lines = [f"# {title}", "", metrics_table(metrics), ""]
    if details:
        lines += ["## Run", "", _mapping_table(details), ""]
    if png:
        paths["png"] = png
        lines += ["## Loss curve", "", "![loss curve](loss_curve.png)", ""]
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return paths


def _yaml_list(items: Sequence[str]) -> str:
    return "\n".join(f"- {item}" for item in items) if items else "[]"


def render_model_card(template: str | None, context: Mapping[str, Any]) -> str:
    """Fill a `model_cards/<family>.md` template (`${name}` fields) from a run's context.

    `context` needs `model_type`, `model_name`, `repo_id`, `config_file`, `license`, `tags`, `datasets`, `config`,
    `data_description`, `training` and `metrics`; the tables and YAML lists are derived here.
    """
    values = dict(context)
    values["tags_yaml"] = _yaml_list(context["tags"])
    values["datasets_yaml"] = _yaml_list(context["datasets"])
    values["config_table"] = _mapping_table(context["config"])
    values["training_table"] = _mapping_table(context["training"])
    values["metrics_table"] = metrics_table(context["metrics"])
    return string.Template(template if template is not None else GENERIC_CARD).substitute(values)


__all__ = [
    "evaluate_model",
    "loss_points",
    "metrics_table",
    "perplexity",
    "plot_loss_curve",
    "render_model_card",
    "task_accuracy",
    "write_report",
]
