"""`data.packing: true` in the training pipeline: whole documents and task examples share rows with restarting
position_ids, nothing is lost, the model sees each document alone, and the run's description says it packed."""

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_config
from helpers_training import SMALL
from transformers import AutoModelForCausalLM

from zpx_hf.tokenization_bytes import BOS_ID, PAD_ID
from zpx_hf_train.data import DataArguments, build_datasets
from zpx_hf_train.data_tasks import IGNORE_INDEX
from zpx_hf_train.train import main

MICRO = str(Path(__file__).resolve().parents[1] / "configs" / "test-micro.yaml")

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py


def small_data(tmp_path, packing):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"document {i} " + "abc " * (3 + 5 * i) for i in range(12)), encoding="utf-8")
    return DataArguments(
        text_source=str(corpus), seq_len=64, heldout_fraction=0.2, tasks=["mqar", "selective_copy"],
        train_examples_per_task=6, eval_examples_per_task=2, mqar_num_pairs=4, selective_copy_num_positions=16,
        selective_copy_num_tokens=4, packing=packing,
    )  # fmt: skip


def test_packed_rows_keep_every_token_and_restart_positions(tmp_path):
    unpacked = build_datasets(small_data(tmp_path, False))
    packed = build_datasets(small_data(tmp_path, True))
    assert not any("packed" in line for line in unpacked["description"])
    assert unpacked["packing"].startswith("no: ") and packed["packing"].startswith("yes: ")
    assert any(line.startswith("packed: ") for line in packed["description"])
    rows, original = packed["train"], unpacked["train"]
    assert len(rows) < len(original)  # the task examples' padding is gone
    real = [t for ids, mask in zip(original["input_ids"], original["attention_mask"]) for t, m in zip(ids, mask) if m]
    kept = [t for ids, labels, pos in zip(rows["input_ids"], rows["labels"], rows["position_ids"])
            for t, label, p in zip(ids, labels, pos)]  # fmt: skip
    # every real token in order, then padding documents (PAD tokens whose labels are all ignored)
    assert [t for t in kept if t != PAD_ID] == [t for t in real if t != PAD_ID]
    columns = ("input_ids", "labels", "position_ids", "attention_mask")
    for ids, labels, positions, mask in zip(*(rows[k] for k in columns)):
        assert len(ids) == len(positions) == 64 and all(mask)
        # every <s> inside a row starts a new document
        assert all(positions[i] == 0 for i, t in enumerate(ids) if t == BOS_ID)
        starts = [i for i, p in enumerate(positions) if p == 0]
        assert starts[0] == 0
        for start in starts:
            assert labels[start] == IGNORE_INDEX  # no label predicted across a boundary
    # targets the causal-LM loss reads (a row's first label never is one): the same, less those that predicted
    # a document's <s> from the previous document
    supervised = sum(label != IGNORE_INDEX for labels in original["labels"] for label in labels[1:])
    boundary = sum(
        1 for ids, labels in zip(original["input_ids"], original["labels"])
        for i, (t, label) in enumerate(zip(ids, labels)) if i > 0 and t == BOS_ID and label != IGNORE_INDEX
    )  # fmt: skip
    assert sum(label != IGNORE_INDEX for labels in rows["labels"] for label in labels[1:]) == supervised - boundary


def test_packed_row_through_the_model_equals_its_documents_alone(tmp_path):
    rows = build_datasets(small_data(tmp_path, True))["train"]
    row = next(r for r in rows if r["position_ids"].count(0) >= 3)
    ids, positions = torch.tensor([row["input_ids"]]), torch.tensor([row["position_ids"]])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_tiny_config("zpx", vocab_size=260, max_position_embeddings=64))
    model = model.double().eval()
    with torch.no_grad():
        packed = model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions).logits
        starts = [i for i, p in enumerate(row["position_ids"]) if p == 0] + [len(row["position_ids"])]
        alone = torch.cat([model(input_ids=ids[:, a:b]).logits for a, b in zip(starts, starts[1:])], dim=1)
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-10)


def test_zpx_train_with_packing_reports_that_it_packed(tmp_path):
    """`zpx-train` with `data.packing: true` trains on packed rows and its report and metrics say so."""
    output_dir = tmp_path / "packed"
    assert main([MICRO, *SMALL, "--packing", "true", "--eval_strategy", "no", "--output_dir", str(output_dir)]) == 0
    details = json.loads((output_dir / "metrics.json").read_text())["details"]
    assert details["packing"].startswith("yes: ") and details["steps"] == 2
    assert math.isfinite(details["final_train_loss"]) and details["final_train_loss"] > 0
    report = (output_dir / "report.md").read_text()
    assert "| `packing` | `yes: " in report
    card = (output_dir / "README.md").read_text()
    assert "- packed: " in card  # the card's data section names the packing too
