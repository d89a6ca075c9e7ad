"""What the README says each client needs where zpx_hf is not installed (remote-code checkpoints): the tokenizer with
`trust_remote_code=False` (or True) and no prompt, PEFT with the family's targets written out, TRL's DPO with
`trust_remote_code=True` (it rebuilds the reference model from the policy's path). Runs in a fresh Python that
cannot import zpx_hf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import make_tiny_config
from transformers import AutoModelForCausalLM

import zpx_hf  # noqa: F401
from zpx_hf.tokenization_bytes import BOS_ID, VOCAB_SIZE, build_byte_tokenizer, text_to_ids

# the README's table, "Where zpx_hf is not installed": what each PEFT method is given there
README_LORA_TARGETS = {
    "zpx": ["q_proj", "v_proj"],
    "pct": ["q_proj.real", "q_proj.imag", "v_proj.real", "v_proj.imag"],
    "versor-hybrid": ["bivector_proj"],  # the only nn.Linear; VersorLinear's LoRA layer lives in the package
}
README_IA3_FEEDFORWARD = {"zpx": ["down_proj"], "pct": ["down_proj.real", "down_proj.imag"]}


def readme_peft_configs(case: str) -> dict[str, tuple[str, dict]]:
    """name -> (PEFT config class, its arguments) as the README writes them for `case`."""
    targets = README_LORA_TARGETS[case]
    configs = {"lora": ("LoraConfig", {"target_modules": targets})}
    if case in README_IA3_FEEDFORWARD:
        feedforward = README_IA3_FEEDFORWARD[case]
        configs["ia3"] = ("IA3Config", {"target_modules": targets + feedforward, "feedforward_modules": feedforward})
        configs["oft"] = ("OFTConfig", {"target_modules": targets, "r": 0, "oft_block_size": 4})
    return configs


TEXT = "geometric attention"

# Every way to load the tokenizer, with the code that does it; `input` records any prompt instead of waiting for one.
_TOKENIZER_SCRIPT = textwrap.dedent(
    """
    import builtins, json, sys
    sys.modules["zpx_hf"] = None  # the package cannot be imported here
    prompts = []

    def no_answer(prompt=""):
        prompts.append(prompt)
        raise EOFError  # what a closed stdin gives; transformers then falls back as it does after its timeout

    builtins.input = no_answer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    text, report = sys.argv[1], {}
    for path in sys.argv[2:]:
        for name, load in (
            ("auto_plain", lambda: AutoTokenizer.from_pretrained(path)),
            ("auto_no_remote_code", lambda: AutoTokenizer.from_pretrained(path, trust_remote_code=False)),
            ("auto_no_remote_code_bos",
             lambda: AutoTokenizer.from_pretrained(path, trust_remote_code=False, add_bos_token=True)),
            ("auto_remote_code", lambda: AutoTokenizer.from_pretrained(path, trust_remote_code=True)),
            ("fast", lambda: PreTrainedTokenizerFast.from_pretrained(path)),
        ):
            del prompts[:]
            modules = set(sys.modules)
            tokenizer = load()
            report[path + ":" + name] = {
                "ids": tokenizer(text)["input_ids"],
                "add_bos_token": tokenizer.add_bos_token,
                "fast": tokenizer.is_fast,
                "prompted": bool(prompts),
                "ran_remote_code": any(m.startswith("transformers_modules") for m in set(sys.modules) - modules),
            }
    print("REPORT=" + json.dumps(report))
    """
)


def fresh_python(tmp_path, script: str, *arguments: str, timeout: int = 600) -> dict:
    """Run `script` where zpx_hf cannot be imported, stdin closed; its `REPORT=` line as a dict."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), TRANSFORMERS_VERBOSITY="error")
    completed = subprocess.run(
        [sys.executable, "-c", script, *arguments],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "[y/N]" not in completed.stdout + completed.stderr  # the patched `input` prints nothing
    line = next(line for line in completed.stdout.splitlines() if line.startswith("REPORT="))
    return json.loads(line.removeprefix("REPORT="))


def test_tokenizer_loads_without_the_package_with_the_readme_argument_and_no_prompt(tmp_path):
    paths = []
    for case in ("zpx", "pct", "versor-hybrid"):
        torch.manual_seed(0)
        path = tmp_path / case
        AutoModelForCausalLM.from_config(make_tiny_config(case, vocab_size=VOCAB_SIZE)).save_pretrained(path)
        build_byte_tokenizer().save_pretrained(path)
        assert "auto_map" in json.loads((path / "config.json").read_text())  # remote-code model beside it
        assert json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
        paths.append(str(path))
    report = fresh_python(tmp_path, _TOKENIZER_SCRIPT, TEXT, *paths)
    for path in paths:
        loads = {name: report[f"{path}:{name}"] for name in ("auto_no_remote_code", "auto_remote_code", "fast")}
        for name, loaded in loads.items():
            assert not loaded["prompted"], name
            assert loaded["fast"] and loaded["add_bos_token"] is False and loaded["ids"] == text_to_ids(TEXT), name
        assert not loads["auto_no_remote_code"]["ran_remote_code"]  # the tokenizer itself is a plain tokenizer.json
        with_bos = report[f"{path}:auto_no_remote_code_bos"]
        assert with_bos["add_bos_token"] is True and with_bos["ids"] == [BOS_ID, *text_to_ids(TEXT)]
        # why the README names the argument: AutoTokenizer reads config.json (through AutoConfig) before
        # tokenizer_config.json, and for an unregistered model_type with an auto_map transformers asks [y/N];
        # no file next to the tokenizer changes that (if this starts failing, transformers stopped asking)
        plain = report[f"{path}:auto_plain"]
        assert plain["prompted"] and plain["ids"] == text_to_ids(TEXT)


# One checkpoint per job, all in one fresh Python (torch, transformers and peft imported once): argv[1] is a JSON
# list of {"path", "configs", "refused", "trl"}; the report maps each path to what happened to it.
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["zpx_hf"] = None
    import peft, torch
    from transformers import AutoModelForCausalLM

    def check(path, configs, refused, trl):
        report = {}
        ids = torch.randint(4, 260, (1, 12), generator=torch.Generator().manual_seed(0))

        def load():
            return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()

        def error_of(config):
            try:
                peft.get_peft_model(load(), config)
                return "worked"
            except ValueError as error:
                return str(error)

        base = load()
        with torch.no_grad():
            base_logits = base(input_ids=ids).logits
        report["lora_default"] = error_of(peft.LoraConfig(task_type="CAUSAL_LM"))
        report["lora_refused"] = {name: error_of(peft.LoraConfig(target_modules=[name])) for name in refused}
        for name, (cls, kwargs) in configs.items():
            model = peft.get_peft_model(load(), getattr(peft, cls)(task_type="CAUSAL_LM", **kwargs))
            tuner = peft.tuners.tuners_utils.BaseTunerLayer
            wrapped = sorted(n for n, m in model.named_modules() if isinstance(m, tuner))
            with torch.no_grad():
                difference = (model(input_ids=ids).logits - base_logits).abs().max().item()
            report[name] = {"wrapped": len(wrapped), "difference": difference}
        if trl:  # TRL, with the README's argument: SFT loads model and tokenizer from the path,
            from datasets import Dataset  # DPO rebuilds its reference model from the policy's path
            from transformers import AutoTokenizer
            from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer
            common = dict(trust_remote_code=True, report_to=[], max_steps=1, per_device_train_batch_size=2,
                          use_cpu=True)
            text = Dataset.from_dict({"text": ["abcdef"] * 2})
            sft = SFTTrainer(model=path, args=SFTConfig(output_dir=trl + "/sft", **common), train_dataset=text)
            report["sft_model"] = type(sft.model).__module__
            report["sft_loss"] = sft.train().training_loss
            data = Dataset.from_dict({"prompt": ["ab"] * 2, "chosen": ["cd"] * 2, "rejected": ["ef"] * 2})
            args = DPOConfig(output_dir=trl + "/dpo", **common)
            trainer = DPOTrainer(model=load(), args=args, train_dataset=data,
                                 processing_class=AutoTokenizer.from_pretrained(path, trust_remote_code=False))
            report["dpo_reference"] = type(trainer.ref_model).__module__
        return report

    print("REPORT=" + json.dumps({job["path"]: check(**job) for job in json.loads(sys.argv[1])}))
    """
)
CASES = ("zpx", "pct", "versor-hybrid")
TRL_CASE = "zpx"
VERSOR_REFUSED = ["q_proj"]  # a VersorLinear: PEFT's own LoRA layers cannot adapt it


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    """case -> the fresh Python's report on that family's tiny checkpoint (one process for every case)."""
    pytest.importorskip("peft")
    pytest.importorskip("trl")
    tmp_path = tmp_path_factory.mktemp("without_package")
    jobs = []
    for case in CASES:
        torch.manual_seed(0)
        path = tmp_path / case  # one folder name per family: their remote code must not share a module name
        AutoModelForCausalLM.from_config(make_tiny_config(case, vocab_size=VOCAB_SIZE)).save_pretrained(path)
        build_byte_tokenizer().save_pretrained(path)
        refused = VERSOR_REFUSED if case.startswith("versor") else []
        trl = str(tmp_path / "trl") if case == TRL_CASE else None
        jobs.append({"path": str(path), "configs": readme_peft_configs(case), "refused": refused, "trl": trl})
    report = fresh_python(tmp_path, _SCRIPT, json.dumps(jobs))
    return {case: report[job["path"]] for case, job in zip(CASES, jobs)}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_peft_and_trl_need_the_readme_arguments_without_the_package(case, reports):
    versor = case.startswith("versor")
    report = reports[case]
    assert "target_modules" in report["lora_default"]  # why the README writes the targets out
    layers = make_tiny_config(case).num_hidden_layers
    per_layer = {"lora": README_LORA_TARGETS[case]}
    if not versor:
        per_layer["ia3"] = README_LORA_TARGETS[case] + README_IA3_FEEDFORWARD[case]
        per_layer["oft"] = README_LORA_TARGETS[case]
    assert set(report) - {"lora_default", "lora_refused", "sft_model", "sft_loss", "dpo_reference"} == set(per_layer)
    for method, targets in per_layer.items():
        rra_layers = 1 if versor else layers  # hybrid: only layer 0 (RRA) has a bivector_proj
        assert report[method]["wrapped"] == rra_layers * len(targets), method
        assert report[method]["difference"] < 1e-5, method  # identity at init (fp32)
    if versor:  # a VersorLinear cannot be adapted by PEFT's own layers: PEFT says so, the README says why
        assert (
            "VersorLinear" in report["lora_refused"]["q_proj"] and "not supported" in report["lora_refused"]["q_proj"]
        )
    if case == TRL_CASE:
        assert report["sft_model"].startswith("transformers_modules") and report["sft_loss"] > 0
        assert report["dpo_reference"].startswith("transformers_modules")
