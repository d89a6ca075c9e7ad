"""End-to-end training with Trainer on the micro config: checkpoint contents, offline reload without zpx_hf,
local data files, exact resume, and push_to_hub (through huggingface_hub to `helpers_hub.LocalHub`)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers_training import CountSteps, StopAt
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from zpx_hf_train.config import ConfigError
from zpx_hf_train.train import load_run_config, main, run_training
from zpx_hf_train.trainer import RUN_MARKER, TrainingDivergedError

ROOT = Path(__file__).resolve().parents[1]

MICRO = str(ROOT / "configs" / "test-micro.yaml")

RELOAD_WITHOUT_PACKAGE = """
import sys, json, torch
sys.modules["zpx_hf"] = None  # any import of the package fails: only the checkpoint's code can be used
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tokenizer("The if statement", return_tensors="pt")
with torch.no_grad():
    logits = model(**ids).logits
out = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
new_tokens = out.shape[1] - ids.input_ids.shape[1]
result = {"module": type(model).__module__, "logits": logits[0, -1].tolist(), "new": new_tokens}
with open(sys.argv[2], "w") as f:
    json.dump(result, f)
"""


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("run") / "micro"
    result = run_training(load_run_config(MICRO, ["--output_dir", str(output_dir)]))
    return result


def test_checkpoint_is_self_contained_with_tokenizer_card_and_report(trained):
    out = Path(trained["output_dir"])
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "modeling_zpx.py", "configuration_zpx.py"} <= names
    assert {"tokenizer.json", "tokenizer_config.json", "README.md"} <= names
    assert {"metrics.json", "report.md", "loss_curve.png"} <= names
    assert not list(out.rglob("*.bin")) or all(p.name == "training_args.bin" for p in out.rglob("*.bin"))
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_zpx.ZPXForCausalLM"
    checkpoint = out / "checkpoint-8"
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "tokenizer.json").exists()

    card = (out / "README.md").read_text()
    header = card.split("---")[1]
    expected = ("library_name: transformers", "license: apache-2.0", "- zpx", "- cpython-pydoc-topics", "- perplexity")
    for line in expected:
        assert line in header
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert f"{metrics['heldout']['perplexity']:.3f}" in card
    assert set(metrics["tasks"]) == {"mqar", "passkey", "selective_copy"}
    assert 1.0 < metrics["heldout"]["perplexity"] < 260.0
    assert "${" not in card and "loss_curve.png" in (out / "report.md").read_text()
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    losses = [e["loss"] for e in trained["trainer"].state.log_history if "loss" in e]
    assert losses[-1] < losses[0]
    # the loss curve carries the held-out loss of every evaluation (eval_steps 4 of 8) beside the training loss
    curve = json.loads((out / "metrics.json").read_text())["loss_curve"]
    assert [step for step, _ in curve["eval"]] == [4, 8] and len(curve["train"]) == 4
    assert "model-index:" in header and "type: perplexity" in header


def test_checkpoint_reloads_offline_without_zpx_hf(trained):
    out = trained["output_dir"]
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path(out).parent)}
    report = Path(out).parent / "reload.json"
    result = subprocess.run(
        [sys.executable, "-c", RELOAD_WITHOUT_PACKAGE, out, str(report)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reloaded = json.loads(report.read_text())
    assert "zpx_hf" not in reloaded["module"] and reloaded["new"] == 8
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = trained["trainer"].model.eval()
    with torch.no_grad():
        expected = model(**tokenizer("The if statement", return_tensors="pt")).logits[0, -1]
    torch.testing.assert_close(torch.tensor(reloaded["logits"]), expected, atol=1e-5, rtol=1e-5)


def test_local_text_file_as_training_data(tmp_path):
    corpus = tmp_path / "notes.txt"
    paragraph = "Paragraph {}: the quick brown fox jumps over the lazy dog. " * 3
    corpus.write_text("\n\n".join(paragraph.format(i, i, i) for i in range(40)))
    config = (ROOT / "configs" / "test-micro.yaml").read_text().replace("text_source: pydoc", f"text_source: {corpus}")
    path = tmp_path / "local.yaml"
    path.write_text(config)
    result = run_training(
        load_run_config(str(path), ["--output_dir", str(tmp_path / "out"), "--max_steps", "2", "--tasks", "mqar"])
    )
    assert result["metrics"]["heldout"]["tokens"] > 0
    assert set(result["metrics"]["tasks"]) == {"mqar"}
    card = (tmp_path / "out" / "README.md").read_text()
    assert "- notes.txt" in card and "local `notes.txt`" in card
    assert str(tmp_path) not in card and str(tmp_path) not in (tmp_path / "out" / "report.md").read_text()


def test_resume_from_checkpoint_matches_uninterrupted_run(tmp_path, capsys):
    common = ["--max_steps", "6", "--save_steps", "3", "--logging_steps", "1", "--tasks", "mqar"]
    full = run_training(load_run_config(MICRO, [*common, "--output_dir", str(tmp_path / "full")]))
    interrupted_dir = str(tmp_path / "interrupted")
    stopped = run_training(load_run_config(MICRO, [*common, "--output_dir", interrupted_dir]), callbacks=[StopAt(3)])
    assert stopped["trainer"].state.global_step == 3
    # a kill during the next save left checkpoint-5 without trainer_state.json: resuming skips it and says so
    partial = Path(interrupted_dir) / "checkpoint-5"
    partial.mkdir()
    shutil.copy(Path(interrupted_dir) / "checkpoint-3" / "model.safetensors", partial / "model.safetensors")
    capsys.readouterr()
    steps = CountSteps()
    resumed = run_training(
        load_run_config(MICRO, [*common, "--output_dir", interrupted_dir, "--resume_from_checkpoint", "last"]),
        callbacks=[steps],
    )
    printed = capsys.readouterr()
    assert f"resuming from {Path(interrupted_dir) / 'checkpoint-3'}" in printed.out
    assert "not the newest checkpoint: skipped checkpoint-5 (no trainer_state.json)" in printed.err
    # only the remaining steps were trained: a run that ignored the checkpoint would reach the same weights
    assert resumed["trainer"].state.global_step == 6 and steps.steps == [4, 5, 6]
    reference = full["trainer"].model.state_dict()
    for name, value in resumed["trainer"].model.state_dict().items():
        torch.testing.assert_close(value, reference[name], atol=1e-7, rtol=0, msg=name)
    losses = [e["loss"] for e in full["trainer"].state.log_history if "loss" in e]
    resumed_losses = [e["loss"] for e in resumed["trainer"].state.log_history if "loss" in e]
    assert resumed_losses[-3:] == pytest.approx(losses[-3:], abs=1e-6)


def test_output_dir_of_another_run_is_refused_unless_overwritten(tmp_path):
    out = str(tmp_path / "shared")
    common = ["--output_dir", out, "--max_steps", "2", "--save_steps", "2", "--tasks", "mqar", "--eval_strategy", "no"]
    first = run_training(load_run_config(MICRO, common))
    first_marker = json.loads((Path(out) / RUN_MARKER).read_text())
    first_weights = (Path(out) / "model.safetensors").read_bytes()
    other = [*common, "--mqar_num_pairs", "3"]  # another run: different data
    with pytest.raises(ConfigError, match="`training.output_dir`: .* holds a run of another config"):
        run_training(load_run_config(MICRO, [*other, "--resume_from_checkpoint", "last"]))
    with pytest.raises(ConfigError, match="`training.output_dir`: .* is not empty"):
        run_training(load_run_config(MICRO, other))
    with pytest.raises(ConfigError, match="checkpoint-2 already reached step 2"):  # resuming would train nothing
        run_training(load_run_config(MICRO, [*common, "--resume_from_checkpoint", "last"]))
    assert (Path(out) / "model.safetensors").read_bytes() == first_weights  # nothing was touched
    second = run_training(load_run_config(MICRO, [*other, "--overwrite_output_dir", "true"]))
    assert second["trainer"].state.global_step == 2 and first["trainer"].state.global_step == 2
    assert json.loads((Path(out) / RUN_MARKER).read_text())["fingerprint"] != first_marker["fingerprint"]
    assert sorted(p.name for p in Path(out).glob("checkpoint-*")) == ["checkpoint-2"]
    assert (Path(out) / "model.safetensors").read_bytes() != first_weights


class Poison(TrainerCallback):
    """Makes the LM head non-finite after `step`: the next step's loss and gradients are NaN."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.get_output_embeddings().weight[0, 0] = float("nan")


def test_non_finite_loss_stops_the_run_naming_the_step(tmp_path):
    run = load_run_config(MICRO, ["--output_dir", str(tmp_path / "nan"), "--max_steps", "5", "--logging_steps", "1"])
    with pytest.raises(TrainingDivergedError, match=r"training stopped at step 3: the gradient of `.*` is not finite"):
        run_training(run, callbacks=[Poison(2)])
    assert not (tmp_path / "nan" / "model.safetensors").exists()  # no final model is saved as if it had trained


def push_config_error(tmp_path, capsys, repo_id):
    """The one `config error` line of a pushing run that must stop before training (exit code 2, no model)."""
    out = tmp_path / "push"
    flags = ["--output_dir", str(out), "--max_steps", "2", "--push_to_hub", "--hub_model_id", repo_id]
    assert main([MICRO, *flags, "--tasks", "mqar"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "config error" in line]
    assert len(lines) == 1 and "`training.push_to_hub`" in lines[0] and repo_id in lines[0]
    assert "Traceback" not in err and not (out / "model.safetensors").exists()
    return lines[0]


def test_push_to_hub_without_network_fails_before_training_in_one_line(tmp_path, monkeypatch, capsys):
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    push_config_error(tmp_path, capsys, "someone/zpx-micro")


def test_push_to_hub_refused_by_the_hub_fails_before_training_in_one_line(local_hub, tmp_path, capsys):
    (tmp_path / "hf_home" / "token").unlink()  # not logged in
    assert "401" in push_config_error(tmp_path, capsys, "zpx-tester/zpx-micro")
    assert not local_hub.repos


def test_push_to_hub_uploads_the_self_contained_checkpoint(local_hub, tmp_path, monkeypatch):
    from huggingface_hub import snapshot_download

    monkeypatch.delenv("HF_TOKEN", raising=False)  # restored after the test: the run moves the token there
    (tmp_path / "hf_home" / "token").unlink()  # not logged in: only --hub_token can authorise the upload
    repo_id = f"{local_hub.user}/zpx-micro"
    out = tmp_path / "out"
    run = load_run_config(
        MICRO,
        [
            *("--output_dir", str(out), "--max_steps", "2", "--save_steps", "2", "--tasks", "mqar"),
            *("--push_to_hub", "--hub_model_id", repo_id, "--hub_strategy", "end", "--hub_token", local_hub.token),
            *("--hub_revision", "dev"),  # a branch the run creates before training (`Trainer` would not)
        ],
    )
    run_training(run)
    assert set(local_hub.files(repo_id, "main")) == {".gitattributes"}  # all went to the branch
    # the Hub holds the run folder's files, byte for byte, without the lock / marker ("_*") and checkpoints
    on_hub = local_hub.files(repo_id, "dev")
    local = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    uploaded = {k: v for k, v in local.items() if not k.startswith(("_", "checkpoint-"))}
    assert on_hub == {**uploaded, ".gitattributes": on_hub[".gitattributes"]}
    assert "model.safetensors" in on_hub and "training_args.bin" in on_hub and "modeling_zpx.py" in on_hub
    # the token was used (HF_TOKEN of this process) but is in no saved or uploaded file, pickled or not
    assert not [name for name, data in {**local, **on_hub}.items() if local_hub.token.encode() in data]
    card = on_hub["README.md"].decode()
    assert repo_id in card and "library_name: transformers" in card and "## Evaluation" in card
    # and comes back through the client's download: the model with its remote code, the byte tokenizer
    snapshot = snapshot_download(repo_id, revision="dev")
    model = AutoModelForCausalLM.from_pretrained(snapshot, trust_remote_code=True)
    assert AutoTokenizer.from_pretrained(snapshot).vocab_size == 260
    assert model.config.model_type == "zpx"


def test_pipeline_runs_with_the_network_blocked(tmp_path, monkeypatch):
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access attempted during an offline training run")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    result = run_training(
        load_run_config(MICRO, ["--output_dir", str(tmp_path / "offline"), "--max_steps", "2", "--tasks", "passkey"])
    )
    assert result["trainer"].state.global_step == 2
    assert (tmp_path / "offline" / "model.safetensors").exists()
