"""The tokenizer's BOS behaviour is what it reports, before and after a reload, and it loads from a model checkpoint
without the package and without an interactive prompt; lm-eval's rolling log-likelihood (when lm_eval is installed)
then scores every byte once with no log p(<s> | <s>) term."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch
from conftest import make_tiny_config
from transformers import AutoModelForCausalLM, AutoTokenizer

import zpx_hf  # noqa: F401
from zpx_hf.tokenization_bytes import BOS_ID, build_byte_tokenizer, text_to_ids

TEXT = "geometric attention"


def test_bos_behaviour_matches_what_the_tokenizer_reports(tmp_path):
    built = build_byte_tokenizer()
    built.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    with_bos = AutoTokenizer.from_pretrained(tmp_path, add_bos_token=True)
    for tokenizer, reports in ((built, False), (reloaded, False), (with_bos, True)):
        assert tokenizer.add_bos_token is reports
        expected = ([BOS_ID] if reports else []) + text_to_ids(TEXT)
        assert tokenizer(TEXT)["input_ids"] == expected
        assert tokenizer(TEXT, add_special_tokens=False)["input_ids"] == text_to_ids(TEXT)


_LOAD_WITHOUT_PACKAGE = textwrap.dedent(
    """
    import json, sys
    sys.modules["zpx_hf"] = None  # the package cannot be imported here
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    path, text = sys.argv[1], sys.argv[2]
    ids = {
        "auto_trust_remote_code": AutoTokenizer.from_pretrained(path, trust_remote_code=True)(text)["input_ids"],
        "fast": PreTrainedTokenizerFast.from_pretrained(path)(text)["input_ids"],
    }
    print("IDS=" + json.dumps(ids))
    """
)


def test_checkpoint_tokenizer_loads_without_the_package_and_without_a_prompt(tmp_path):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(make_tiny_config("zpx")).save_pretrained(tmp_path)
    build_byte_tokenizer().save_pretrained(tmp_path)
    assert "auto_map" in json.loads((tmp_path / "config.json").read_text())  # remote-code model beside it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    completed = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_PACKAGE, str(tmp_path), TEXT],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,  # a prompt would read EOF here; its text is what must not appear
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "[y/N]" not in completed.stdout + completed.stderr
    line = next(line for line in completed.stdout.splitlines() if line.startswith("IDS="))
    for ids in json.loads(line.removeprefix("IDS=")).values():
        assert ids == text_to_ids(TEXT)
