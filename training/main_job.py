#!/usr/bin/env python
"""The README's main job: train zpx-tiny on embedded data on the CPU, evaluate, save, reload, generate.

    python training/main_job.py                                   # configs/zpx-tiny.yaml -> runs/zpx-tiny
    python training/main_job.py --config configs/pct-tiny.yaml    # any family's config
    python training/main_job.py --max_steps 50                    # extra flags go to training/train.py

No network is used: the corpus is CPython's embedded docs, the tasks are generated in code, and the
checkpoint is reloaded offline through `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)`
from the copied modelling code.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train import REPO_ROOT, ConfigError, load_run_config, run_training  # noqa: E402

DEFAULT_CONFIG = REPO_ROOT / "configs" / "zpx-tiny.yaml"
PROMPT = 'The "if" statement'


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    config = str(DEFAULT_CONFIG)
    if "--config" in argv:
        index = argv.index("--config")
        config = argv[index + 1]
        del argv[index : index + 2]
    started = time.time()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    from zpx_hf.data_tasks import task_examples
    from zpx_hf.evaluation import metrics_table
    from zpx_hf.tokenization_bytes import ids_to_text

    logging.set_verbosity_error()
    try:
        run = load_run_config(config, argv)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    print(f"[1/3] training {run.model_config.model_type} from {config} ({torch.get_num_threads()} CPU threads)")
    result = run_training(run)
    output_dir = result["output_dir"]
    trained = result["trainer"].model.eval()

    print(f"[2/3] reloading {output_dir} through AutoModelForCausalLM (trust_remote_code=True)")
    model = AutoModelForCausalLM.from_pretrained(output_dir, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    inputs = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        drift = (model(**inputs).logits - trained(**inputs).logits).abs().max().item()
    print(
        f"      loaded {type(model).__module__}.{type(model).__name__}; max |logit difference| vs trained: {drift:.2e}"
    )

    print("[3/3] samples from the reloaded checkpoint")
    torch.manual_seed(0)
    generated = model.generate(
        **inputs, max_new_tokens=160, do_sample=True, temperature=0.7, top_k=20, pad_token_id=tokenizer.pad_token_id
    )
    print("---- text (sampled, temperature 0.7) ----")
    print(tokenizer.decode(generated[0], skip_special_tokens=True))
    example = task_examples("mqar", 1, seed=12345, seq_len=None, num_pairs=8)[0]
    first_answer = example["answer_mask"].index(1)
    prompt_ids = torch.tensor([example["input_ids"][:first_answer]])
    with torch.no_grad():
        answer = model.generate(
            input_ids=prompt_ids, max_new_tokens=1, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )[0, -1:]
    print("---- associative recall (greedy) ----")
    print(
        f"{ids_to_text(prompt_ids[0])} -> model: {ids_to_text(answer)!r}, "
        f"expected: {ids_to_text([example['input_ids'][first_answer]])!r}"
    )

    print("---- final metrics ----")
    print(metrics_table(result["metrics"]))
    train = result["train_metrics"]
    print(
        f"train loss {train.get('train_loss', float('nan')):.4f} | train {train.get('train_runtime', 0):.0f} s | "
        f"total {time.time() - started:.0f} s | checkpoint: {output_dir} (report.md, metrics.json, loss_curve.png)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
