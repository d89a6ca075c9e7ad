"""Calibrate the suite's budgets: train the baseline (softmax + RoPE) on a task setting and record its
held-out answer accuracy every `probe` steps, stopping once it holds the target.

    python -m benchmarks.evidence.calibrate --trials mqar_p4q8r needle_compact_512_d2 --seeds 0

Each finished trial appends one JSON line (setting, seed, accuracy curve, first step at the target, seconds)
to benchmarks/results/calibration_trials.jsonl; a rerun skips (trial, seed) pairs already there. The evidence
report quotes the long-needle trials beside its same-length table (`report.long_needle_calibration`).
results/calibration_medium.{json,md}, the medium protocol's budgets chosen from the earlier trials, is a frozen
file (docs/evidence_superseded.md): its renderer went with that protocol.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

from benchmarks.evidence.models import baseline_width, build_model
from benchmarks.evidence.protocol import EVAL_SEED, SizeSpec, TaskBudget
from benchmarks.evidence.rows import CALIBRATION_TRIALS as TRIALS_FILE
from benchmarks.evidence.rows import RESULTS, append_row, read_rows
from benchmarks.evidence.tasks import Rows, io_shape, lm_examples, lm_loss_fn
from benchmarks.evidence.training import train_loop
from benchmarks.measure import clock  # the one wall clock of every benchmark
from zpx_hf_train.evaluation import task_accuracy

MODEL = {"hidden": 128, "layers": 2, "heads": 4}
# the 2-digit compact needle (trial needle_compact_80_d2, the suite's format) without its length
NEEDLE_D2 = {"num_needles": 2, "num_distractors": 2, "num_digits": 2, "compact": True}

# name -> (task, budget, model overrides, why)
TRIALS: dict[str, tuple[str, TaskBudget, dict[str, int], str]] = {
    "mqar_p4q4": (
        "mqar",
        TaskBudget(steps=600, batch=64, lr=1e-3, params={"num_pairs": 4}),
        {},
        "the earlier setting: 4 pairs, every key asked once (shortcut plateau expected)",
    ),
    "mqar_p4q8r": (
        "mqar",
        TaskBudget(steps=3000, batch=64, lr=1e-3, params={"num_pairs": 4, "num_queries": 8, "query_replacement": True}),
        {},
        "queries drawn with replacement (no 'unasked value' shortcut), twice the supervision per example",
    ),
    "mqar_p4q8r_wd0_lr2": (
        "mqar",
        TaskBudget(
            steps=3000,
            batch=64,
            lr=2e-3,
            weight_decay=0.0,
            params={"num_pairs": 4, "num_queries": 8, "query_replacement": True},
        ),
        {},
        "as mqar_p4q8r, lr 2e-3 and no weight decay",
    ),
    "mqar_p4q8r_3l": (
        "mqar",
        TaskBudget(steps=3000, batch=64, lr=1e-3, params={"num_pairs": 4, "num_queries": 8, "query_replacement": True}),
        {"layers": 3},
        "as mqar_p4q8r with a third layer",
    ),
    "mqar_p8q8r": (
        "mqar",
        TaskBudget(steps=3000, batch=64, lr=1e-3, params={"num_pairs": 8, "num_queries": 8, "query_replacement": True}),
        {},
        "8 pairs, 8 queries with replacement",
    ),
    "mqar_p4q4_3l": (
        "mqar",
        TaskBudget(steps=3000, batch=64, lr=1e-3, params={"num_pairs": 4}),
        {"layers": 3},
        "the earlier setting with a third layer",
    ),
    "passkey_128": (
        "passkey",
        TaskBudget(steps=1500, batch=32, lr=1e-3, params={"length": 128, "num_needles": 3, "num_distractors": 2}),
        {},
        "keyed passkey, 3 needles + 2 distractor numbers, length 128",
    ),
    "passkey_96": (
        "passkey",
        TaskBudget(steps=800, batch=32, lr=1e-3, params={"length": 96, "num_needles": 2, "num_distractors": 2}),
        {},
        "keyed passkey, 2 needles + 2 distractor numbers, length 96",
    ),
    "passkey_96_lr3": (
        "passkey",
        TaskBudget(steps=1500, batch=32, lr=3e-3, params={"length": 96, "num_needles": 2, "num_distractors": 2}),
        {},
        "as passkey_96 with lr 3e-3 (lowercase key letters, which also occur in the filler)",
    ),
    "passkey_80_d3_lr3": (
        "passkey",
        TaskBudget(
            steps=1500,
            batch=32,
            lr=3e-3,
            params={"length": 80, "num_needles": 2, "num_distractors": 2, "num_digits": 3},
        ),
        {},
        "3-digit numbers, 2 needles + 2 distractors, length 80, lr 3e-3 (lowercase key letters)",
    ),
    "needle_96": (
        "passkey",
        TaskBudget(steps=2000, batch=32, lr=1e-3, params={"length": 96, "num_needles": 2, "num_distractors": 2}),
        {},
        "keyed needle with capital key letters found nowhere else in the example (one unambiguous key token), "
        "2 needles + 2 distractor numbers of 5 digits, length 96",
    ),
    "needle_80_d3": (
        "passkey",
        TaskBudget(
            steps=2000,
            batch=32,
            lr=1e-3,
            params={"length": 80, "num_needles": 2, "num_distractors": 2, "num_digits": 3},
        ),
        {},
        "as needle_96 with 3-digit numbers, length 80",
    ),
    "needle_compact_80": (
        "passkey",
        TaskBudget(
            steps=2000,
            batch=32,
            lr=1e-3,
            params={"length": 80, "num_needles": 2, "num_distractors": 2, "num_digits": 3, "compact": True},
        ),
        {},
        "compact keyed needle: `Q839.` needles (capital key next to its 3-digit number), 2 needles + 2 bare "
        "distractor numbers, question `What is Q? Q`, length 80",
    ),
    "needle_compact_80_d2": (
        "passkey",
        TaskBudget(
            steps=2000,
            batch=32,
            lr=1e-3,
            params={**NEEDLE_D2, "length": 80},
        ),
        {},
        "as needle_compact_80 with 2-digit numbers (one copied digit after the keyed one instead of two)",
    ),
    "needle_compact_512_d2": (
        "passkey",
        TaskBudget(
            steps=2400,
            batch=8,
            lr=1e-3,
            params={**NEEDLE_D2, "length": 512},
        ),
        {},
        "the evidence suite's same-length needle (512 tokens, batch 8): its 400-step budget left the baseline at "
        "chance (0.10 / 0.08 at lr 1e-3 / 3e-4); how many steps it needs",
    ),
    "needle_compact_256_d2": (
        "passkey",
        TaskBudget(
            steps=2400,
            batch=16,
            lr=1e-3,
            params={**NEEDLE_D2, "length": 256},
        ),
        {},
        "the same-length needle at 256 tokens, batch 16 (the tokens per step of needle_compact_512_d2): whether a "
        "shorter long length is within the CPU budget",
    ),
    "copy_t4p12": (
        "selective_copy",
        TaskBudget(steps=1500, batch=64, lr=1e-3, params={"num_tokens": 4, "num_positions": 12}),
        {},
        "selective copying, 4 tokens in 12 slots",
    ),
    "copy_t6p24": (
        "selective_copy",
        TaskBudget(steps=1500, batch=64, lr=1e-3, params={"num_tokens": 6, "num_positions": 24}),
        {},
        "selective copying, 6 tokens in 24 slots",
    ),
    "spiral_24": (
        "spiral",
        TaskBudget(steps=1500, batch=64, lr=1e-3, params={"num_points": 24}),
        {},
        "spiral chirality x winding (4 classes, chance 0.25), 24 points",
    ),
}


def probe_spec(task: str, budget: TaskBudget, model: dict[str, int], eval_examples: int) -> SizeSpec:
    return SizeSpec(
        hidden=model["hidden"],
        layers=model["layers"],
        heads=model["heads"],
        budgets={task: budget},
        eval_examples=eval_examples,
        passkey_multiples=(1,),
        passkey_eval_examples=eval_examples,
        seeds=1,
    )


def run_trial(name: str, seed: int, probe_every: int, target: float, eval_examples: int) -> dict[str, Any]:
    """Train the baseline on one setting; accuracy on `eval_examples` held-out examples every `probe_every`
    steps; stop once two consecutive probes reach `target`."""
    task, budget, overrides, why = TRIALS[name]
    model_shape = {**MODEL, **overrides}
    spec = probe_spec(task, budget, model_shape, eval_examples)
    torch.manual_seed(seed)
    model = build_model(
        "baseline", baseline_width(model_shape["hidden"]), spec.layers, spec.heads, io_shape(task, budget, spec)
    )
    params = budget.params if task != "passkey" else {**budget.params}
    heldout = Rows(lm_examples(task, eval_examples, EVAL_SEED, params))
    curve: list[tuple[int, float]] = []
    started = clock()

    def probe(step: int) -> bool:
        accuracy = task_accuracy(model, heldout, batch_size=64)["token_accuracy"]
        curve.append((step, accuracy, round(clock() - started, 1)))
        print(
            f"[{name} seed {seed}] step {step}: accuracy {accuracy:.3f} ({clock() - started:.0f}s)",
            flush=True,
        )
        return len(curve) >= 2 and curve[-1][1] >= target and curve[-2][1] >= target

    result = train_loop(
        model, lm_loss_fn(model, task, budget, seed, "cpu"), budget, probe=probe, probe_every=probe_every
    )
    reached = next((step for step, accuracy, _ in curve if accuracy >= 0.9), None)
    return {
        "trial": name,
        "task": task,
        "seed": seed,
        "why": why,
        "budget": {
            "steps": budget.steps,
            "batch": budget.batch,
            "lr": budget.lr,
            "weight_decay": budget.weight_decay,
            "warmup": budget.warmup,
            "params": budget.params,
        },
        "model": model_shape,
        "curve": curve,
        "first_step_at_0.9": reached,
        "final_accuracy": curve[-1][1] if curve else None,
        "steps_done": result["steps_done"],
        "seconds": round(clock() - started, 1),
        "seconds_per_step": round(result["train_seconds"] / result["steps_done"], 4),
        "threads": torch.get_num_threads(),
        "command": " ".join(["python -m benchmarks.evidence.calibrate", *sys.argv[1:]]),
    }


def done_trials() -> set[tuple[str, int]]:
    return {(r["trial"], r["seed"]) for r in read_rows(TRIALS_FILE)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.evidence.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trials", nargs="+", required=True, choices=list(TRIALS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--probe", type=int, default=100, help="steps between accuracy probes")
    parser.add_argument("--target", type=float, default=0.95, help="stop after two probes at this accuracy")
    parser.add_argument("--eval-examples", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    RESULTS.mkdir(parents=True, exist_ok=True)
    done = done_trials()
    for seed in args.seeds:
        for name in args.trials:
            if (name, seed) in done:
                print(f"[{name} seed {seed}] already in {TRIALS_FILE.name}, skipped", flush=True)
                continue
            row = run_trial(name, seed, args.probe, args.target, args.eval_examples)
            append_row(TRIALS_FILE, row)


if __name__ == "__main__":
    main()
