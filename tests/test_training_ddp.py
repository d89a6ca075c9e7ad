"""Acceptance: a 2-process `accelerate launch` DDP run on CPU (gloo) trains and saves a loadable checkpoint."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = Path(sys.executable).with_name("accelerate")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU/gloo launch path is for machines without CUDA")
def test_two_process_ddp_on_cpu_trains_and_saves_a_loadable_checkpoint(tmp_path):
    output_dir = tmp_path / "ddp"
    launcher = [str(ACCELERATE), "launch"]
    if not ACCELERATE.exists():
        launcher = [sys.executable, "-m", "accelerate.commands.launch"]
    command = [
        *launcher,
        *("--config_file", str(ROOT / "configs" / "accelerate" / "ddp_cpu.yaml")),
        *("--main_process_port", str(_free_port())),
        str(ROOT / "training" / "train.py"),
        str(ROOT / "configs" / "test-micro.yaml"),
        *("--output_dir", str(output_dir), "--max_steps", "4", "--save_steps", "4", "--tasks", "mqar"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]

    details = json.loads((output_dir / "metrics.json").read_text())["details"]
    assert details["world_size"] == 2 and details["effective_batch"] == 16 and details["steps"] == 4
    state = json.loads((output_dir / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["log_history"][0]["loss"] > 0

    model = AutoModelForCausalLM.from_pretrained(output_dir, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    with torch.no_grad():
        logits = model(**tokenizer("aXbY|a", return_tensors="pt")).logits
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p).all() for p in model.parameters())
