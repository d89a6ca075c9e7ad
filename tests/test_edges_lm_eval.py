"""lm-evaluation-harness on every family and a same-size Llama, offline, through the task shipped in
`benchmarks/lm_eval_tasks/zpx_pydoc` (rolling log-likelihood of the ablation's held-out pydoc documents).

lm-eval's bits per byte must equal `zpx_hf_train.evaluation.perplexity` (the ablation's text metric)
on the same documents
written as [BOS, bytes...]: lm-eval scores every byte once after its own BOS prefix, so any log p(<s> | <s>) term
(a tokenizer that prepends BOS itself) or any difference in how the likelihood is summed would show here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import FAMILY_CASES, make_tiny_config
from helpers_llama import tiny_llama_config
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import zpx_hf  # noqa: F401
from zpx_hf.tokenization_bytes import BOS_ID, PAD_ID, VOCAB_SIZE, build_byte_tokenizer, text_to_ids
from zpx_hf_train.data_tasks import pydoc_documents, split_documents
from zpx_hf_train.evaluation import perplexity

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

TASKS = Path(__file__).resolve().parents[1] / "benchmarks" / "lm_eval_tasks"
DOCUMENTS = 2  # the first held-out documents (828 and 1702 bytes): one rolling window each at max_length 2048
MAX_LENGTH = 2048


def causal_lm(case: str):
    torch.manual_seed(0)
    if case == "llama":
        return LlamaForCausalLM(tiny_llama_config(vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_LENGTH)).eval()
    config = make_tiny_config(case, vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_LENGTH)
    return AutoModelForCausalLM.from_config(config).eval()


def heldout_documents() -> list[str]:
    return split_documents(pydoc_documents(), 0.1, seed=0)[1][:DOCUMENTS]


class Rows(list):
    def __getitem__(self, index):  # the dataset slice `evaluation.perplexity` reads: a dict of columns
        rows = list.__getitem__(self, index)
        return {key: [row[key] for row in rows] for key in rows[0]}


def ablation_metric(model, documents: list[str]) -> dict[str, float]:
    """`evaluation.perplexity` on [BOS, bytes...] per document, right-padded (labels -100 on padding)."""
    width = 1 + max(len(doc.encode("utf-8")) for doc in documents)
    rows = []
    for doc in documents:
        ids = [BOS_ID, *text_to_ids(doc)]
        pad = width - len(ids)
        rows.append(
            {
                "input_ids": ids + [PAD_ID] * pad,
                "attention_mask": [1] * len(ids) + [0] * pad,
                "labels": ids + [-100] * pad,
            }
        )
    return perplexity(model, Rows(rows), batch_size=len(rows))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama", "zpx", "pct", "versor-hybrid"])
def test_lm_eval_rolling_loglikelihood_equals_the_ablation_text_metric(case):
    model = causal_lm(case)
    tokenizer = build_byte_tokenizer(model_max_length=MAX_LENGTH)
    documents = heldout_documents()
    assert max(len(doc.encode("utf-8")) for doc in documents) < MAX_LENGTH  # one window: no rolling context cut
    harness = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, max_length=MAX_LENGTH)
    assert harness.tok_encode(documents[0])[0] != BOS_ID  # lm-eval prepends its prefix itself
    results = lm_eval.simple_evaluate(
        model=harness,
        tasks=["zpx_pydoc"],
        # only the shipped task: indexing lm-eval's ~14k built-in task files costs seconds per TaskManager, and
        # the README command below still runs with them
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        limit=DOCUMENTS,
        log_samples=False,
    )
    metrics = results["results"]["zpx_pydoc"]
    expected = ablation_metric(model, documents)
    assert expected["tokens"] == sum(len(doc.encode("utf-8")) for doc in documents)
    # float32 sums of ~2.5k per-token log-probabilities: a few float32 eps of the total
    tolerance = 1e-5
    assert math.isclose(metrics["bits_per_byte,none"], expected["bits_per_byte"], rel_tol=tolerance)
    assert math.isclose(metrics["byte_perplexity,none"], expected["perplexity"], rel_tol=tolerance)


README_ARGUMENTS = (  # the README's recipe, "lm-evaluation-harness", with a checkpoint folder, --limit and an output
    "--model hf --model_args pretrained={ckpt},trust_remote_code=True,max_length=2048 "
    "--include_path benchmarks/lm_eval_tasks --tasks zpx_pydoc --batch_size 1 --limit {limit} --output_path {out}"
)
# the `lm_eval` console command's own entry point, once per checkpoint in one process (its imports paid once).
# Each command indexes the same ~14k task files of lm-eval's own (seconds each); the index is built once and each
# command gets its own copy of the mapping (lm-eval copies an entry's config before using it), so every command
# still runs the CLI end to end on the index it would have built.
_RUN_COMMANDS = textwrap.dedent(
    """
    import sys
    from lm_eval.__main__ import cli_evaluate
    from lm_eval.tasks._index import TaskIndex

    built = {}
    build = TaskIndex.build
    def build_once(paths, **kwargs):
        key = (tuple(map(str, paths)), tuple(sorted(kwargs.items())))
        if key not in built:
            built[key] = build(paths, **kwargs)
        return dict(built[key])
    TaskIndex.build = staticmethod(build_once)

    for arguments in sys.argv[1:]:
        sys.argv = ["lm_eval", *arguments.split()]
        cli_evaluate()
    """
)


@pytest.mark.slow
def test_readme_lm_eval_command_on_saved_checkpoints_of_every_family(tmp_path):
    # the recipe as a user runs it: the lm_eval command, model and tokenizer loaded from each checkpoint folder
    models, commands = {}, []
    for case in FAMILY_CASES:
        models[case] = causal_lm(case)
        models[case].save_pretrained(tmp_path / case)
        build_byte_tokenizer(model_max_length=MAX_LENGTH).save_pretrained(tmp_path / case)
        commands.append(README_ARGUMENTS.format(ckpt=tmp_path / case, limit=DOCUMENTS, out=tmp_path / "out" / case))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    completed = subprocess.run(
        [sys.executable, "-c", _RUN_COMMANDS, *commands],
        cwd=TASKS.parents[1],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    documents = heldout_documents()
    for case, model in models.items():
        (results_file,) = (tmp_path / "out" / case).rglob("results_*.json")
        metrics = json.loads(results_file.read_text())["results"]["zpx_pydoc"]
        expected = ablation_metric(model, documents)
        assert math.isclose(metrics["bits_per_byte,none"], expected["bits_per_byte"], rel_tol=1e-5), case
