"""The whole path a user takes from a Llama to a published ZPX model, offline (issue 34, item 4): train a
`LlamaForCausalLM` with transformers' `Trainer` on a local corpus and the byte tokenizer, save it, convert it with
`zpx-convert`, continue with `zpx-train` from a YAML with `model.init_from` (its loss at step 0 is the Llama's on
the same batch; the per-head lambdas move off 0), evaluate the result with lm-eval, and push it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import assert_close_eps
from helpers_llama import tiny_llama_config
from helpers_remote import run_remote_code
from transformers import LlamaForCausalLM, Trainer, TrainingArguments, default_data_collator

from zpx_hf import ZPXForCausalLM
from zpx_hf.tokenization_bytes import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, build_byte_tokenizer, text_to_ids
from zpx_hf_train.convert import main as zpx_convert
from zpx_hf_train.data import DataArguments, build_datasets
from zpx_hf_train.data_tasks import pydoc_documents, split_documents
from zpx_hf_train.train import main as zpx_train

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.tasks import TaskManager  # noqa: E402
from test_edges_lm_eval import DOCUMENTS, MAX_LENGTH, TASKS, ablation_metric, heldout_documents  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py

SEQ_LEN = 64
BLOCKS = 16  # the corpus's training blocks: one batch, so "the same batch" is the whole training set
RUN_YAML = """\
model_type: zpx
model:
  init_from: {init_from}
data:
  text_source: {corpus}
  seq_len: {seq_len}
  max_train_blocks: {blocks}
  max_eval_blocks: 4
  tasks: []
training:
  output_dir: {output_dir}
  max_steps: 3
  per_device_train_batch_size: {blocks}
  learning_rate: 3e-3
  logging_steps: 1
  eval_strategy: "no"
  save_strategy: "no"
  seed: 0
  report_to: none
  disable_tqdm: true
  dataloader_num_workers: 0
  dataloader_pin_memory: false
"""


def write_corpus(path: Path) -> Path:
    """A local jsonl corpus: pydoc documents outside the held-out split lm-eval's `zpx_pydoc` task scores."""
    train = split_documents(pydoc_documents(), 0.1, seed=0)[0]
    path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in train[:40]), encoding="utf-8")
    return path


def train_llama(corpus: Path, folder: Path) -> LlamaForCausalLM:
    """What a user has: a Llama trained by transformers' own `Trainer` on the byte tokens of `corpus`, saved."""
    rows = build_datasets(DataArguments(text_source=str(corpus), seq_len=SEQ_LEN, max_train_blocks=BLOCKS, tasks=[]))
    torch.manual_seed(0)
    ids = dict(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    model = LlamaForCausalLM(tiny_llama_config(vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_LENGTH, **ids))
    arguments = TrainingArguments(
        output_dir=str(folder.parent / "llama-run"),
        max_steps=30,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        dataloader_pin_memory=False,
        seed=0,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=rows["train"],
        data_collator=default_data_collator,
        processing_class=build_byte_tokenizer(),
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0] - 0.5, losses  # it learned the corpus
    model.save_pretrained(folder)
    build_byte_tokenizer(model_max_length=MAX_LENGTH).save_pretrained(folder)
    return model.eval()


def push(folder: Path, repo_id: str) -> Path:
    """Publish `folder` as `hf upload` does (`HfApi.create_repo`, then `upload_folder` without checkpoints or the
    run's private `_*` files) through huggingface_hub's own HTTP code against the test's local Hub-API server
    (conftest's `local_hub`), and return the folder `snapshot_download` gives back."""
    from huggingface_hub import HfApi, snapshot_download

    api = HfApi()
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), ignore_patterns=["checkpoint-*", "_*"])
    return Path(snapshot_download(repo_id))


@pytest.mark.slow
def test_llama_to_published_zpx_offline(tmp_path, local_hub):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    llama = train_llama(corpus, tmp_path / "llama")

    # zpx-convert: the console command's entry point (pyproject's [project.scripts])
    assert zpx_convert([str(tmp_path / "llama"), str(tmp_path / "zpx"), "--phase-channels", "4"]) == 0

    # zpx-train from a YAML with model.init_from
    run = tmp_path / "run"
    config = tmp_path / "continue.yaml"
    fields = dict(init_from=tmp_path / "zpx", corpus=corpus, seq_len=SEQ_LEN, blocks=BLOCKS, output_dir=run)
    config.write_text(RUN_YAML.format(**fields), encoding="utf-8")
    assert zpx_train([str(config)]) == 0

    # its loss at step 0 (logged at step 1, before the first update) is the Llama's on the same batch: every row
    batch = build_datasets(DataArguments(text_source=str(corpus), seq_len=SEQ_LEN, max_train_blocks=BLOCKS, tasks=[]))
    rows = batch["train"][:]
    assert len(batch["train"]) == BLOCKS
    with torch.no_grad():
        llama_loss = llama(**{key: torch.tensor(rows[key]) for key in ("input_ids", "attention_mask", "labels")}).loss
    curve = json.loads((run / "metrics.json").read_text())["loss_curve"]["train"]
    assert [step for step, _ in curve] == [1, 2, 3]
    # float32 means over the same 1008 tokens in another row order: measured within 1 eps x loss; a lambda of 0.05
    # in place of 0 moves the loss by ~40 eps x loss
    assert_close_eps(torch.tensor(curve[0][1]), llama_loss, ulps=16)
    assert curve[-1][1] < curve[0][1]
    trained = ZPXForCausalLM.from_pretrained(run).eval()
    for layer in trained.model.layers:  # every head's geometric terms started to grow
        assert layer.self_attn.lambda_angle_heads.abs().min() > 0
        assert layer.self_attn.lambda_sphere_heads.abs().min() > 0

    # lm-eval, the README's recipe on the saved folder: its bits per byte are the package's perplexity metric
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={run},trust_remote_code=True,max_length={MAX_LENGTH}",
        tasks=["zpx_pydoc"],
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        limit=DOCUMENTS,
        batch_size=1,
        device="cuda" if torch.cuda.is_available() else "cpu",  # HFLM's default is cuda
        log_samples=False,
    )
    bits = results["results"]["zpx_pydoc"]["bits_per_byte,none"]
    expected = ablation_metric(trained, heldout_documents())
    assert math.isclose(bits, expected["bits_per_byte"], rel_tol=1e-5)
    assert bits < math.log2(VOCAB_SIZE)  # better than uniform over the bytes: a trained model was scored

    # push; what the Hub holds loads by itself (remote code, where zpx_hf cannot be imported): the trained model
    repo = push(run, f"{local_hub.user}/zpx-from-llama")
    assert not list(repo.glob("checkpoint-*")) and not list(repo.glob("_*"))
    card = (repo / "README.md").read_text()
    assert "| `init_from` | `zpx` |" in card and str(tmp_path) not in card  # the card names no local path
    ids = torch.tensor([[BOS_ID, *text_to_ids("The if statement")]])
    pushed = run_remote_code(repo, "AutoModelForCausalLM", {"input_ids": ids}, tmp_path)  # a Python without zpx_hf
    with torch.no_grad():
        assert torch.equal(pushed["output"], trained(input_ids=ids).logits)
