"""Evaluation metrics are exact (a uniform model has perplexity = vocab size, an oracle scores 1.0); the report
plots eval loss beside train loss and the card's metadata carries the measured metrics as a model-index."""

import json
import math
from pathlib import Path

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutput

from zpx_hf_train.data_tasks import task_dataset, text_dataset
from zpx_hf_train.evaluation import evaluate_model, perplexity, task_accuracy
from zpx_hf_train.report import card_data, loss_points, render_model_card, write_report


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
    report = Path(paths["markdown"]).read_text()
    assert paths["png"].endswith("loss_curve.png") and "| mqar exact match | 1.000 |" in report
    assert "![Training loss and held-out evaluation loss](loss_curve.png)" in report
    context = {
        "model_type": "zpx", "model_name": "m", "repo_id": "me/m", "config_file": "c.yaml",
        "config": {"hidden_size": 8}, "data_description": "- d", "training": {"steps": 2}, "metrics": metrics,
        "output_dir": str(tmp_path),
    }  # fmt: skip
    data = card_data(model_name="m", tags=["zpx"], datasets=["d"], metrics=metrics, corpus="d")
    card = render_model_card(None, context, data)
    header = card.split("---")[1]
    assert "license: apache-2.0" in header and "library_name: transformers" in header and "me/m" in card
    assert "model-index:" in header and "type: perplexity" in header and "type: exact_match" in header
    perplexity_value = metrics["heldout"]["perplexity"]
    assert f"value: {round(perplexity_value, 4)}" in header
    assert "(loss_curve.png)" in card


def test_loss_points_keep_every_evaluation_set():
    history = [
        {"step": 2, "loss": 3.0},
        {"step": 2, "eval_mqar_loss": 2.0, "eval_passkey_loss": 1.5},
        {"step": 4, "eval_loss": 1.0},
        {"train_runtime": 1.0},
    ]
    assert loss_points(history) == {
        "train": [(2, 3.0)],
        "eval": [(4, 1.0)],
        "eval_mqar": [(2, 2.0)],
        "eval_passkey": [(2, 1.5)],
    }


class Noisy(Uniform):
    """Logits that differ per position, so blocks' losses differ and the standard error is not 0."""

    def forward(self, input_ids, attention_mask=None):
        generator = torch.Generator().manual_seed(int(input_ids.sum()))
        return CausalLMOutput(logits=3 * torch.randn(*input_ids.shape, self.vocab, generator=generator))


def test_bits_per_byte_standard_error_follows_the_bytes_per_token():
    """With `num_bytes` (a tokenizer that is not byte-level) bits per byte and its standard error scale alike:
    both are nats per token x tokens / bytes / ln 2."""
    data = text_dataset(["some held-out text, and more of it " * 20], seq_len=32)
    per_token = perplexity(Noisy(), data, batch_size=4)
    per_byte = perplexity(Noisy(), data, batch_size=4, num_bytes=3 * per_token["tokens"])
    assert per_token["bits_per_byte_se"] > 0
    assert per_byte["bits_per_byte"] == pytest.approx(per_token["bits_per_byte"] / 3, rel=1e-12)
    assert per_byte["bits_per_byte_se"] == pytest.approx(per_token["bits_per_byte_se"] / 3, rel=1e-12)
