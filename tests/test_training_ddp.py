"""Multi-process training on CPU (gloo) through `accelerate launch`: each config does what its name says.

- ddp_cpu.yaml: 2-process DDP trains and saves a loadable checkpoint.
- fsdp_cpu.yaml: 2-process FSDP2; each rank holds about half of the parameters, and the saved checkpoint is one
  full safetensors state dict equal bit for bit to the gathered trained weights, which reloads bit-exact.
- without CUDA, any launch trains on the CPUs (a GPU config warns; DeepSpeed is refused).
"""

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_close_eps
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from zpx_hf_train.config import ConfigError
from zpx_hf_train.distributed import configure_launch, state_dict_digest
from zpx_hf_train.train import load_run_config, run_training

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = Path(sys.executable).with_name("accelerate")
MICRO = str(ROOT / "configs" / "test-micro.yaml")
REFERENCE_FLAGS = ("--tasks", "mqar", "--eval_strategy", "no", "--per_device_train_batch_size", "16")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU/gloo launch path is for machines without CUDA")


def _free_ports(count: int = 1) -> list[int]:
    """Ports free now, distinct from each other (all held open while chosen): launches started together must not
    be handed the same port before the first binds it."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _command(config: str, output_dir: Path, *flags: str, launch: tuple[str, ...] = ()) -> list[str]:
    """`accelerate launch --config_file configs/accelerate/<config> [launch...] -m zpx_hf_train.train` on the
    micro config, with `flags` after it; the port is a free one unless `launch` names one."""
    launcher = (
        [str(ACCELERATE), "launch"] if ACCELERATE.exists() else [sys.executable, "-m", "accelerate.commands.launch"]
    )
    port = () if "--main_process_port" in launch else ("--main_process_port", str(_free_ports()[0]))
    return [
        *launcher,
        *("--config_file", str(ROOT / "configs" / "accelerate" / config), *port, *launch),
        *("-m", "zpx_hf_train.train", str(ROOT / "configs" / "test-micro.yaml")),
        *("--output_dir", str(output_dir), "--tasks", "mqar", "--eval_strategy", "no", *flags),
    ]


LAUNCH_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _launch(config: str, output_dir: Path, *flags: str, timeout: int = 300) -> subprocess.CompletedProcess:
    command = _command(config, output_dir, *flags)
    cwd = output_dir.parent
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=LAUNCH_ENV, cwd=cwd)


@pytest.mark.slow
@NO_CUDA
def test_two_process_ddp_on_cpu_trains_and_saves_a_loadable_checkpoint(tmp_path):
    output_dir = tmp_path / "ddp"
    result = _launch("ddp_cpu.yaml", output_dir, "--max_steps", "4", "--save_steps", "4")
    assert result.returncode == 0, result.stderr[-4000:]

    details = json.loads((output_dir / "metrics.json").read_text())["details"]
    assert details["world_size"] == 2 and details["effective_batch"] == 16 and details["steps"] == 4
    assert details["parallelism"] == "cpu-ddp" and details["machines"] == 1
    assert details["parameters_per_rank"] == [details["parameters"]] * 2  # DDP: every rank holds everything
    state = json.loads((output_dir / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["log_history"][0]["loss"] > 0

    model = AutoModelForCausalLM.from_pretrained(output_dir, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    with torch.no_grad():
        logits = model(**tokenizer("aXbY|a", return_tensors="pt")).logits
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.slow
@NO_CUDA
def test_two_process_ddp_trains_its_tokenizer_once_and_tokenizes_the_corpus_without_deadlock(tmp_path):
    """A trained tokenizer under two processes: every process takes process 0's (a collective) before process 0
    tokenizes the corpus under `main_process_first` (a collective inside that barrier would hang the run)."""
    output_dir = tmp_path / "ddp_unigram"
    spec = json.dumps({"train": "unigram", "vocab_size": 400})
    flags = ("--max_steps", "2", "--save_strategy", "no", "--tokenizer", spec)
    result = _launch("ddp_cpu.yaml", output_dir, *flags, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    model = AutoModelForCausalLM.from_pretrained(output_dir, trust_remote_code=True)
    assert model.config.vocab_size == len(tokenizer) and len(tokenizer) != 260  # the trained one, not bytes
    assert json.loads((output_dir / "metrics.json").read_text())["details"]["world_size"] == 2


@pytest.mark.slow
@NO_CUDA
def test_two_process_fsdp_on_cpu_shards_and_saves_one_full_state_dict(tmp_path):
    output_dir = tmp_path / "fsdp"
    result = _launch("fsdp_cpu.yaml", output_dir, "--max_steps", "3", "--save_strategy", "no")
    assert result.returncode == 0, result.stderr[-4000:]

    details = json.loads((output_dir / "metrics.json").read_text())["details"]
    assert details["parallelism"] == "cpu-fsdp" and details["world_size"] == 2 and details["steps"] == 3
    total, per_rank = details["parameters"], details["parameters_per_rank"]
    assert len(per_rank) == 2 and sum(per_rank) >= total  # FSDP2 pads a dim-0 shard by at most one row
    for held in per_rank:
        assert abs(held - total / 2) < 0.02 * total, per_rank  # each rank holds about half

    saved = load_file(output_dir / "model.safetensors")
    reloaded = AutoModelForCausalLM.from_pretrained(output_dir).state_dict()
    assert not any("_fsdp" in name or "module." in name for name in saved)  # plain names, full shapes
    for name, tensor in saved.items():
        assert tensor.shape == reloaded[name].shape, name
    digest = details["saved_state_dict"]
    common = set(saved) - set(digest["only_in_file"])
    assert len(common) >= len(saved) - 1 and not digest["only_in_gather"]  # at most a tied lm_head differs
    # bit-exact: the gathered trained weights (hashed in the training process) = the file = the reloaded model
    assert state_dict_digest(saved, common) == digest["sha256"]
    assert state_dict_digest(reloaded, common) == digest["sha256"]
    for name in digest["only_in_file"]:
        torch.testing.assert_close(reloaded[name], saved[name], atol=0, rtol=0)
    assert all(torch.isfinite(t).all() for t in saved.values())


def _two_machines(tmp_path: Path, output: str, *flags: str, port: int | None = None) -> list[subprocess.Popen]:
    """ddp_cpu.yaml started as machines 0 and 1 of two (one process each, main process on 127.0.0.1)."""
    port, machines = str(port or _free_ports()[0]), []
    for rank in ("0", "1"):
        launch = ("--num_machines", "2", "--num_processes", "2", "--machine_rank", rank)
        launch += ("--main_process_ip", "127.0.0.1", "--main_process_port", port)
        command = _command("ddp_cpu.yaml", tmp_path / output, *flags, launch=launch)
        with open(tmp_path / f"{output}{rank}.log", "w") as log:  # the process writes through its own copy
            machines.append(
                subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=LAUNCH_ENV, cwd=tmp_path)
            )
    return machines


def _finish(tmp_path: Path, output: str, machines: list[subprocess.Popen]) -> None:
    for rank, machine in enumerate(machines):
        assert machine.wait(timeout=300) == 0, (tmp_path / f"{output}{rank}.log").read_text()[-4000:]


def _losses(log_history: list[dict]) -> list[float]:
    return [entry["loss"] for entry in log_history if "loss" in entry]


@pytest.mark.slow
@NO_CUDA
def test_two_machines_train_as_one_machine_with_the_same_global_batch(tmp_path):
    """ddp_cpu.yaml as two machines of one process each (`--num_machines 2`, ranks 0 and 1, main process on
    127.0.0.1; one host, the output folder shared as on a shared filesystem): each machine reads its own half of
    every global batch of 2 x 8 rows, so the run is the one-process run with a batch of 16, up to rounding."""
    flags = ("--max_steps", "4", "--logging_steps", "1", "--save_steps", "4")
    machines = _two_machines(tmp_path, "two", *flags)
    # meanwhile, the reference: one machine, one process, the same global batch
    one = run_training(load_run_config(MICRO, ["--output_dir", str(tmp_path / "one"), *flags, *REFERENCE_FLAGS]))
    _finish(tmp_path, "two", machines)

    details = json.loads((tmp_path / "two" / "metrics.json").read_text())["details"]
    assert details["world_size"] == 2 and details["machines"] == 2 and details["effective_batch"] == 16
    state = json.loads((tmp_path / "two" / "checkpoint-4" / "trainer_state.json").read_text())
    losses, reference = _losses(state["log_history"]), _losses(one["trainer"].state.log_history)
    assert len(losses) == len(reference) == 4
    # same rows, same updates: a loss differs only by the summation order of 2 x 8 rows against 16 (a machine
    # that read the other's shard, or the whole batch, gives another loss from the first step on)
    for step, (loss, expected) in enumerate(zip(losses, reference, strict=True), start=1):
        assert abs(loss - expected) <= 64 * torch.finfo(torch.float32).eps * expected, (step, losses, reference)
    trained = load_file(tmp_path / "two" / "model.safetensors")
    for name, tensor in load_file(tmp_path / "one" / "model.safetensors").items():
        assert_close_eps(trained[name], tensor, ulps=256)


@pytest.mark.slow
@NO_CUDA
def test_two_machines_stream_the_shards_of_two_processes(tmp_path):
    """With `data.streaming`, each process streams the shard of its rank (`split_dataset_by_node`; that the
    shards are disjoint and complete is `tests/test_data_pipeline.py`'s): two machines of one process each train
    as one machine's two processes do, step for step, and each saves its own stream position."""
    from zpx_hf_train.data import DataArguments

    if "streaming" not in {f.name for f in dataclasses.fields(DataArguments)}:
        pytest.skip("`data.streaming` does not exist yet in DataArguments (it comes with the data pipeline)")
    flags = ("--streaming", "true", "--train_examples_per_task", "0", "--max_eval_blocks", "4")
    flags += ("--shuffle_buffer", "8", "--per_device_train_batch_size", "4", "--max_steps", "4")
    flags += ("--logging_steps", "1", "--save_steps", "4")
    two_port, one_port = _free_ports(2)
    machines = _two_machines(tmp_path, "two", *flags, port=two_port)
    command = _command("ddp_cpu.yaml", tmp_path / "one", *flags, launch=("--main_process_port", str(one_port)))
    one = subprocess.run(command, capture_output=True, text=True, timeout=300, env=LAUNCH_ENV, cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-4000:]
    _finish(tmp_path, "two", machines)

    histories = []
    for output in ("one", "two"):
        checkpoint = tmp_path / output / "checkpoint-4"
        histories.append(_losses(json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]))
        positions = [(checkpoint / f"data_stream_state-rank{rank}.json").read_text() for rank in (0, 1)]
        assert positions[0] != positions[1]  # two streams, each where its process stopped
    assert len(histories[1]) == 4
    for loss, expected in zip(*reversed(histories), strict=True):
        assert abs(loss - expected) <= 64 * torch.finfo(torch.float32).eps * expected, histories


@NO_CUDA
def test_without_cuda_a_launch_trains_on_cpus_and_warns_unless_the_gpus_are_hidden(monkeypatch, capsys):
    # the environment `accelerate launch` gives rank 0 of ddp_gpu.yaml / fsdp.yaml / ddp_cpu.yaml (MULTI_GPU launcher)
    from zpx_hf_train import distributed

    monkeypatch.setattr(distributed, "_warned_cpu_launch", [])
    monkeypatch.setattr(distributed, "_cpu_fsdp", {})
    for name in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # ddp_cpu.yaml's gpu_ids, exported by accelerate < 1.16 (and >= 1.16 where torch sees an accelerator): silent
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1,-1")
    assert configure_launch() == "cpu-ddp" and os.environ["ACCELERATE_USE_CPU"] == "true"
    assert capsys.readouterr().err == ""
    # nothing hidden (ddp_gpu.yaml, or any config under accelerate >= 1.16 without a GPU): trains, warns once
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert configure_launch() == "cpu-ddp" and configure_launch() == "cpu-ddp"
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "2-process launch trains on the CPUs with gloo (DDP)" in err
    assert "CUDA_VISIBLE_DEVICES=-1" in err
    # fsdp.yaml: FSDP2 on the CPUs, sharded by shard_model
    monkeypatch.setattr(distributed, "_warned_cpu_launch", [])
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert configure_launch() == "cpu-fsdp" and distributed.cpu_fsdp_requested()
    assert "(FSDP2)" in capsys.readouterr().err
    # DeepSpeed cannot run on CPUs: refused, naming the CPU configs
    monkeypatch.setattr(distributed, "_cpu_fsdp", {})
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigError, match="DeepSpeed needs CUDA.*ddp_cpu.yaml"):
        configure_launch()
