"""What a run leaves beside its weights: `metrics.json`, `report.md`, the loss curve, and the model card.

The card's metadata is a `huggingface_hub.ModelCardData` (license, tags, datasets, base model and a
`model-index` of the measured metrics), read back through `ModelCard` before it is written so malformed
metadata fails here rather than on the Hub. The body comes from `model_cards/<name>.md` (`${field}`
placeholders; shipped as package data, `zpx_hf_train.package_data`), or the generic card, with a warning, for a
name that has no template. Report and card embed the loss curve (train and eval loss) and the pictures that
`zpx_hf_train.inspection` lists in `inspection/index.json`. Nothing written names an absolute local path;
every file is written atomically (`zpx_hf_train.run_folder.atomic_write`).
"""

from __future__ import annotations

import io
import json
import math
import os
import string
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .package_data import data_folder
from .run_folder import atomic_write

LICENSE = "apache-2.0"

GENERIC_CARD = """# ${model_name}

A `${model_type}` causal language model trained with zpx-hf's `zpx-train` from `${config_file}`.
Load it with `trust_remote_code=True` (the modelling code ships with the checkpoint):

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("${repo_id}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("${repo_id}", trust_remote_code=True)  # else transformers asks [y/N]
```

## Configuration
${config_table}

## Training data
${data_description}

## Training
${training_table}

## Evaluation
${metrics_table}
${figures}
"""


def loss_points(log_history: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """`(step, loss)` points from `Trainer.state.log_history`: `train`, and one series per evaluation set
    (`eval` for a single set; `eval_<name>` when `Trainer` evaluated a dict of sets)."""
    points: dict[str, list[tuple[int, float]]] = {"train": [], "eval": []}
    for entry in log_history:
        if "step" not in entry:
            continue
        if "loss" in entry:
            points["train"].append((int(entry["step"]), float(entry["loss"])))
        for key, value in entry.items():
            if key.startswith("eval_") and key.endswith("_loss"):
                series = "eval" if key == "eval_loss" else key[: -len("_loss")]
                points.setdefault(series, []).append((int(entry["step"]), float(value)))
    return points


def plot_loss_curve(log_history: Sequence[Mapping[str, Any]], path: str, title: str = "loss") -> str | None:
    """Write a PNG of the training loss with the evaluation loss beside it; None when nothing was logged."""
    points = loss_points(log_history)
    if not any(points.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for name, series in points.items():
        if series:
            steps, losses = zip(*series)
            label = "train loss" if name == "train" else f"{name.replace('_', ' ')} loss (held out)"
            ax.plot(steps, losses, "-" if name == "train" else "o--", label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    ax.set_title(f"{title}: training and held-out loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    atomic_write(path, buffer.getvalue())
    return path


def metrics_table(metrics: Mapping[str, Any]) -> str:
    """Markdown table of held-out and task metrics."""
    rows = ["| metric | value |", "|---|---|"]
    heldout = metrics.get("heldout")
    if heldout:
        unit = "per token" if "bytes" in heldout else "per byte"  # `bytes`: the tokenizer is not byte-level
        rows.append(f"| held-out perplexity ({unit}) | {heldout['perplexity']:.3f} |")
        bpb = f"{heldout['bits_per_byte']:.3f}"
        if heldout.get("bits_per_byte_se") is not None:
            bpb += f" ± {heldout['bits_per_byte_se']:.3f} (standard error over {heldout['sequences']} blocks)"
        rows.append(f"| held-out bits per byte | {bpb} |")
        if heldout.get("tokens"):
            rows.append(f"| held-out tokens scored | {heldout['tokens']:,} |")
    for name, value in metrics.get("heldout_references", {}).items():
        rows.append(f"| {name}, same held-out tokens: bits per byte | {value:.3f} |")
    for name, result in metrics.get("tasks", {}).items():
        rows.append(f"| {name} answer-token accuracy | {result['token_accuracy']:.3f} |")
        rows.append(f"| {name} exact match | {result['exact_match']:.3f} |")
    return "\n".join(rows)


# answer-token accuracy at which a recall task counts as learned: far above chance (1/16 .. 1/10), short of perfect
RECALL_BAR = 0.9

# The highest lr at which each family learned a recall task (MQAR or the needle at 80 tokens, accuracy >= RECALL_BAR)
# in the evidence suite: seed 0, 2 layers, ~400K body parameters, AdamW, warm-up then constant lr, over 3e-4 / 1e-3 /
# 3e-3 (benchmarks/results/ablation_evidence_lr_ranges.md). Above it the same runs stayed at the copy floor. With
# seeds 1-3 at the boundary (benchmarks/results/lr_boundary.md): at 3e-3 no model learned MQAR, the softmax baseline
# (a Llama) included; at 1e-3 PCT learned the needle on no seed, the baseline on 2 of 3. Versor reached the bar at
# no lr.
RECALL_LR_CEILING = {"zpx": 1e-3, "pct": 3e-4}


def lr_hint(model_type: str, learning_rate: float) -> str | None:
    """Why a run may have learned no recall: its lr is above the highest at which its family learned one."""
    ceiling = RECALL_LR_CEILING.get(model_type)
    if ceiling is None or learning_rate <= ceiling * (1 + 1e-9):
        return None
    return (
        f"learning_rate {learning_rate:g} is above {ceiling:g}, the highest lr at which {model_type} learned a recall "
        "task in the evidence suite (benchmarks/results/ablation_evidence_lr_ranges.md, lr_boundary.md): retry with "
        f"learning_rate {ceiling:g}"
    )


def chance_levels() -> dict[str, float]:
    """Answer-token accuracy of uniform guessing per synthetic task: one over the alphabet its answers come from."""
    from .data_tasks import DIGITS, KEY_CHARS, VALUE_CHARS

    return {"mqar": 1 / len(VALUE_CHARS), "passkey": 1 / len(DIGITS), "selective_copy": 1 / len(KEY_CHARS)}


def recall_floor(task: str, params: Mapping[str, Any]) -> float:
    """Answer-token accuracy of copying a value from the context, exactly, for a task's generator `params`.

    Each answer token is answered with the matching token of one candidate drawn uniformly from the C candidates
    the context holds (MQAR: the values of its `num_pairs` pairs; pass-key: its needle and distractor numbers;
    selective copy: its `num_tokens` data letters). The drawn candidate is the right one with probability 1 / C;
    the others are drawn independently and uniformly from the answer alphabet A, so they match by coincidence
    with probability 1 / |A|:

        floor = 1 / C + (1 - 1 / C) / |A|

    A model that found the answers' place in the context but not which one a query asks for scores this, not
    1 / |A|; recall begins above it."""
    import inspect

    from .data_tasks import DIGITS, KEY_CHARS, VALUE_CHARS, passkey_examples

    if task == "mqar":
        candidates, alphabet = params["num_pairs"], len(VALUE_CHARS)
    elif task == "passkey":  # generator defaults for the counts a config does not set
        defaults = {k: v.default for k, v in inspect.signature(passkey_examples).parameters.items()}
        needles = params.get("num_needles", defaults["num_needles"])
        candidates, alphabet = needles + params.get("num_distractors", defaults["num_distractors"]), len(DIGITS)
    elif task == "selective_copy":
        candidates, alphabet = params["num_tokens"], len(KEY_CHARS)
    else:
        raise ValueError(f"recall_floor: no floor for task {task!r}.")
    return 1 / candidates + (1 - 1 / candidates) / alphabet


def recall_verdict(accuracy: float, floor: float, answer_tokens: int, bar: float = RECALL_BAR) -> str:
    """`learned` (accuracy >= bar), `at the floor` (within 3 binomial standard errors of the copy floor over the
    evaluated answer tokens, sqrt(p (1 - p) / n), or below it), else `above the floor, below the bar`."""
    if accuracy >= bar:
        return "learned"
    if accuracy <= floor + 3 * math.sqrt(floor * (1 - floor) / max(answer_tokens, 1)):
        return "at the floor"
    return "above the floor, below the bar"


def recall_results(
    metrics: Mapping[str, Any], answer_tokens: Mapping[str, int], floors: Mapping[str, float]
) -> list[dict[str, Any]]:
    """One row per evaluated task: accuracy, exact match, chance, the copy floor (`recall_floor`), answer tokens
    and `recall_verdict` against the floor."""
    chance = chance_levels()
    rows = []
    for task, result in metrics.get("tasks", {}).items():
        rows.append(
            {
                "task": task,
                "token_accuracy": result["token_accuracy"],
                "exact_match": result["exact_match"],
                "chance": chance[task],
                "floor": floors[task],
                "examples": result.get("examples", 0),
                "answer_tokens": answer_tokens[task],
                "verdict": recall_verdict(result["token_accuracy"], floors[task], answer_tokens[task]),
            }
        )
    return rows


def recall_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of `recall_results`: what the model learned, against the copy floor and the bar."""
    lines = [
        "| recall task | answer-token accuracy | exact match | chance | copy floor | held-out examples (answer tokens) "
        "| verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['token_accuracy']:.3f} | {row['exact_match']:.3f} | {row['chance']:.3f} | "
            f"{row['floor']:.3f} | {row['examples']} ({row['answer_tokens']}) | {row['verdict']} |"
        )
    return "\n".join(lines)


def mapping_table(values: Mapping[str, Any]) -> str:
    """Two-column Markdown table of a mapping."""
    rows = ["| key | value |", "|---|---|"]
    rows += [f"| `{key}` | `{value}` |" for key, value in values.items()]
    return "\n".join(rows)


def figures(output_dir: str) -> list[tuple[str, str]]:
    """`(relative file, title)` of the run's pictures: the loss curve, then `inspection/index.json`'s entries."""
    found = []
    if os.path.isfile(os.path.join(output_dir, "loss_curve.png")):
        found.append(("loss_curve.png", "Training loss and held-out evaluation loss"))
    index = Path(output_dir, "inspection", "index.json")
    if index.is_file():
        for entry in json.loads(index.read_text(encoding="utf-8")):
            if Path(output_dir, "inspection", entry["file"]).is_file():
                found.append((f"inspection/{entry['file']}", entry["title"]))
    return found


def figures_markdown(output_dir: str) -> str:
    """The run's pictures as Markdown sections (relative links: they work in the folder and on the Hub)."""
    found = figures(output_dir)
    if not found:
        return ""
    lines = ["", "## Pictures", ""]
    for file, title in found:
        lines += [f"### {title}", "", f"![{title}]({file})", ""]
    return "\n".join(lines)


def write_report(
    output_dir: str,
    metrics: Mapping[str, Any],
    log_history: Sequence[Mapping[str, Any]] = (),
    title: str = "evaluation",
    details: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Write `metrics.json`, `loss_curve.png` and `report.md` (metrics, run details, pictures); returns their paths."""
    os.makedirs(output_dir, exist_ok=True)
    paths = {"json": os.path.join(output_dir, "metrics.json"), "markdown": os.path.join(output_dir, "report.md")}
    payload = {"metrics": dict(metrics), "details": dict(details or {}), "loss_curve": loss_points(log_history)}
    atomic_write(paths["json"], json.dumps(payload, indent=2))
    png = plot_loss_curve(log_history, os.path.join(output_dir, "loss_curve.png"), title=title)
    if png:
        paths["png"] = png
    lines = [f"# {title}", "", metrics_table(metrics), ""]
    if details:
        lines += ["## Run", "", mapping_table(details), ""]
    lines.append(figures_markdown(output_dir))
    atomic_write(paths["markdown"], "\n".join(lines))
    return paths


def eval_results(metrics: Mapping[str, Any], corpus: str | None, task_name: str = "text-generation") -> list[Any]:
    """`huggingface_hub.EvalResult`s (the card's `model-index`) of held-out perplexity and task accuracy."""
    from huggingface_hub import EvalResult

    results = []
    heldout = metrics.get("heldout")
    if heldout and corpus:
        results.append(
            EvalResult(
                task_type=task_name,
                dataset_type=corpus,
                dataset_name=f"{corpus} (held-out documents)",
                metric_type="perplexity",
                metric_name="perplexity per byte",
                metric_value=round(heldout["perplexity"], 4),
            )
        )
    for task, result in metrics.get("tasks", {}).items():
        dataset = f"synthetic-{task.replace('_', '-')}"
        for metric, name in (("token_accuracy", "answer-token accuracy"), ("exact_match", "exact match")):
            results.append(
                EvalResult(
                    task_type=task_name,
                    dataset_type=dataset,
                    dataset_name=f"{task} (generated, evaluation seed)",
                    metric_type="accuracy" if metric == "token_accuracy" else "exact_match",
                    metric_name=name,
                    metric_value=round(result[metric], 4),
                )
            )
    return results


def render_model_card(template: str | None, context: Mapping[str, Any], data: Any) -> str:
    """Card text: `data` (`ModelCardData`) as YAML front matter, then the template filled from `context`.

    Tables come from `context["config"]`, `context["training"]` and `context["metrics"]`; pictures from
    `context["output_dir"]`. The text is parsed back with `ModelCard` and must give the same metadata."""
    from huggingface_hub import ModelCard

    values = {key: value for key, value in context.items() if isinstance(value, str)}
    values["config_table"] = mapping_table(context.get("config", {}))
    values["training_table"] = mapping_table(context.get("training", {}))
    values["metrics_table"] = metrics_table(context.get("metrics", {}))
    values["figures"] = figures_markdown(context["output_dir"])
    body = string.Template(template if template is not None else GENERIC_CARD).substitute(values)
    text = f"---\n{data.to_yaml()}\n---\n\n{body.strip()}\n"
    card = ModelCard(text)
    if card.data.to_dict() != data.to_dict():
        raise ValueError("model card metadata did not survive a round trip through huggingface_hub.ModelCard")
    return str(card)


def model_card_template(name: str) -> str | None:
    """`model_cards/<name>.md`; None (the generic card), with a warning on stderr, when no template has that name."""
    folder = data_folder("model_cards")
    path = folder / f"{name}.md"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    print(f"warning: no model-card template {name}.md in {folder}; the card is the generic one.", file=sys.stderr)
    return None


def card_data(
    *,
    model_name: str,
    tags: Sequence[str],
    datasets: Sequence[str],
    metrics: Mapping[str, Any],
    corpus: str | None,
    base_model: str | None = None,
    library_name: str = "transformers",
) -> Any:
    """`ModelCardData` of a run: license, library, pipeline, tags, datasets, base model and the `model-index`."""
    from huggingface_hub import ModelCardData

    return ModelCardData(
        license=LICENSE,
        library_name=library_name,
        pipeline_tag="text-generation",
        tags=list(tags),
        datasets=list(datasets),
        metrics=["perplexity", "accuracy", "exact_match"],
        base_model=base_model,
        model_name=model_name,
        eval_results=eval_results(metrics, corpus) or None,
    )


__all__ = [
    "GENERIC_CARD",
    "LICENSE",
    "RECALL_BAR",
    "card_data",
    "chance_levels",
    "eval_results",
    "figures",
    "figures_markdown",
    "loss_points",
    "mapping_table",
    "metrics_table",
    "model_card_template",
    "plot_loss_curve",
    "recall_floor",
    "recall_results",
    "recall_table",
    "recall_verdict",
    "render_model_card",
    "write_report",
]
