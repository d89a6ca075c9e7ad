"""PCT defaults sweep (issue 21): which tau mode, initial scale and gate-bias length let PCT learn the keyed needle.

    python benchmarks/pct_defaults.py                 # the sweep below, 2 workers; resumable
    python benchmarks/pct_defaults.py --report        # re-render the markdown from the saved rows only

Every arm trains the hidden-matched PCT of the medium suite on the medium keyed-needle budget (length 80,
2 needles / 2 distractors, 2 digits, compact; `benchmarks/ablation.py`), for fewer steps, through the
ablation machinery (`ablation_runs.train_loop` / `evaluate_lm`); only the PCT config fields named by the arm
differ. Answer exact match at the trained length (1x) and 8x it. Rows are appended to
`benchmarks/results/pct_defaults.jsonl`; a (arm, seed) row with the same budget is not run again.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import math
import sys
from pathlib import Path
from typing import Any

from ablation import SIZES, provenance
from ablation_models import match_width, model_config
from ablation_runs import append_row, evaluate_lm, io_shape, lm_loss_fn, read_rows, train_loop
from measure import clock

RESULTS = Path(__file__).resolve().parent / "results"
STEM = RESULTS / "pct_defaults"
TASK = "passkey"
COMPLEX_HEAD_DIM = 24  # hidden-matched PCT of the medium suite: hidden 192, 4 heads of real width 48
MULTIPLES = (1, 8)  # 8x keeps max_position_embeddings = 640, the suite's
# arm -> PCT config fields; b_h = -log(train_context_length). "old" is the code before issue 21:
# tau = sqrt(d) fixed, b_h = -log(max_position_embeddings) = -log(640).
ARMS: dict[str, dict[str, Any]] = {
    "log_tau20_n80": {"tau": "log_learnable", "tau_init": 20.0, "train_context_length": 80},
    "old_sqrt_d_n640": {"tau": "sqrt_d", "train_context_length": 640},
    "log_tau20_n640": {"tau": "log_learnable", "tau_init": 20.0, "train_context_length": 640},
    "log_tau10_n80": {"tau": "log_learnable", "tau_init": 10.0, "train_context_length": 80},
    "fixed_tau20_n80": {"tau": 20.0, "train_context_length": 80},
    "log_tau5_n80": {"tau": "log_learnable", "tau_init": 5.0, "train_context_length": 80},
}


def sweep_spec(steps: int) -> Any:
    spec = SIZES["medium"]
    budgets = {TASK: dataclasses.replace(spec.budgets[TASK], steps=steps)}
    return dataclasses.replace(spec, budgets=budgets, passkey_multiples=MULTIPLES)


def run_arm(arm: str, seed: int, steps: int) -> dict[str, Any]:
    """Train and evaluate one (arm, seed); a failure is recorded in the row."""
    import torch
    from transformers import AutoModelForCausalLM

    from zpx_hf import PCTConfig

    torch.set_num_threads(1)
    spec = sweep_spec(steps)
    budget = spec.budgets[TASK]
    io = io_shape(TASK, budget, spec)
    width = match_width("pct", spec.hidden, spec.layers, spec.heads, io, 0.10, None)
    base = model_config(
        "pct", width["hidden"], width["intermediate"], spec.layers, spec.heads, io["vocab"], io["max_pos"]
    )
    config = PCTConfig.from_dict({**base.to_dict(), "tau_init": None, **ARMS[arm]})
    row: dict[str, Any] = {"arm": arm, "seed": seed, "budget": budget.fingerprint(), "steps": steps, **ARMS[arm]}
    row.update(provenance(), lr=budget.lr, hidden=width["hidden"], params=width["params"])
    start = clock()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        row["tau_start"] = config.initial_tau
        row.update(train_loop(model, lm_loss_fn(model, TASK, budget, seed, "cpu"), budget))
        row.update(evaluate_lm(model, TASK, spec, budget))
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


def initial_gates(arm: str, complex_head_dim: int, trials: int = 512) -> dict[str, float]:
    """Gates at initialisation (no training) of one query row at the trained length 80: the one key equal to the
    query (cosine 1) and the sum over the 79 others (random unit keys), mean over `trials` rows; through the
    package's `pct_attention_weights` with the arm's initial tau and b_h = -log(n)."""
    import torch

    from zpx_hf import PCTConfig
    from zpx_hf.ops_pct import pct_attention_weights

    length = sweep_spec(800).budgets[TASK].params["length"]
    config = PCTConfig(hidden_size=8 * complex_head_dim, num_attention_heads=4, **ARMS[arm])
    generator = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(
        torch.randn(trials, 1, length, 2 * complex_head_dim, generator=generator), dim=-1
    )
    query = keys[:, :, :1]  # the needle's key
    bias = torch.tensor([-math.log(config.train_context_length)])
    gates = pct_attention_weights(query, keys, torch.tensor([config.initial_tau]), bias, causal=False)[:, 0, 0]
    return {"match": float(gates[:, 0].mean()), "others_sum": float(gates[:, 1:].sum(-1).mean())}


def render(command: str, steps: int) -> str:
    budget = sweep_spec(steps).budgets[TASK].fingerprint()
    rows = [r for r in read_rows(STEM.with_suffix(".jsonl")) if r.get("status") == "ok" and r["budget"] == budget]
    lines = [
        "# PCT defaults: keyed needle at the trained length",
        "",
        f"Command: `{command}` ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC).",
        "",
        f"Hidden-matched PCT of the medium suite, medium needle budget (length 80, 2 needles / 2 distractors, "
        f"2 digits, compact; batch 32, lr 1e-3) for {steps} steps; answer exact match on 64 needles at 1x and 8x "
        "the trained length. b_h starts at -log(n), n = `train_context_length`; tau per head at `tau_start`.",
        "",
        "| arm | tau | tau_start | n (b_h = -log n) | seeds | EM@1x per seed | EM@1x mean | EM@8x mean | "
        "tau at end (mean) | b_h at end (mean) | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if not rows:
        lines.insert(
            6,
            "No training arm has finished yet (on the shared 2-core machine each process got ~11% of a core: an "
            "800-step run was estimated at about two hours); "
            "`python benchmarks/pct_defaults.py` runs them and fills this table.\n",
        )
    for arm in ARMS:
        mine = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["seed"])
        if not mine:
            lines.append(
                f"| {arm} | {ARMS[arm]['tau']} | | {ARMS[arm]['train_context_length']} | 0 | not run | | | | | |"
            )
            continue
        em1 = [r["passkey_em@1x"] for r in mine]
        em8 = [r["passkey_em@8x"] for r in mine]
        tau_end = [sum(map(sum, r["tau_end"])) / sum(map(len, r["tau_end"])) for r in mine]
        bias_end = [sum(map(sum, r["gate_bias_end"])) / sum(map(len, r["gate_bias_end"])) for r in mine]
        lines.append(
            f"| {arm} | {ARMS[arm]['tau']} | {mine[0]['tau_start']:.3g} | {ARMS[arm]['train_context_length']} | "
            f"{len(mine)} | {' / '.join(f'{e:.3f}' for e in em1)} | {sum(em1) / len(em1):.3f} | "
            f"{sum(em8) / len(em8):.3f} | {sum(tau_end) / len(tau_end):.2f} | {sum(bias_end) / len(bias_end):.2f} | "
            f"{', '.join(sorted({r['commit'][:7] + (' (dirty)' if r.get('dirty') else '') for r in mine}))} |"
        )
    lines += [
        "",
        "Gates at initialisation (no training; `initial_gates`): one query row at length 80, complex head dim "
        f"d = {COMPLEX_HEAD_DIM} (the hidden-matched PCT), the needle's key (cosine 1) against 79 random unit keys.",
        "",
        "| arm | tau_start | b_h | gate of the matching key | sum of the 79 other gates |",
        "|---|---|---|---|---|",
    ]
    for arm in ARMS:
        from zpx_hf import PCTConfig

        config = PCTConfig(hidden_size=8 * COMPLEX_HEAD_DIM, num_attention_heads=4, **ARMS[arm])
        gates = initial_gates(arm, COMPLEX_HEAD_DIM)
        lines.append(
            f"| {arm} | {config.initial_tau:.3g} | {-math.log(config.train_context_length):.2f} | "
            f"{gates['match']:.3f} | {gates['others_sum']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    STEM.with_suffix(".md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--workers", type=int, default=2, help="parallel processes, 1 thread each")
    parser.add_argument("--report", action="store_true", help="only re-render the markdown from the jsonl")
    args = parser.parse_args(argv)
    command = " ".join(["python benchmarks/pct_defaults.py", *(argv if argv is not None else sys.argv[1:])])
    command = command.replace(" --report", "")
    if args.report:
        print(render(command, args.steps))
        return
    budget = sweep_spec(args.steps).budgets[TASK].fingerprint()
    done = {
        (r["arm"], r["seed"])
        for r in read_rows(STEM.with_suffix(".jsonl"))
        if r.get("status") == "ok" and r["budget"] == budget
    }
    todo = [(arm, seed) for seed in range(args.seeds) for arm in args.arms if (arm, seed) not in done]
    print(f"[plan] {len(done)} done, {len(todo)} to run", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_arm, arm, seed, args.steps) for arm, seed in todo]
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            append_row(STEM.with_suffix(".jsonl"), row)
            print({k: row[k] for k in row if k not in ("tau_end", "gate_bias_end")}, flush=True)
            render(command, args.steps)
    print(render(command, args.steps))


if __name__ == "__main__":
    main()
