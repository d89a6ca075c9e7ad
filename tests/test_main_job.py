"""The README's main job (`zpx-main`): its report says what the model learned of each recall task, against
chance and the bar, and warns about every task it did not learn; the demo prompt starts with BOS."""

import json
import math
from pathlib import Path

import pytest

from zpx_hf_train.config import ConfigError
from zpx_hf_train.data import DataArguments, build_datasets, train_example_counts
from zpx_hf_train.main_job import main as zpx_main
from zpx_hf_train.report import RECALL_BAR, chance_levels, recall_results, recall_table, recall_verdict
from zpx_hf_train.train import load_run_config

ROOT = Path(__file__).resolve().parents[1]
MICRO = str(ROOT / "configs" / "test-micro.yaml")
MAIN = str(ROOT / "configs" / "zpx-tiny.yaml")


def test_chance_levels_are_one_over_each_answer_alphabet():
    assert chance_levels() == {"mqar": 1 / 26, "passkey": 1 / 10, "selective_copy": 1 / 26}


@pytest.mark.parametrize(
    ("accuracy", "expected"),
    [
        (0.10, "at chance"),
        (0.129, "at chance"),  # chance 0.1 over 900 tokens: one standard error is 0.01, the limit 0.13
        (0.131, "above chance, below the bar"),
        (0.899, "above chance, below the bar"),
        (RECALL_BAR, "learned"),
        (1.0, "learned"),
    ],
)
def test_recall_verdict_against_chance_and_the_bar(accuracy, expected):
    assert recall_verdict(accuracy, 0.1, 900) == expected


def test_recall_table_has_one_row_per_task():
    metrics = {
        "tasks": {
            "mqar": {"token_accuracy": 0.97, "exact_match": 0.8, "examples": 200},
            "passkey": {"token_accuracy": 0.1, "exact_match": 0.0, "examples": 200},
        }
    }
    rows = recall_results(metrics, {"mqar": 1600, "passkey": 1000})
    assert [row["verdict"] for row in rows] == ["learned", "at chance"]
    lines = recall_table(rows).splitlines()
    assert lines[0].startswith("| recall task | answer-token accuracy |")
    assert lines[2] == "| mqar | 0.970 | 0.800 | 0.038 | 200 (1600) | learned |"
    assert lines[3] == "| passkey | 0.100 | 0.000 | 0.100 | 200 (1000) | at chance |"


def test_task_train_examples_sets_the_recall_mix_and_is_checked(tmp_path):
    flags = ["--output_dir", str(tmp_path / "out"), "--tasks", "mqar", "passkey", "--task_train_examples", "40", "3"]
    run = load_run_config(MICRO, [*flags, "--mqar_query_replacement", "true", "--mqar_num_queries", "9"])
    data = run[DataArguments]
    assert train_example_counts(data) == {"mqar": 40, "passkey": 3}
    datasets = build_datasets(data)
    assert len(datasets["train"]) == 64 + 40 + 3  # text blocks (max_train_blocks) + the two task counts
    assert "query_replacement=True" in datasets["description"][1]
    with pytest.raises(ConfigError, match=r"`data.task_train_examples` = \[40\] must give one count >= 0 per task"):
        load_run_config(MICRO, [*flags[:-2], "40"])
    with pytest.raises(ConfigError, match=r"`data.mqar_num_queries`.*num_queries=9"):
        load_run_config(MICRO, [*flags, "--mqar_num_queries", "9"])  # more queries than pairs needs replacement


@pytest.mark.slow  # builds and packs the main job's ~42,000 training rows
def test_main_config_fits_one_epoch_of_its_budget():
    """The main job's mix: every training row is seen about once in its steps (no task starved or repeated)."""
    from transformers import TrainingArguments

    run = load_run_config(MAIN, ["--output_dir", "runs/unused"])
    data, training = run[DataArguments], run[TrainingArguments]
    rows = len(build_datasets(data)["train"])
    seen = training.max_steps * training.per_device_train_batch_size
    assert 0.9 <= seen / rows <= 1.2, (seen, rows)


def test_main_job_reports_recall_against_chance_and_warns(tmp_path, capsys):
    summary = tmp_path / "main_job.md"
    out = tmp_path / "run"
    flags = ["--config", MICRO, "--summary", str(summary), "--output_dir", str(out), "--inspect", "false"]
    assert zpx_main([*flags, "--max_steps", "4", "--save_strategy", "no", "--eval_strategy", "no"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    text = summary.read_text()
    assert text.startswith("Measured by `zpx-main --summary")
    for part in ("- wall time", "Training data", "held-out perplexity", "synthetic `mqar`"):
        assert part in text
    drift = float(text.split("max |logit difference| ")[1].split(";")[0])
    assert drift <= 1e-4  # fp32 logits of size ~10, summed in another thread count by the reloading Python
    table = [line for line in text.splitlines() if line.startswith("| ") and line.endswith(" |")]
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ") for line in table if line.split(" | ")[0][2:] in metrics["tasks"]
    }
    assert set(rows) == {"mqar", "passkey", "selective_copy"}
    chance = chance_levels()
    for task, cells in rows.items():
        accuracy = metrics["tasks"][task]["token_accuracy"]
        assert math.isclose(float(cells[1]), accuracy, abs_tol=5e-4)
        assert math.isclose(float(cells[3]), chance[task], abs_tol=5e-4)
        answer_tokens = int(cells[4].split("(")[1].rstrip(")"))
        verdict = recall_verdict(accuracy, chance[task], answer_tokens)
        assert cells[5].rstrip(" |") == verdict
        if verdict != "learned":  # 4 steps of a micro model learn no recall: each task is warned about
            assert f"WARNING: recall task {task} is {verdict}" in captured.err
    assert "no recall task reached" in captured.err
    assert "Learned: none." in text
    assert "---- what the model learned: recall tasks, held out ----" in captured.out
