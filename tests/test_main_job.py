"""The README's main job (`zpx-main`): its report says what the model learned of each recall task, against
chance, the copy floor and the bar, and warns about every task it did not learn; held-out bits per byte comes
with its standard error and byte n-gram references on the same tokens; the demo prompt starts with BOS."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from zpx_hf.tokenization_bytes import VOCAB_SIZE, ids_to_text
from zpx_hf_train.config import ConfigError
from zpx_hf_train.data import TASK_SPECS, DataArguments, build_datasets, train_example_counts
from zpx_hf_train.data_tasks import SEPARATOR, task_examples
from zpx_hf_train.evaluation import ngram_references, perplexity
from zpx_hf_train.main_job import main as zpx_main
from zpx_hf_train.report import (
    RECALL_BAR,
    chance_levels,
    lr_hint,
    recall_floor,
    recall_results,
    recall_table,
    recall_verdict,
)
from zpx_hf_train.train import load_run_config
from zpx_hf_train.train import main as train_main

ROOT = Path(__file__).resolve().parents[1]
MICRO = str(ROOT / "configs" / "test-micro.yaml")
MAIN = str(ROOT / "configs" / "zpx-tiny.yaml")


def test_chance_levels_are_one_over_each_answer_alphabet():
    assert chance_levels() == {"mqar": 1 / 26, "passkey": 1 / 10, "selective_copy": 1 / 26}


@pytest.mark.parametrize(
    ("accuracy", "expected"),
    [
        (0.05, "at the floor"),  # below the floor is no recall either
        (0.10, "at the floor"),
        (0.129, "at the floor"),  # floor 0.1 over 900 tokens: one standard error is 0.01, the limit 0.13
        (0.131, "above the floor, below the bar"),
        (0.899, "above the floor, below the bar"),
        (RECALL_BAR, "learned"),
        (1.0, "learned"),
    ],
)
def test_recall_verdict_against_the_floor_and_the_bar(accuracy, expected):
    assert recall_verdict(accuracy, 0.1, 900) == expected


def test_recall_table_has_one_row_per_task():
    metrics = {
        "tasks": {
            "mqar": {"token_accuracy": 0.97, "exact_match": 0.8, "examples": 200},
            "passkey": {"token_accuracy": 0.1, "exact_match": 0.0, "examples": 200},
        }
    }
    rows = recall_results(metrics, {"mqar": 1600, "passkey": 1000}, {"mqar": 0.279, "passkey": 0.28})
    assert [row["verdict"] for row in rows] == ["learned", "at the floor"]
    lines = recall_table(rows).splitlines()
    assert lines[0].startswith("| recall task | answer-token accuracy |")
    assert lines[2] == "| mqar | 0.970 | 0.800 | 0.038 | 0.279 | 200 (1600) | learned |"
    assert lines[3] == "| passkey | 0.100 | 0.000 | 0.100 | 0.280 | 200 (1000) | at the floor |"


def _context_candidates(task: str, example: dict) -> tuple[list[str], list[tuple[int, str]]]:
    """(the answer candidates the example's context holds, [(index in a candidate, answer token)]) read from its
    text: MQAR's pair values, the pass-key's numbers, selective copy's data letters."""
    ids, mask = example["input_ids"], example["answer_mask"]
    first = mask.index(1)
    context = ids_to_text(ids[1:first])
    answers = [ids_to_text([ids[t]]) for t in range(len(ids)) if mask[t]]
    if task == "mqar":
        pairs = context.split(SEPARATOR)[0]
        return list(pairs[1::2]), [(0, a) for a in answers]
    if task == "passkey":
        return re.findall(r"[0-9]+", context), list(enumerate(answers))
    return [c for c in context.split(SEPARATOR)[0] if c != "."], [(0, a) for a in answers]


@pytest.mark.parametrize("task", ["mqar", "passkey", "selective_copy"])
def test_each_recall_floor_matches_a_monte_carlo_of_copying_a_context_value(task):
    """Per generated example (the package's generator at the main job's parameters), the exact accuracy of
    answering each answer token from a uniformly drawn context candidate; its mean over 3,000 examples agrees
    with `recall_floor` within 4 standard errors (and is far from chance)."""
    data = load_run_config(MAIN, ["--output_dir", "runs/unused"])[DataArguments]
    params = TASK_SPECS[task].params(data)
    per_example = []
    for example in task_examples(task, 3000, seed=7, seq_len=None, **params):
        candidates, answers = _context_candidates(task, example)
        hits = [np.mean([c[i] == a for c in candidates]) for i, a in answers]
        per_example.append(np.mean(hits))
    mean, se = np.mean(per_example), np.std(per_example, ddof=1) / math.sqrt(len(per_example))
    floor = recall_floor(task, params)
    assert abs(mean - floor) < 4 * se, (task, mean, floor, se)
    assert floor > chance_levels()[task] + 10 * se


def test_the_ngram_references_score_the_perplexity_positions():
    """A unigram (order 1) Witten-Bell model counted by hand, scored on every held-out label after a block's
    first token (labels of -100 skipped), as `perplexity` scores them."""
    train = {"input_ids": [[1, 5, 6, 5, 7], [5, 5, 8, 2, 9]]}
    heldout = {"input_ids": [[1, 5, 9, 10], [6, 6, 5, 2]], "labels": [[1, 5, 9, 10], [6, -100, 5, 2]]}
    stream = [t for ids in train["input_ids"] for t in ids]
    counts, total, types = {t: stream.count(t) for t in set(stream)}, len(stream), len(set(stream))
    scored = [5, 9, 10, 5, 2]
    bits = [-math.log2((counts.get(t, 0) + types / VOCAB_SIZE) / (total + types)) for t in scored]
    assert ngram_references(train, heldout, orders=(1,)) == {"byte 1-gram": pytest.approx(np.mean(bits), rel=1e-12)}


def test_heldout_bits_per_byte_has_its_standard_error_over_blocks():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 11))
    model.forward = lambda input_ids, attention_mask=None: type("Out", (), {"logits": model[0](input_ids)})()
    blocks = torch.randint(0, 11, (6, 9)).tolist()
    rows = {"input_ids": blocks, "labels": blocks}
    dataset = type(
        "Rows", (), {"__len__": lambda self: 6, "__getitem__": lambda self, i: {k: v[i] for k, v in rows.items()}}
    )()
    result = perplexity(model, dataset, batch_size=4)
    with torch.no_grad():  # float64, per block: equal token counts, so the se is that of the block means
        logp = torch.log_softmax(model[0].weight.double()[torch.tensor(blocks)][:, :-1], -1)
        nll = -logp.gather(-1, torch.tensor(blocks)[:, 1:, None])[..., 0].mean(-1).numpy() / math.log(2)
    assert result["sequences"] == 6 and result["tokens"] == 48
    assert result["bits_per_byte"] == pytest.approx(nll.mean(), rel=1e-6)
    assert result["bits_per_byte_se"] == pytest.approx(nll.std(ddof=1) / math.sqrt(6), rel=1e-5)


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


def test_main_job_reports_recall_against_the_floor_and_warns(tmp_path, capsys):
    summary = tmp_path / "main_job.md"
    out = tmp_path / "run"
    flags = ["--config", MICRO, "--summary", str(summary), "--output_dir", str(out), "--inspect", "false"]
    assert zpx_main([*flags, "--max_steps", "4", "--save_strategy", "no", "--eval_strategy", "no"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    text = summary.read_text()
    assert text.startswith("Measured by `zpx-main --summary")
    for part in ("- wall time", "Training data", "held-out perplexity", "synthetic `mqar`", "held-out blocks"):
        assert part in text
    assert re.search(r"held-out bits per byte \| [0-9.]+ ± [0-9.]+ \(standard error over [0-9]+ blocks\)", text)
    for order in (3, 5):
        assert re.search(rf"byte {order}-gram, same held-out tokens: bits per byte \| [0-9.]+ \|", text)
    drift = float(text.split("max |logit difference| ")[1].split(";")[0])
    assert drift <= 1e-4  # fp32 logits of size ~10, summed in another thread count by the reloading Python
    table = [line for line in text.splitlines() if line.startswith("| ") and line.endswith(" |")]
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ") for line in table if line.split(" | ")[0][2:] in metrics["tasks"]
    }
    assert set(rows) == {"mqar", "passkey", "selective_copy"}
    chance = chance_levels()
    data = load_run_config(MICRO, ["--output_dir", str(out)])[DataArguments]
    for task, cells in rows.items():
        accuracy = metrics["tasks"][task]["token_accuracy"]
        floor = recall_floor(task, TASK_SPECS[task].params(data))
        assert math.isclose(float(cells[1]), accuracy, abs_tol=5e-4)
        assert math.isclose(float(cells[3]), chance[task], abs_tol=5e-4)
        assert math.isclose(float(cells[4]), floor, abs_tol=5e-4)
        answer_tokens = int(cells[5].split("(")[1].rstrip(")"))
        verdict = recall_verdict(accuracy, floor, answer_tokens)
        assert cells[6].rstrip(" |") == verdict
        if verdict != "learned":  # 4 steps of a micro model learn no recall: each task is warned about
            assert f"WARNING: recall task {task} is {verdict}" in captured.err
    assert "no recall task reached" in captured.err
    # the micro config trains ZPX at 3e-3: above the lr at which ZPX learned recall in the evidence suite
    assert "WARNING: learning_rate 0.003 is above 0.001" in captured.err
    assert "Learned: none." in text
    assert "---- what the model learned: recall tasks, held out ----" in captured.out


def test_zpx_train_reports_recall_and_the_lr_hint_as_the_main_job_does(tmp_path, capsys):
    quick = ["--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no", "--inspect", "false"]
    assert train_main([MICRO, "--output_dir", str(tmp_path / "run"), "--tasks", "mqar", *quick]) == 0
    captured = capsys.readouterr()
    assert re.search(r"^\| mqar \| [0-9.]+ \|", captured.out, re.MULTILINE)  # the recall table, one row per task
    assert "zpx-train: WARNING: recall task mqar is" in captured.err  # 2 steps learn no recall
    assert "zpx-train: WARNING: learning_rate 0.003 is above 0.001" in captured.err  # the micro config's lr
    assert train_main([MICRO, "--output_dir", str(tmp_path / "ok"), "--tasks", "mqar", "--learning_rate", "1e-3",
                       *quick]) == 0  # fmt: skip
    assert "learning_rate" not in capsys.readouterr().err  # at the family's ceiling: no hint


def test_the_lr_hint_names_the_family_ceiling_only_above_it():
    assert lr_hint("zpx", 3e-3).startswith("learning_rate 0.003 is above 0.001")
    assert "retry with learning_rate 0.0003" in lr_hint("pct", 1e-3)
    assert lr_hint("zpx", 1e-3) is None and lr_hint("pct", 3e-4) is None  # at the ceiling: nothing to say
    assert lr_hint("versor", 1e-2) is None and lr_hint("llama", 1e-2) is None  # no evidence, no claim
