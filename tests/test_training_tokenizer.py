"""`data.tokenizer`: the byte tokenizer (default, unchanged ids), a trained BPE / unigram and a local or cached
tokenizer folder, each trained end to end, saved, reloaded through AutoTokenizer / AutoModelForCausalLM
(trust_remote_code) and generating; documents separated by the tokenizer's BOS/EOS; the recall tasks written in
its tokens; held-out bits per byte over the scored text's bytes; lm-eval scoring with the saved tokenizer; and the
config errors, each one line naming the key."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from helpers_training import SMALL
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from zpx_hf.tokenization_bytes import BOS_ID, build_byte_tokenizer, ids_to_text, text_to_ids
from zpx_hf_train.config import ConfigError
from zpx_hf_train.data import DataArguments, build_datasets
from zpx_hf_train.data_pipeline import pack_rows
from zpx_hf_train.data_tasks import pack_documents, pydoc_documents, split_documents, task_examples, text_dataset
from zpx_hf_train.tokenizer import TokenizerSpec, document_markers, train_tokenizer
from zpx_hf_train.train import load_run_config, run_training
from zpx_hf_train.train import main as train_main

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "configs" / "test-micro.yaml"
BPE = {"train": "bpe", "vocab_size": 400}
EOT = "<|endoftext|>"

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py


def ascii_documents(count: int = 60) -> list[str]:
    """Real text (CPython's pydoc topics), ASCII only: every decoded byte count below is exact."""
    return [doc for doc in pydoc_documents() if doc.isascii()][:count]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in ascii_documents()))
    return path


def gpt2_style_folder(folder: Path) -> Path:
    """A tokenizer folder as GPT-2's: one `<|endoftext|>` that is both BOS and EOS, no pad token."""
    trained = train_tokenizer(TokenizerSpec("train", algorithm="bpe", vocab_size=300), ascii_documents(), 128)
    backend = trained.backend_tokenizer
    backend.add_special_tokens([EOT])
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=EOT, eos_token=EOT).save_pretrained(folder)
    return folder


def _write(tmp_path: Path, **data) -> str:
    raw = yaml.safe_load(MICRO.read_text())
    raw["data"].update(data)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


# ---- the byte tokenizer stays what it was ------------------------------------------------------------------


def test_byte_tokenizer_text_blocks_equal_the_byte_ids_even_for_literal_special_tokens():
    documents = ["plain text", "a literal <s> and </s> and <pad> are text", "é ü 中文 bytes"] * 20
    expected = pack_documents(documents, 32)  # the byte ids (text_to_ids), no tokenizer call
    assert expected[0][:3] == [BOS_ID, *text_to_ids("pl")]
    assert pack_documents(documents, 32, tokenizer=build_byte_tokenizer()) == expected
    data = DataArguments(max_train_blocks=8, max_eval_blocks=2, tasks=["mqar"], train_examples_per_task=4)
    built = build_datasets(data)
    train_docs = split_documents(pydoc_documents(), data.heldout_fraction, data.split_seed)[0]
    assert built["train"]["input_ids"][:8] == pack_documents(train_docs, data.seq_len, 8)
    assert built["heldout_bytes"] is None and len(built["tokenizer"]) == 260
    assert built["description"][-1].startswith("tokenizer: byte-level")


# ---- each kind, end to end ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["bpe", "unigram", "folder"])
def trained(request, corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "folder":
        spec = str(gpt2_style_folder(root / "gpt2-style"))
    else:
        spec = json.dumps({**BPE, "train": request.param})
    flags = [*SMALL, "--output_dir", str(root / "out"), "--text_source", str(corpus), "--tokenizer", spec]
    flags += ["--tasks", "mqar", "selective_copy", "--eval_strategy", "no", "--packing", "true"]
    return request.param, run_training(load_run_config(str(MICRO), flags))


def test_each_tokenizer_trains_saves_reloads_and_generates(trained, corpus):
    kind, result = trained
    out = Path(result["output_dir"])
    tokenizer = result["datasets"]["tokenizer"]
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded.get_vocab() == tokenizer.get_vocab() and (out / "tokenizer.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == len(reloaded) == (400 if kind != "folder" else 301)
    assert [config["bos_token_id"], config["eos_token_id"]] == [reloaded.bos_token_id, reloaded.eos_token_id]
    assert config["pad_token_id"] == reloaded.pad_token_id  # None for the GPT-2 style folder: no padding row
    # the training text is the corpus in this tokenizer's tokens, documents between its markers
    start, end = document_markers(reloaded)
    assert (start, end) == (([301 - 1], []) if kind == "folder" else ([1], [2]))
    train_docs = split_documents([json.loads(line)["text"] for line in corpus.read_text().splitlines()], 0.1, 0)[0]
    heldout = result["datasets"]["heldout"]["input_ids"][0]
    text = reloaded.decode(result["datasets"]["train"]["input_ids"][0], skip_special_tokens=True)
    assert text[:200] in "".join(train_docs) and heldout.count(start[0] if start else end[0]) >= 1
    # the recall tasks the run trained and evaluated are written in this tokenizer's tokens, the same text as bytes
    for task, rows in result["datasets"]["tasks"].items():
        params = {"mqar": {"num_pairs": 4}, "selective_copy": {"num_tokens": 4, "num_positions": 16}}[task]
        for row, byte_row in zip(rows, task_examples(task, len(rows), 1, 128, **params)):
            real = [t for t, m in zip(row["input_ids"], row["attention_mask"]) if m]
            assert reloaded.decode(real, skip_special_tokens=True) == ids_to_text(byte_row["input_ids"])
    # reload the model with its remote code and generate with the saved tokenizer
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    prompt = AutoTokenizer.from_pretrained(out, add_bos_token=True)("The if statement", return_tensors="pt")
    assert prompt["input_ids"][0, 0] == (start or end)[0]
    with torch.no_grad():
        expected = result["model"].eval()(**prompt).logits
        torch.testing.assert_close(model(**prompt).logits, expected, rtol=0, atol=0)
    pad = reloaded.pad_token_id if reloaded.pad_token_id is not None else reloaded.eos_token_id
    generated = model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=pad)
    assert isinstance(reloaded.decode(generated[0, prompt["input_ids"].shape[1] :]), str)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 8 or generated[0, -1] == reloaded.eos_token_id
    card = (out / "README.md").read_text()
    name = {"bpe": "byte-level BPE trained", "unigram": "byte-level UNIGRAM trained", "folder": "`gpt2-style`"}[kind]
    assert f"# tokenizer: {name}" in card and f"Tokenizer: {name}" in card and f"- tokenizer: {name}" in card
    assert "held-out perplexity (per token)" in card and str(out.parent) not in card


def test_heldout_bits_per_byte_count_the_scored_text_bytes(trained):
    _, result = trained
    heldout, tokenizer = result["datasets"]["heldout"], result["datasets"]["tokenizer"]
    metrics = result["metrics"]["heldout"]
    # independent count: every scored (non-special) token's own bytes, from its vocabulary string (ASCII corpus)
    specials = set(tokenizer.all_special_ids)
    expected = sum(
        len(tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(token)]).encode("utf-8"))
        for row in heldout["input_ids"]
        for token in row[1:]
        if token not in specials
    )
    assert metrics["bytes"] == expected == result["datasets"]["heldout_bytes"]
    assert math.isclose(metrics["bits_per_byte"], metrics["loss"] * metrics["tokens"] / math.log(2) / expected)


def test_packed_rows_restart_at_every_document_of_the_tokenizer(trained):
    _, result = trained
    tokenizer = result["datasets"]["tokenizer"]
    start, end = document_markers(tokenizer)
    rows = result["datasets"]["train"]
    assert "position_ids" in rows.column_names
    for ids, positions in zip(rows["input_ids"][:6], rows["position_ids"][:6]):
        restarts = [i for i, p in enumerate(positions) if p == 0 and i > 0]
        # every restart is a document start: its marker, or just after an end marker (text, then a task example)
        for i in restarts:
            assert ids[i] == start[0] if start else ids[i - 1] == end[0] or i == restarts[-1]


def test_pack_rows_split_documents_after_the_end_marker_when_there_is_no_start(tmp_path):
    folder = gpt2_style_folder(tmp_path / "g")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.bos_token = None  # an EOS-only tokenizer: documents are `text <eos>`
    assert document_markers(tokenizer) == ([], [300])
    documents = ["first document here", "second one", "a third document that is longer than the others"]
    blocks = text_dataset(documents * 4, 24, tokenizer=tokenizer)
    packed = pack_rows(blocks, 24, tokenizer)
    for ids, positions, labels in zip(packed["input_ids"], packed["position_ids"], packed["labels"]):
        for i in range(1, 24):
            if ids[i - 1] == 300:  # after an end marker a new document begins: position 0, label ignored
                assert positions[i] == 0 and labels[i] == -100


@pytest.mark.parametrize("trained", ["bpe"], indirect=True)
def test_lora_reads_its_data_with_the_base_models_tokenizer(trained, tmp_path):
    from zpx_hf_train.finetune_lora import load_finetune_config, run_finetune

    raw = yaml.safe_load((ROOT / "configs" / "zpx-tiny-lora.yaml").read_text())
    raw.update(base_model=trained[1]["output_dir"], merged_output_dir=str(tmp_path / "merged"))
    raw["data"].update(seq_len=64, train_examples_per_task=8, eval_examples_per_task=4, mqar_num_pairs=4)
    raw["training"].update(
        output_dir=str(tmp_path / "adapter"), max_steps=1, per_device_train_batch_size=4, disable_tqdm=True,
        eval_strategy="no", save_strategy="no",
    )  # fmt: skip
    path = tmp_path / "lora.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = run_finetune(load_finetune_config(str(path)))
    tokenizer = AutoTokenizer.from_pretrained(trained[1]["output_dir"])
    rows = result["datasets"]["tasks"]["mqar"]
    for row, byte_row in zip(rows, task_examples("mqar", len(rows), 1, 64, num_pairs=4)):
        real = [t for t, m in zip(row["input_ids"], row["attention_mask"]) if m]
        assert tokenizer.decode(real, skip_special_tokens=True) == ids_to_text(byte_row["input_ids"])
    raw["data"]["tokenizer"] = BPE
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"`data\.tokenizer` = .*the base model's own tokenizer"):
        load_finetune_config(str(path))


def test_a_corpus_too_small_for_vocab_size_gives_a_smaller_model_and_says_so(tmp_path, capsys):
    corpus = tmp_path / "small.txt"
    paragraph = "Paragraph {}: the quick brown fox jumps over the lazy dog. " * 4
    corpus.write_text("\n\n".join(paragraph.format(*[i] * 4) for i in range(30)))
    flags = [*SMALL, "--output_dir", str(tmp_path / "out"), "--text_source", str(corpus), "--tasks", "mqar"]
    flags += ["--tokenizer", json.dumps({"train": "bpe", "vocab_size": 5000}), "--eval_strategy", "no"]
    run = load_run_config(str(MICRO), flags)
    assert run.model_config.vocab_size == 5000  # what the YAML asked, until the tokenizer is trained
    result = run_training(run)
    learned = len(result["datasets"]["tokenizer"])
    assert learned < 5000 and f"data.tokenizer learned {learned} tokens" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == learned
    assert result["model"].get_input_embeddings().weight.shape[0] == learned
    raw = yaml.safe_load(MICRO.read_text())  # the same, with model.vocab_size: 5000 written out, stops the run
    raw["model"]["vocab_size"] = 5000
    path = tmp_path / "explicit.yaml"
    path.write_text(yaml.safe_dump(raw))
    flags[flags.index("--output_dir") + 1] = str(tmp_path / "out2")
    with pytest.raises(ConfigError, match=r"`model\.vocab_size` = 5000: `data\.tokenizer` learned only"):
        run_training(load_run_config(str(path), flags))


# ---- recall tasks in any tokenizer's tokens ----------------------------------------------------------------


@pytest.mark.parametrize("task", ["mqar", "passkey", "selective_copy"])
def test_recall_tasks_are_the_same_text_in_trained_tokens(task):
    tokenizer = train_tokenizer(TokenizerSpec("train", algorithm="bpe", vocab_size=400), ascii_documents(), 128)
    params = {"mqar": {"num_pairs": 4}, "passkey": {"length": 128}, "selective_copy": {"num_tokens": 4}}[task]
    byte_rows = task_examples(task, 8, 3, 128, **params)
    rows = task_examples(task, 8, 3, 128, tokenizer=tokenizer, **params)
    for byte_row, row in zip(byte_rows, rows):
        real = [t for t, m in zip(row["input_ids"], row["attention_mask"]) if m]
        assert real[0] == tokenizer.bos_token_id and len(row["input_ids"]) == 128
        assert tokenizer.decode(real, skip_special_tokens=True) == ids_to_text(byte_row["input_ids"])
        answer = [t for t, a in zip(row["input_ids"], row["answer_mask"]) if a]
        byte_answer = [t for t, a in zip(byte_row["input_ids"], byte_row["answer_mask"]) if a]
        assert tokenizer.decode(answer) == ids_to_text(byte_answer) and answer
        assert [label for label in row["labels"] if label != -100] == answer


# ---- lm-eval with the saved tokenizer ----------------------------------------------------------------------


@pytest.mark.slow
def test_lm_eval_scores_a_trained_bpe_checkpoint_with_its_tokenizer(corpus, tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    flags = [*SMALL, "--output_dir", str(tmp_path / "out"), "--text_source", str(corpus), "--tasks", "mqar"]
    result = run_training(load_run_config(str(MICRO), [*flags, "--tokenizer", json.dumps(BPE)]))
    model = AutoModelForCausalLM.from_pretrained(result["output_dir"], trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(result["output_dir"])
    harness = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, max_length=128)
    document = "The if statement is used for conditional execution."
    request = Instance("loglikelihood_rolling", {}, (document,), 0)
    (scored,) = harness.loglikelihood_rolling([request], disable_tqdm=True)
    ids = [tokenizer.bos_token_id, *tokenizer(document, add_special_tokens=False)["input_ids"]]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double().log_softmax(-1)
    expected = sum(logits[t - 1, ids[t]].item() for t in range(1, len(ids)))
    assert len(ids) < 40 and math.isclose(scored, expected, rel_tol=1e-5)


# ---- config errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "model", "message"),
    [
        ({"tokenizer": {"train": "bpe"}}, {}, r"`data\.tokenizer\.vocab_size` = None must be a whole number >= 260"),
        ({"tokenizer": {"train": "bpe", "vocab_size": 100}}, {}, r"`data\.tokenizer\.vocab_size` = 100"),
        ({"tokenizer": {"train": "wordpiece", "vocab_size": 400}}, {}, r"`data\.tokenizer\.train` = 'wordpiece'"),
        ({"tokenizer": {**BPE, "vocab": 3}}, {}, r"unknown key `data\.tokenizer\.vocab`"),
        ({"tokenizer": {**BPE, "train": "unigram", "min_frequency": 2}}, {}, r"`data\.tokenizer\.min_frequency`"),
        ({"tokenizer": "/no/such/tokenizer"}, {}, r"`data\.tokenizer` = '/no/such/tokenizer': not a local folder"),
        ({"tokenizer": "nobody/no-such-model"}, {}, r"`data\.tokenizer` = 'nobody/no-such-model': not a local"),
        ({"tokenizer": 7}, {}, r"`data\.tokenizer` = 7 has the wrong type"),
        ({"tokenizer": BPE}, {"vocab_size": 512}, r"`model\.vocab_size` = 512 conflicts with `data\.tokenizer`"),
        ({}, {"vocab_size": 300}, r"`model\.vocab_size` = 300 conflicts with `data\.tokenizer` \(260 tokens\)"),
        ({"tokenizer": BPE, "text_source": "none"}, {}, r"`data\.tokenizer` trains on the text corpus"),
        ({"tokenizer": BPE}, {"init_from": "/x"}, r"`model\.init_from` = '/x' with `data\.tokenizer` trained"),
    ],
)
def test_tokenizer_config_errors_name_the_key(tmp_path, data, model, message):
    raw = yaml.safe_load(MICRO.read_text())
    raw["data"].update(data)
    raw["model"].update(model)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=message) as error:
        load_run_config(str(path))
    assert "\n" not in str(error.value)


def test_folder_tokenizer_conflicting_special_ids_and_cli_error(tmp_path, capsys):
    folder = gpt2_style_folder(tmp_path / "g")
    raw = yaml.safe_load(MICRO.read_text())
    raw["data"]["tokenizer"] = str(folder)
    raw["model"]["bos_token_id"] = 1
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"`model\.bos_token_id` = 1 conflicts with `data\.tokenizer`'s bos_token_id"):
        load_run_config(str(path))
    code = train_main([str(MICRO), "--tokenizer", '{"train": "bpe", "vocab_size": 9}'])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "data.tokenizer.vocab_size" in err


def test_hub_id_from_the_local_cache_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants

    # the cache layout huggingface_hub leaves after downloading a model repo's tokenizer: files under the revision's
    # snapshot (with the model's config.json, which AutoTokenizer reads: transformers 5.17 cannot load a
    # tokenizer-only repo offline) and `refs/main` naming it
    repo, revision = tmp_path / "hub" / "models--someone--tok", "0" * 40
    gpt2_style_folder(repo / "snapshots" / revision)
    (repo / "snapshots" / revision / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    run = load_run_config(_write(tmp_path, tokenizer="someone/tok"))
    assert run.model_config.vocab_size == 301 and run.model_config.eos_token_id == 300
    assert run.model_config.bos_token_id == 300 and run.model_config.pad_token_id is None


# ---- resume and several processes --------------------------------------------------------------------------


def test_resumed_run_keeps_the_tokenizer_its_checkpoint_saved(corpus, tmp_path, capsys):
    from helpers_training import StopAt

    data = tmp_path / "docs.jsonl"
    data.write_text(corpus.read_text())
    out = tmp_path / "out"
    flags = [*SMALL, "--output_dir", str(out), "--text_source", str(data), "--tokenizer", json.dumps(BPE)]
    flags += ["--tasks", "mqar", "--eval_strategy", "no", "--max_steps", "4", "--save_strategy", "steps"]
    flags += ["--save_steps", "2"]
    run_training(load_run_config(str(MICRO), flags), callbacks=[StopAt(2)])
    saved = AutoTokenizer.from_pretrained(out / "checkpoint-2").get_vocab()
    # the corpus changed since (same path): training again would give another vocabulary than the weights learned
    data.write_text("".join(json.dumps({"text": doc.upper()}) + "\n" for doc in ascii_documents()))
    capsys.readouterr()
    resumed = run_training(load_run_config(str(MICRO), [*flags, "--resume_from_checkpoint", "last"]))
    assert "data.tokenizer: reusing the tokenizer saved in checkpoint-2" in capsys.readouterr().out
    assert resumed["trainer"].state.global_step == 4
    assert AutoTokenizer.from_pretrained(out).get_vocab() == saved == resumed["datasets"]["tokenizer"].get_vocab()


BROADCAST = """
import sys
import torch.distributed as dist
from zpx_hf_train.distributed import process_zero_value
rank = int(sys.argv[2])
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=rank, world_size=2)
print(process_zero_value(f"trained by process {rank}"))
dist.destroy_process_group()
"""


@pytest.mark.slow  # two Pythons importing torch and the package
def test_every_process_takes_process_zeros_trained_tokenizer(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", BROADCAST, str(tmp_path / "rendezvous"), str(rank)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=120)[0].strip().splitlines()[-1] for process in ranks]
    assert outputs == ["trained by process 0", "trained by process 0"]


def test_a_trained_tokenizer_is_process_zeros(monkeypatch):
    import zpx_hf_train.tokenizer

    zero = train_tokenizer(TokenizerSpec("train", algorithm="unigram", vocab_size=300), ascii_documents(), 128)
    monkeypatch.setattr(zpx_hf_train.tokenizer, "process_zero_value", lambda text: zero.backend_tokenizer.to_str())
    tokenizer = train_tokenizer(TokenizerSpec("train", algorithm="unigram", vocab_size=400), ascii_documents(), 128)
    assert tokenizer.get_vocab() == zero.get_vocab() and len(tokenizer) == 300
