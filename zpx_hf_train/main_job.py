"""The README's main job: train zpx-tiny on embedded data on the CPU, evaluate, draw, save, reload, generate.

    zpx-main   # configs/zpx-tiny.yaml (shipped with the package) -> runs/zpx-tiny (or python -m zpx_hf_train.main_job)
    zpx-main --config pct-tiny                      # any shipped config by name, or a YAML file
    zpx-main --threads 2                            # torch intra-op threads (default 1)
    zpx-main --max_steps 50                         # extra flags override the config (zpx-train's flags)
    zpx-main --summary benchmarks/results/main_job.md   # also write the README summary

Flags that override the config are printed with the config's name and written into the summary's command.

No network is used: the corpus is CPython's embedded docs, the tasks are generated in code, and the
checkpoint is reloaded offline through `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)`
from the copied modelling code. The run folder also gets the inspection pictures (`zpx_hf_train.inspection`),
embedded in its report and model card. A second run into the same folder replaces the first
(`--overwrite_output_dir true` is the job's default).

The job ends with what the model learned: held-out bits per byte with its standard error and its size, beside
byte 3- and 5-gram models trained on the same training text and scored on the same held-out tokens
(`evaluation.ngram_references`); each recall task's held-out answer-token accuracy beside chance (uniform
guessing over the answer alphabet), the copy floor (answering with a value drawn from the context,
`report.recall_floor`: MQAR's 4 pairs give 0.279, not 1/26) and the bar 0.9 (`report.recall_verdict`), and a
WARNING on stderr for every task below the bar, so a run that learned only the text says so. Prompts are tokenized with
`add_bos_token=True`: the tokenizer adds no BOS by default and every training document starts with one.

One intra-op thread by default: for a model this small a second thread gains little, and on a shared
2-core machine it made each step 3-6x slower whenever another process was running (0.22 s/step with one
thread against 0.6-1.6 s/step with two, measured here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .cli import EXIT_USAGE, HELP_FLAGS, guarded, usage_text
from .data import TASK_SPECS, DataArguments
from .package_data import data_folder
from .tokenizer import is_byte_tokenizer
from .train import config_name, load_run_config, recall_rows, run_training, warn_unlearned

DEFAULT_CONFIG = "zpx-tiny.yaml"  # in the shipped configs/ (`zpx_hf_train.package_data`), whatever the folder
PROMPT = 'The "if" statement'
RELOAD_SCRIPT = """
import json, sys
sys.modules["zpx_hf"] = None  # prove the checkpoint is self-contained: the package cannot be imported
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging
logging.set_verbosity_error()
path, prompt, recall_prompt, report = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
# add_bos_token: the tokenizer adds no BOS by default, and every training document starts with one
tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True, add_bos_token=True)
inputs = tokenizer(prompt, return_tensors="pt")
with torch.no_grad():
    logits = model(**inputs).logits[0, -1].tolist()
torch.manual_seed(0)
out = model.generate(**inputs, max_new_tokens=160, do_sample=True, temperature=0.7, top_k=20,
                     pad_token_id=tokenizer.pad_token_id)
recall = model.generate(input_ids=torch.tensor([recall_prompt]), max_new_tokens=1, do_sample=False,
                        pad_token_id=tokenizer.pad_token_id)
with open(report, "w", encoding="utf-8") as f:
    json.dump({"class": type(model).__module__ + "." + type(model).__name__, "logits": logits,
               "prompt_ids": inputs["input_ids"][0].tolist(),
               "sample": tokenizer.decode(out[0], skip_special_tokens=True),
               "recall": tokenizer.decode(recall[0, -1:])}, f)
"""


def main(argv: list[str] | None = None) -> int:
    """`zpx-main [--config FILE] [--threads N] [--summary FILE] [zpx-train flags ...]`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(flag in HELP_FLAGS for flag in argv):
        print(usage_text(__doc__.split("\n\nNo network")[0]))
        return 0
    own = {"--config": "", "--threads": "1", "--summary": ""}
    for flag in own:
        if flag in argv:
            index = argv.index(flag)
            if index + 1 >= len(argv) or argv[index + 1].startswith("--"):
                print(f"zpx-main: config error: {flag} needs a value.", file=sys.stderr)
                return EXIT_USAGE
            own[flag] = argv[index + 1]
            del argv[index : index + 2]
    if not own["--threads"].isdigit() or int(own["--threads"]) < 1:
        print(f"zpx-main: config error: --threads {own['--threads']!r} must be a whole number >= 1.", file=sys.stderr)
        return EXIT_USAGE
    config = own["--config"] or str(data_folder("configs") / DEFAULT_CONFIG)
    started = time.time()

    import torch

    torch.set_num_threads(int(own["--threads"]))
    from transformers import AutoTokenizer
    from transformers.utils import logging

    from zpx_hf_train.data_tasks import task_examples

    from .report import metrics_table, recall_table

    logging.set_verbosity_error()
    threads = torch.get_num_threads()
    flags = ["--overwrite_output_dir", "true", "--inspect", "true", *argv]
    code, run = guarded(lambda: load_run_config(config, flags), "zpx-main", reading_config=True)
    if run is None:
        return code
    print(
        f"[1/3] training {run.model_config.model_type} from {config_name(run.path)} ({threads} CPU "
        f"thread{'s' * (threads != 1)})" + (f", overridden by {' '.join(argv)}" if argv else "")
    )
    code, result = guarded(lambda: run_training(run), "zpx-main", run=run)
    if result is None:
        return code
    output_dir = result["output_dir"]
    trained = result["model"].eval()
    tokenizer = AutoTokenizer.from_pretrained(output_dir, add_bos_token=True)  # the saved one, with BOS

    print(f"[2/3] reloading {output_dir} with AutoModelForCausalLM(trust_remote_code=True) in a fresh Python")
    print("      where `import zpx_hf` is blocked: only the checkpoint's own code and files are used")
    mqar_params = TASK_SPECS["mqar"].params(run.args[DataArguments])
    task_tokenizer = None if is_byte_tokenizer(tokenizer) else tokenizer  # as the training data was written
    example = task_examples("mqar", 1, seed=12345, seq_len=None, tokenizer=task_tokenizer, **mqar_params)[0]
    first_answer = example["answer_mask"].index(1)
    recall_prompt = example["input_ids"][:first_answer]
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "reload.json")
        subprocess.run(
            [sys.executable, "-c", RELOAD_SCRIPT, output_dir, PROMPT, json.dumps(recall_prompt), report],
            check=True,
            stdin=subprocess.DEVNULL,
        )
        with open(report, encoding="utf-8") as f:
            reloaded = json.load(f)
    inputs = tokenizer(PROMPT, return_tensors="pt")
    for ids in (inputs["input_ids"][0].tolist(), reloaded["prompt_ids"]):
        if ids[0] != tokenizer.bos_token_id:
            raise RuntimeError(f"zpx-main: the demo prompt was tokenized without BOS ({ids[:4]}...)")
    with torch.no_grad():
        expected = trained(**inputs).logits[0, -1]
    drift = (torch.tensor(reloaded["logits"]) - expected).abs().max().item()
    print(f"      loaded {reloaded['class']}; max |logit difference| vs the trained model: {drift:.2e}")

    print("[3/3] samples from the reloaded checkpoint")
    print("---- text (sampled, temperature 0.7, top-k 20) ----")
    print(reloaded["sample"])
    print("---- associative recall (greedy, one query) ----")
    answer = tokenizer.decode([example["input_ids"][first_answer]])
    shown = tokenizer.decode(recall_prompt, skip_special_tokens=True)
    print(f"{shown} -> model: {reloaded['recall']!r}, expected: {answer!r}")

    print("---- final metrics ----")
    text_metrics = heldout_metrics(result)
    print(metrics_table(text_metrics))
    print("---- what the model learned: recall tasks, held out ----")
    recall = recall_rows(result, run.args[DataArguments])
    print(recall_table(recall))
    from transformers import TrainingArguments

    warn_unlearned(recall, run.model_config.model_type, run.args[TrainingArguments].learning_rate, "zpx-main")
    train = result["train_metrics"]
    total = time.time() - started
    print(
        f"train loss {train.get('train_loss', float('nan')):.4f} | train {train.get('train_runtime', 0):.1f} s | "
        f"total {total:.0f} s | checkpoint: {output_dir} (report.md, metrics.json, loss_curve.png, inspection/)"
    )
    if own["--summary"]:
        summary = Path(own["--summary"])
        write_summary(summary, argv, run, result, total, threads, drift, reloaded["sample"], recall, text_metrics)
    return 0


def heldout_metrics(result: dict) -> dict:
    """`{"heldout": ..., "heldout_references": {"byte 3-gram": bpb, ...}}` of a finished run (no references
    without held-out text, or with a tokenizer that is not byte-level)."""
    from .evaluation import ngram_references

    datasets = result["datasets"]
    metrics = {"heldout": result["metrics"].get("heldout")}
    byte_level = is_byte_tokenizer(datasets.get("tokenizer"))  # byte n-grams score bytes, not another tokenizer's ids
    if (
        metrics["heldout"]
        and byte_level
        and datasets.get("heldout") is not None
        and datasets.get("text_train") is not None
    ):
        metrics["heldout_references"] = ngram_references(datasets["text_train"], datasets["heldout"])
    return metrics


def recall_sentence(recall: list[dict]) -> str:
    """One line for a newcomer: which recall tasks the run learned and which it did not (the job warned)."""
    groups: dict[str, list[str]] = {}
    for row in recall:
        groups.setdefault(row["verdict"], []).append(f"{row['task']} {row['token_accuracy']:.3f}")
    learned = ", ".join(groups.pop("learned", [])) or "none"
    rest = "; ".join(f"{verdict}: {', '.join(tasks)}" for verdict, tasks in groups.items())
    return f"Learned: {learned}." + (f" Not learned in this budget (the job warns): {rest}." if rest else "")


def write_summary(
    path: Path,
    flags: list[str],
    run,
    result: dict,
    total: float,
    threads: int,
    drift: float,
    sample: str,
    recall: list[dict],
    text_metrics: dict,
) -> None:
    """The README's main-job section: command (with the `flags` that overrode the config), machine, runtime,
    training mix, text metrics beside the n-gram references and what the model learned of each recall task
    (against chance, the copy floor and the bar)."""
    import platform

    import torch
    import transformers

    from .report import RECALL_BAR, metrics_table, recall_table

    train = result["train_metrics"]
    model = result["model"]
    steps = max(result["trainer"].state.global_step, 1)
    params = sum(p.numel() for p in model.parameters())
    snippet = " ".join(sample.split())[:160]
    lines = [
        f"Measured by `zpx-main --summary {' '.join([path.as_posix(), *flags])}` on "
        f"{time.strftime('%Y-%m-%d')} ({platform.machine()}, {os.cpu_count()} CPU cores, {threads} intra-op "
        f"thread{'s' * (threads != 1)}, torch {torch.__version__}, transformers {transformers.__version__}), "
        f"config `{config_name(run.path)}`, "
        f"{run.model_config.model_type} with {params:,} parameters:",
        "",
        f"- wall time {total:.0f} s in total (training {train.get('train_runtime', 0):.0f} s, "
        f"{steps} steps, {train.get('train_runtime', 0) / steps:.2f} s/step), "
        f"final training loss {train.get('train_loss', float('nan')):.3f};",
        f"- reload through `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)` in a Python "
        f"without zpx_hf: max |logit difference| {drift:.1e};",
        f"- sampled text: `{snippet}`",
        "",
        "Training data (one shuffled mix, every step):",
        "",
        *(f"- {line}" for line in result["datasets"]["description"]),
        "",
        metrics_table(text_metrics),
        "",
        "Byte n-grams: interpolated Witten-Bell over the tokenizer's ids (`zpx_hf_train.ngram`), trained on the "
        "training text blocks, scored on the held-out tokens the model is scored on (context inside the block).",
        "",
        f"Recall tasks on held-out examples (learned: answer-token accuracy >= {RECALL_BAR}; chance: uniform guessing "
        "over the answer alphabet; copy floor: answering with a value drawn uniformly from the context, 1 / C + "
        "(1 - 1 / C) / |alphabet| for C candidates, `zpx_hf_train.report.recall_floor`; at the floor: at most 3 "
        "binomial standard errors above it):",
        "",
        recall_table(recall),
        "",
        recall_sentence(recall),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
