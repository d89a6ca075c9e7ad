"""Evaluation metrics are exact: a uniform model has perplexity = vocab size, an oracle scores 1.0."""

import json
import math

import torch
from transformers.modeling_outputs import CausalLMOutput

from zpx_hf.data_tasks import task_dataset, text_dataset
from zpx_hf.evaluation import evaluate_model, perplexity, render_model_card, task_accuracy, write_report


class Uniform(torch.nn.Module):
    def __init__(self, vocab=260):
        super().__init__()
        self.vocab = vocab
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None):
        return CausalLMOutput(logits=torch.zeros(*input_ids.shape, self.vocab) + self.dummy)


class Oracle(Uniform):
    """Predicts the true next token everywhere (reads ahead)."""

    def forward(self, input_ids, attention_mask=None):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits[:, :-1].scatter_(-1, input_ids[:, 1:, None], 10.0)
        return CausalLMOutput(logits=logits)


def test_uniform_model_perplexity_is_the_vocab_size():
    data = text_dataset(["some held-out text " * 20], seq_len=32)
    result = perplexity(Uniform(), data, batch_size=4)
    assert math.isclose(result["perplexity"], 260.0, rel_tol=1e-5)
    assert result["tokens"] == len(data) * 31
    assert math.isclose(result["bits_per_byte"], math.log2(260), rel_tol=1e-6)


def test_task_accuracy_counts_only_answer_positions():
    data = task_dataset("mqar", 10, seed=0, seq_len=64, num_pairs=4)
    assert task_accuracy(Oracle(), data, batch_size=3) == {"token_accuracy": 1.0, "exact_match": 1.0, "examples": 10}
    assert task_accuracy(Uniform(), data)["exact_match"] == 0.0


def test_report_and_card(tmp_path):
    metrics = evaluate_model(Oracle(), text_dataset(["abc " * 40], 16), {"mqar": task_dataset("mqar", 4, 0, 64)})
    history = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}, {"step": 2, "eval_loss": 2.5}]
    paths = write_report(str(tmp_path), metrics, history, title="t", details={"steps": 2})
    payload = json.loads((tmp_path / "metrics.json").read_text())
    assert payload["loss_curve"] == {"train": [[1, 3.0], [2, 2.0]], "eval": [[2, 2.5]]}
    assert paths["png"].endswith("loss_curve.png") and "| mqar exact match | 1.000 |" in open(paths["markdown"]).read()
    context = {
        "model_type": "zpx", "model_name": "m", "repo_id": "me/m", "config_file": "c.yaml", "license": "apache-2.0",
        "tags": ["zpx"], "datasets": ["d"], "config": {"hidden_size": 8}, "data_description": "- d",
        "training": {"steps": 2}, "metrics": metrics,
    }  # fmt: skip
    card = render_model_card(None, context)
    assert card.startswith("---\nlibrary_name: transformers\nlicense: apache-2.0\n") and "me/m" in card
