"""PCT defaults sweep (issue 21): which tau mode, initial scale and gate-bias length let PCT learn recall.

    python -m benchmarks.evidence.pct_defaults --task mqar     # every arm on the suite's MQAR, 1 seed; resumable
    python -m benchmarks.evidence.pct_defaults --task passkey  # the keyed needle trained at 80 tokens
    python -m benchmarks.evidence.pct_defaults --report        # re-render the markdown from the saved rows only

Every arm trains the hidden-matched PCT of the evidence suite on one of its task budgets (`python -m
benchmarks.evidence --size evidence`), for `--steps` steps at lr 1e-3, through the suite's machinery
(`training.train_loop`, `runs.evaluate_lm`, the validation curve of `runs.curve_probe`); only the PCT config
fields named by the arm differ. The gate bias starts at b_h = -log(n), n = `context` x the task's trained length.
Rows are appended to `benchmarks/results/pct_defaults.jsonl`; an (task, arm, seed) row with the same budget and
steps is not run again.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import math
import sys
from typing import Any

from benchmarks.evidence.models import match_width, model_config
from benchmarks.evidence.protocol import SELECTION
from benchmarks.evidence.rows import RESULTS, append_row, provenance, read_rows
from benchmarks.evidence.runs import curve_probe, evaluate_lm
from benchmarks.evidence.sizes import SIZES
from benchmarks.evidence.tasks import io_shape, lm_loss_fn
from benchmarks.evidence.training import train_loop
from benchmarks.measure import clock

STEM = RESULTS / "pct_defaults"
COMPLEX_HEAD_DIM = 24  # hidden-matched PCT of the suite: hidden 192, 4 heads of real width 48
# task -> (the evidence suite's budget it trains on, default steps, test metric shown per seed). MQAR: 4x the
# suite's 300 steps, so an arm that only escapes the plateau later shows it on its curve (300 is a curve point).
TASKS = {"mqar": ("mqar", 1200, "accuracy"), "passkey": ("passkey", 800, "passkey_em@1x")}
LR = 1e-3
# arm -> PCT config fields, plus `context`: n = context x the trained length (b_h = -log n). "old" is the code
# before issue 21: tau = sqrt(d) fixed, b_h = -log(max_position_embeddings) = -log(8 x the trained length) in the
# suite; "sqrt_d_n1x" is the suite's `pct_tau_sqrt_d` variant.
ARMS: dict[str, dict[str, Any]] = {
    "log_tau20_n1x": {"tau": "log_learnable", "tau_init": 20.0, "context": 1},  # defaults version 2
    "log_tau10_n1x": {"tau": "log_learnable", "tau_init": 10.0, "context": 1},
    "log_tau5_n1x": {"tau": "log_learnable", "tau_init": 5.0, "context": 1},  # the package defaults (version 3)
    "sqrt_d_n1x": {"tau": "sqrt_d", "context": 1},
    "old_sqrt_d_n8x": {"tau": "sqrt_d", "context": 8},
    "log_tau20_n8x": {"tau": "log_learnable", "tau_init": 20.0, "context": 8},
    "fixed_tau20_n1x": {"tau": 20.0, "context": 1},
}


def pct_fields(arm: str, trained_length: int) -> dict[str, Any]:
    fields = {k: v for k, v in ARMS[arm].items() if k != "context"}
    return {**fields, "train_context_length": ARMS[arm]["context"] * trained_length}


def sweep_spec(task: str, steps: int) -> Any:
    """The evidence spec with one task's budget at `steps` steps and lr `LR`; the needle tested at 1x and 8x."""
    spec = SIZES["evidence"]
    name = TASKS[task][0]
    budgets = {name: dataclasses.replace(spec.budgets[name], steps=steps, lr=LR)}
    return dataclasses.replace(spec, budgets=budgets, passkey_multiples=(1, 8))


def run_arm(task: str, arm: str, seed: int, steps: int) -> dict[str, Any]:
    """Train and evaluate one (task, arm, seed); a failure is recorded in the row."""
    import torch
    from transformers import AutoModelForCausalLM

    from zpx_hf import PCTConfig

    torch.set_num_threads(1)
    spec = sweep_spec(task, steps)
    name = TASKS[task][0]
    budget = spec.budgets[name]
    io = io_shape(name, budget, spec)
    width = match_width("pct", spec.hidden, spec.layers, spec.heads, io, 0.10, None)
    base = model_config(
        "pct", width["hidden"], width["intermediate"], spec.layers, spec.heads, io["vocab"], io["max_pos"]
    )
    fields = pct_fields(arm, io["train_length"])
    config = PCTConfig.from_dict({**base.to_dict(), "tau_init": None, **fields})
    row: dict[str, Any] = {"task": task, "arm": arm, "seed": seed, "budget": budget.fingerprint(), "steps": steps}
    row.update(fields, **provenance(), lr=budget.lr, hidden=width["hidden"], params=width["params"])
    start = clock()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        row["tau_start"] = config.initial_tau
        curve: list[list[float]] = []
        probe, every = curve_probe(model, name, spec, budget, curve)
        row.update(train_loop(model, lm_loss_fn(model, name, budget, seed, "cpu"), budget, probe, every))
        row["val_curve"] = curve
        row.update(evaluate_lm(model, name, spec, budget))
        with torch.no_grad():
            attention = [layer.self_attn for layer in model.model.layers]
            taus = [torch.as_tensor(a.temperature(), dtype=torch.float32).expand(a.num_heads) for a in attention]
            row["tau_end"] = [[round(float(t), 3) for t in tau] for tau in taus]
            row["gate_bias_end"] = [[round(float(b), 3) for b in a.gate_bias] for a in attention]
        row["status"] = "ok"
    except Exception as error:  # recorded, not raised: the other arms still run
        row["status"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
    row["seconds"] = clock() - start
    return row


def initial_gates(arm: str, complex_head_dim: int, length: int, trials: int = 512) -> dict[str, float]:
    """Gates at initialisation (no training) of one query row at the trained `length`: the one key equal to the
    query (cosine 1) and the sum over the length - 1 others (random unit keys), mean over `trials` rows; through
    the package's `pct_attention_weights` with the arm's initial tau and b_h = -log(n)."""
    import torch

    from zpx_hf import PCTConfig
    from zpx_hf.ops_pct import pct_attention_weights

    config = PCTConfig(hidden_size=8 * complex_head_dim, num_attention_heads=4, **pct_fields(arm, length))
    generator = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(
        torch.randn(trials, 1, length, 2 * complex_head_dim, generator=generator), dim=-1
    )
    query = keys[:, :, :1]  # the needle's key
    bias = torch.tensor([-math.log(config.train_context_length)])
    gates = pct_attention_weights(query, keys, torch.tensor([config.initial_tau]), bias, causal=False)[:, 0, 0]
    return {"match": float(gates[:, 0].mean()), "others_sum": float(gates[:, 1:].sum(-1).mean())}


def trained_length(task: str, steps: int) -> int:
    spec = sweep_spec(task, steps)
    name = TASKS[task][0]
    return io_shape(name, spec.budgets[name], spec)["train_length"]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def finished_rows(task: str, steps: int) -> list[dict[str, Any]]:
    """The finished rows of `task` at this budget and step count (a changed budget or --steps runs again)."""
    spec = sweep_spec(task, steps)
    budget = spec.budgets[TASKS[task][0]].fingerprint()
    return [
        r
        for r in read_rows(STEM.with_suffix(".jsonl"))
        if r.get("task", "passkey") == task
        and r.get("status") == "ok"
        and r["budget"] == budget
        and r.get("steps") == steps
    ]


def render_task(task: str, steps: int) -> list[str]:
    spec = sweep_spec(task, steps)
    name, _, metric = TASKS[task]
    budget = spec.budgets[name]
    length = trained_length(task, steps)
    rows = [r for r in finished_rows(task, steps) if r.get("arm") in ARMS]
    extra = " and at 8x" if task == "passkey" else ""
    lines = [
        f"## {task}: {steps} steps, lr {LR:g}, trained length {length}",
        "",
        f"Budget `{name}` of `--size evidence` ({budget.params}; batch {budget.batch}) at {steps} steps; test "
        f"`{metric}` on {spec.eval_examples if task != 'passkey' else spec.passkey_eval_examples} held-out "
        f"examples{extra}; the validation curve is `{SELECTION[name][0]}` on {spec.val_examples} examples at "
        "1/8, 1/4, 1/2 and all of the steps.",
        "",
    ]
    if not rows:
        lines.append(f"No arm has run yet: `python -m benchmarks.evidence.pct_defaults --task {task}` runs them.\n")
    lines += [
        f"| arm | tau | tau_start | n (b_h = -log n) | seeds | {metric} per seed | mean |"
        + (" passkey_em@8x mean |" if task == "passkey" else "")
        + " validation curve (step: mean) | tau at end (mean) | b_h at end (mean) | commit |",
        "|---|---|---|---|---|---|---|" + ("---|" if task == "passkey" else "") + "---|---|---|---|",
    ]
    for arm in ARMS:
        fields = pct_fields(arm, length)
        mine = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["seed"])
        if not mine:
            blank = " |" * (6 if task == "passkey" else 5)
            lines.append(f"| {arm} | {fields['tau']} | | {fields['train_context_length']} | 0 | not run{blank}")
            continue
        scores = [r[metric] for r in mine]
        points = sorted({p[0] for r in mine for p in r.get("val_curve", [])})
        curve = ", ".join(
            f"{p}: {mean([v for r in mine for q, v in r.get('val_curve', []) if q == p]):.3f}" for p in points
        )
        tau_end = mean([mean([t for head in r["tau_end"] for t in head]) for r in mine])
        bias_end = mean([mean([b for head in r["gate_bias_end"] for b in head]) for r in mine])
        commits = ", ".join(sorted({r["commit"][:7] + (" (dirty)" if r.get("dirty") else "") for r in mine}))
        at8 = f" {mean([r['passkey_em@8x'] for r in mine]):.3f} |" if task == "passkey" else ""
        lines.append(
            f"| {arm} | {fields['tau']} | {mine[0]['tau_start']:.3g} | {fields['train_context_length']} | "
            f"{len(mine)} | {' / '.join(f'{v:.3f}' for v in scores)} | {mean(scores):.3f} |{at8} {curve} | "
            f"{tau_end:.2f} | {bias_end:.2f} | {commits} |"
        )
    lines += [
        "",
        f"Gates at initialisation (no training; `initial_gates`): one query row at length {length}, complex head "
        f"dim d = {COMPLEX_HEAD_DIM} (the hidden-matched PCT), the matching key (cosine 1) against {length - 1} "
        "random unit keys.",
        "",
        f"| arm | tau_start | b_h | gate of the matching key | sum of the {length - 1} other gates |",
        "|---|---|---|---|---|",
    ]
    from zpx_hf import PCTConfig

    for arm in ARMS:
        config = PCTConfig(hidden_size=8 * COMPLEX_HEAD_DIM, num_attention_heads=4, **pct_fields(arm, length))
        gates = initial_gates(arm, COMPLEX_HEAD_DIM, length)
        lines.append(
            f"| {arm} | {config.initial_tau:.3g} | {-math.log(config.train_context_length):.2f} | "
            f"{gates['match']:.3f} | {gates['others_sum']:.3f} |"
        )
    return lines + [""]


def render(commands: dict[str, str], steps: dict[str, int]) -> str:
    lines = [
        "# PCT defaults: which score scale and gate bias let PCT learn recall",
        "",
        f"Rendered {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Commands: "
        + "; ".join(f"`{commands[t]}`" for t in TASKS)
        + ". Hidden-matched PCT of the evidence suite (hidden 192, 2 layers, 4 heads); only the arm's PCT "
        "fields differ. One seed per arm unless the table says more.",
        "",
    ]
    for task in TASKS:
        lines += render_task(task, steps[task])
    text = "\n".join(lines)
    STEM.with_suffix(".md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.evidence.pct_defaults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--task", choices=list(TASKS), default="mqar")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the task's)")
    parser.add_argument("--workers", type=int, default=2, help="parallel processes, 1 thread each")
    parser.add_argument("--report", action="store_true", help="only re-render the markdown from the jsonl")
    args = parser.parse_args(argv)
    steps = {t: TASKS[t][1] for t in TASKS}
    steps[args.task] = args.steps or steps[args.task]
    commands = {t: f"python -m benchmarks.evidence.pct_defaults --task {t}" for t in TASKS}
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--report"]
    if given:
        commands[args.task] = " ".join(["python -m benchmarks.evidence.pct_defaults", *given])
    if args.report:
        print(render(commands, steps))
        return
    done = {(r["arm"], r["seed"]) for r in finished_rows(args.task, steps[args.task])}
    todo = [(arm, seed) for seed in range(args.seeds) for arm in args.arms if (arm, seed) not in done]
    print(f"[plan] {args.task}: {len(done)} done, {len(todo)} to run", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_arm, args.task, arm, seed, steps[args.task]) for arm, seed in todo]
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            append_row(STEM.with_suffix(".jsonl"), row)
            print({k: row[k] for k in row if k not in ("tau_end", "gate_bias_end")}, flush=True)
            render(commands, steps)
    print(render(commands, steps))


if __name__ == "__main__":
    main()
