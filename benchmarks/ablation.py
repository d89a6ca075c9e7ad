"""Ablation suite: every attention variant on six tasks at matched parameter counts and training budget.

    python benchmarks/ablation.py --size small            # CPU, ~25 min on 2 busy cores, 2 seeds
    python benchmarks/ablation.py --size full --seeds 5   # larger models / longer training

Variants (the model families through `transformers` Auto classes):
  baseline          softmax + RoPE (ZPX with lambda_angle = lambda_sphere = 0, rotary="rope": Llama-style)
  softmax_srpe      softmax + SRPE (the SRPE-vs-RoPE ablation on the baseline)
  zpx_angle         ZPX angle kernel only (lambda_sphere = 0), RoPE
  zpx_angle_sphere  ZPX angle + Riemann-sphere kernels, RoPE
  zpx_center        zpx_angle_sphere + centre-cancellation loss
  zpx_srpe          zpx_angle_sphere with SRPE (the ZPX default)
  pct               complex phase-coherent sigmoid attention (PCT defaults, SRPE)
  versor_gpa / versor_rra / versor_hybrid   Cl(4,1) Versor with each sequence mixer

Tasks (data from `zpx_hf.data_tasks` and `zpx_hf.data_geometry`):
  mqar            multi-query associative recall; answer-token accuracy
  passkey         pass-key retrieval trained at length L, tested at L, 2L, 4L; exact match (all digits)
  selective_copy  answer-token accuracy
  spiral          spiral chirality x winding, 4 classes; accuracy
  text            byte LM on the embedded pydoc corpus; held-out perplexity per byte
  nbody           5 bodies, G=1, dt=0.01, Verlet, walls +-2; teacher-forced next-state training, then a
                  50-step autoregressive rollout from 10 context states: position MSE and relative energy drift

Widths: each variant's hidden and intermediate sizes are searched so that its parameter count is within
`--tolerance` (10%) of the baseline's for that task (counted without an unused token embedding); the
counts are reported. Training: AdamW, linear warm-up then cosine decay, gradient clipping 1.0, the
same steps, batch size and learning rate for every variant; a plain PyTorch loop, seeded. Outputs in
benchmarks/results/: ablation_<size>.jsonl (one line per run), .csv (mean and std over seeds), .json
(runs, aggregate, parameter counts, machine), .md (tables) and ablation_<size>_*.png.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime
import json
import math
import multiprocessing
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
EVAL_SEED = 10_000  # evaluation data is the same for every training seed

# ---- variants -----------------------------------------------------------------------------------

VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {"family": "zpx", "config": {"lambda_angle": 0.0, "lambda_sphere": 0.0, "rotary": "rope"}},
    "softmax_srpe": {"family": "zpx", "config": {"lambda_angle": 0.0, "lambda_sphere": 0.0, "rotary": "srpe"}},
    "zpx_angle": {"family": "zpx", "config": {"lambda_angle": 1.0, "lambda_sphere": 0.0, "rotary": "rope"}},
    "zpx_angle_sphere": {"family": "zpx", "config": {"lambda_angle": 1.0, "lambda_sphere": 1.0, "rotary": "rope"}},
    "zpx_center": {
        "family": "zpx",
        "config": {"lambda_angle": 1.0, "lambda_sphere": 1.0, "rotary": "rope", "center_loss_weight": 1e-4},
    },
    "zpx_srpe": {"family": "zpx", "config": {"lambda_angle": 1.0, "lambda_sphere": 1.0, "rotary": "srpe"}},
    "pct": {"family": "pct", "config": {}},
    "versor_gpa": {"family": "versor", "config": {"mixer": "gpa"}},
    "versor_rra": {"family": "versor", "config": {"mixer": "rra"}},
    "versor_hybrid": {"family": "versor", "config": {"mixer": "hybrid"}},
}
VARIANT_LABELS = {
    "baseline": "softmax + RoPE (baseline)",
    "softmax_srpe": "softmax + SRPE",
    "zpx_angle": "ZPX angle, RoPE",
    "zpx_angle_sphere": "ZPX angle+sphere, RoPE",
    "zpx_center": "ZPX angle+sphere + centre loss",
    "zpx_srpe": "ZPX angle+sphere, SRPE",
    "pct": "PCT (sigmoid, complex)",
    "versor_gpa": "Versor GPA",
    "versor_rra": "Versor RRA",
    "versor_hybrid": "Versor hybrid",
}
# hidden-size granule (2 heads, even head dim; Versor: 32 coefficients per channel), nominal MLP ratio
FAMILY_SHAPE = {"zpx": (8, 8 / 3), "pct": (4, 8 / 3), "versor": (32, 2.0)}
TASKS = ("mqar", "passkey", "selective_copy", "spiral", "text", "nbody")


@dataclass
class SizeSpec:
    """Model and training budget of one suite size (identical for every variant)."""

    hidden: int
    layers: int
    heads: int
    steps: dict[str, int]
    batch: int
    lr: float
    eval_examples: int
    mqar_pairs: int
    passkey_length: int
    passkey_lengths: tuple[int, ...]
    copy_tokens: int
    copy_positions: int
    spiral_points: int
    text_seq_len: int
    text_blocks: int
    nbody_train: int
    nbody_eval: int
    seeds: int
    passkey_eval_examples: int
    # Versor's widest hidden size (None: free). Its RRA scan runs ~10x slower per parameter than softmax
    # attention on CPU, so the small suite caps it and reports the parameter mismatch.
    versor_max_hidden: int | None = None


SIZES = {
    "small": SizeSpec(
        hidden=64,
        layers=2,
        heads=2,
        steps={"mqar": 150, "passkey": 60, "selective_copy": 120, "spiral": 120, "text": 100, "nbody": 120},
        batch=8,
        lr=3e-3,
        eval_examples=48,
        mqar_pairs=4,
        passkey_length=112,
        passkey_lengths=(112, 224, 448),
        copy_tokens=4,
        copy_positions=12,
        spiral_points=24,
        text_seq_len=48,
        text_blocks=2000,
        nbody_train=256,
        nbody_eval=16,
        seeds=2,
        passkey_eval_examples=16,
        versor_max_hidden=64,
    ),
    "full": SizeSpec(
        hidden=128,
        layers=4,
        heads=2,
        steps={"mqar": 2000, "passkey": 1500, "selective_copy": 2000, "spiral": 1500, "text": 2000, "nbody": 2000},
        batch=32,
        lr=1e-3,
        eval_examples=256,
        mqar_pairs=12,
        passkey_length=256,
        passkey_lengths=(256, 512, 1024),
        copy_tokens=8,
        copy_positions=48,
        spiral_points=48,
        text_seq_len=256,
        text_blocks=20000,
        nbody_train=2048,
        nbody_eval=128,
        seeds=3,
        passkey_eval_examples=128,
    ),
}
NBODY_CONTEXT, NBODY_ROLLOUT = 10, 50
VERSOR_WIDTH_FACTOR = 4


# ---- model construction -------------------------------------------------------------------------


def family_config(variant: str, hidden: int, intermediate: int, spec: SizeSpec, vocab: int, max_pos: int) -> Any:
    """Config of `variant` at the given widths."""
    from zpx_hf import PCTConfig, VersorConfig, ZPXConfig

    entry = VARIANTS[variant]
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=spec.layers,
        # Versor: one multivector channel per head (head_dim 32) at every width.
        num_attention_heads=hidden // 32 if entry["family"] == "versor" else spec.heads,
        max_position_embeddings=max_pos,
        **entry["config"],
    )
    if entry["family"] == "zpx":
        config = ZPXConfig(phase_channels=4, **common)
        config._attn_implementation = "sdpa"
        return config
    if entry["family"] == "pct":
        return PCTConfig(**common)
    return VersorConfig(**common)


class SequenceRegressor:
    """Factory namespace for the continuous-sequence wrapper (built lazily so torch loads in workers)."""

    @staticmethod
    def build(backbone: Any, features: int) -> Any:
        import torch
        from torch import nn

        class Regressor(nn.Module):
            """linear in -> family backbone (`inputs_embeds`, causal) -> linear out."""

            def __init__(self) -> None:
                super().__init__()
                self.backbone = backbone
                probe = torch.zeros(1, 2, dtype=torch.long)
                with torch.no_grad():
                    in_width = backbone.get_input_embeddings()(probe).shape[-1]
                    out_width = backbone(input_ids=probe, use_cache=False).last_hidden_state.shape[-1]
                self.read_in = nn.Linear(features, in_width)
                self.read_out = nn.Linear(out_width, features)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                out = self.backbone(inputs_embeds=self.read_in(x), use_cache=False)
                # ZPX centre-cancellation regulariser, added to the regression loss like the LM heads do
                weight = getattr(self.backbone.config, "center_loss_weight", 0.0)
                center = getattr(out, "center_loss", None)
                self.aux_loss = weight * center if weight > 0 and center is not None else None
                return self.read_out(out.last_hidden_state)

            def counted_parameters(self) -> int:
                unused = sum(p.numel() for p in self.backbone.get_input_embeddings().parameters())
                return sum(p.numel() for p in self.parameters()) - unused

        return Regressor()


def build_model(variant: str, task: str, hidden: int, intermediate: int, spec: SizeSpec) -> Any:
    from transformers import AutoModel, AutoModelForCausalLM

    import zpx_hf  # noqa: F401  (registers the families)

    if task == "nbody":
        config = family_config(variant, hidden, intermediate, spec, vocab=4, max_pos=NBODY_CONTEXT + NBODY_ROLLOUT)
        features = 2 * 5 * 3
        return SequenceRegressor.build(AutoModel.from_config(config), features)
    max_pos = task_seq_len(task, spec)
    config = family_config(variant, hidden, intermediate, spec, vocab=260, max_pos=max_pos)
    return AutoModelForCausalLM.from_config(config)


def count_parameters(model: Any) -> int:
    if hasattr(model, "counted_parameters"):
        return int(model.counted_parameters())
    return sum(p.numel() for p in model.parameters())


def match_width(variant: str, task: str, spec: SizeSpec, target: int, tolerance: float) -> dict[str, Any]:
    """Hidden/intermediate sizes whose parameter count is nearest `target` with a near-nominal MLP ratio.

    Parameters are affine in the intermediate size at a fixed hidden size, so two builds per hidden size
    give the intermediate size that hits the target; it is rounded to the family granule and verified."""
    family = VARIANTS[variant]["family"]
    granule, ratio = FAMILY_SHAPE[family]
    inter_granule = 32 if family == "versor" else 8
    candidates = []
    base = max(granule, round(spec.hidden / granule) * granule)
    hiddens = sorted({max(granule, base + k * granule) for k in range(-4, 9)})
    if family == "versor":
        # Versor's grade-wise linears hold ~1/170 of a dense layer's weights, so at a matched count most of its
        # parameters sit in the embeddings; widths are searched up to VERSOR_WIDTH_FACTOR x the baseline (its
        # per-channel rotor algebra makes wider models very slow) and an unreachable count is reported as such.
        cap = spec.versor_max_hidden or VERSOR_WIDTH_FACTOR * spec.hidden
        hiddens = list(range(granule, cap + 1, granule))
    for hidden in hiddens:
        lo, hi = inter_granule, 16 * inter_granule
        p_lo = count_parameters(build_model(variant, task, hidden, lo, spec))
        p_hi = count_parameters(build_model(variant, task, hidden, hi, spec))
        slope = (p_hi - p_lo) / (hi - lo)
        if slope <= 0:
            continue
        inter = round((lo + (target - p_lo) / slope) / inter_granule) * inter_granule
        inter = int(min(max(inter, inter_granule), 12 * hidden))
        params = p_lo + slope * (inter - lo)
        error = abs(params - target) / target
        candidates.append((error > tolerance, abs(math.log(inter / (ratio * hidden))), error, hidden, inter))
    candidates.sort()
    _, _, _, hidden, inter = candidates[0]
    params = count_parameters(build_model(variant, task, hidden, inter, spec))
    return {
        "hidden": hidden,
        "intermediate": inter,
        "params": params,
        "target": target,
        "matched": abs(params - target) / target <= tolerance,
    }


# ---- data ---------------------------------------------------------------------------------------


def task_seq_len(task: str, spec: SizeSpec) -> int:
    if task == "mqar":
        return 2 + 4 * spec.mqar_pairs
    if task == "selective_copy":
        return 2 + spec.copy_positions + 2 * spec.copy_tokens
    if task == "spiral":
        return spec.spiral_points + 3
    if task == "passkey":
        return spec.passkey_length
    if task == "text":
        return spec.text_seq_len
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}.")


def lm_examples(task: str, num: int, seed: int, spec: SizeSpec, length: int | None = None) -> list[dict[str, Any]]:
    from zpx_hf.data_geometry import spiral_examples
    from zpx_hf.data_tasks import task_examples

    if task == "mqar":
        return task_examples("mqar", num, seed, task_seq_len(task, spec), num_pairs=spec.mqar_pairs)
    if task == "selective_copy":
        return task_examples(
            "selective_copy",
            num,
            seed,
            task_seq_len(task, spec),
            num_tokens=spec.copy_tokens,
            num_positions=spec.copy_positions,
        )
    if task == "passkey":
        length = length or spec.passkey_length
        return task_examples("passkey", num, seed, length, length=length)
    if task == "spiral":
        return spiral_examples(num, seed, num_points=spec.spiral_points, seq_len=task_seq_len(task, spec))
    raise ValueError(task)


def as_dataset(rows: list[dict[str, Any]]) -> Any:
    from datasets import Dataset

    keys = [k for k in ("input_ids", "attention_mask", "labels", "answer_mask") if k in rows[0]]
    return Dataset.from_dict({k: [r[k] for r in rows] for k in keys})


def text_data(spec: SizeSpec, seed: int) -> tuple[Any, Any]:
    from zpx_hf.data_tasks import pack_documents, pydoc_documents, split_documents

    train_docs, heldout_docs = split_documents(pydoc_documents(), 0.1, seed=0)
    train = pack_documents(train_docs, spec.text_seq_len, spec.text_blocks)
    heldout = pack_documents(heldout_docs, spec.text_seq_len, spec.eval_examples)
    return train, as_dataset([{"input_ids": b, "attention_mask": [1] * len(b), "labels": b} for b in heldout])


# ---- training -----------------------------------------------------------------------------------


def lr_lambda(steps: int) -> Callable[[int], float]:
    warmup = max(1, steps // 10)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    return schedule


def train_loop(model: Any, loss_fn: Callable[[Any], Any], sample: Callable[[Any], Any], steps: int, lr: float) -> list:
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(steps))
    generator = torch.Generator().manual_seed(0)
    losses = []
    model.train()
    for _ in range(steps):
        loss = loss_fn(sample(generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
    return losses


def lm_sampler(rows: list[list[int]] | dict[str, Any], batch: int) -> Callable[[Any], dict[str, Any]]:
    import torch

    tensors = {k: torch.tensor(v) for k, v in rows.items()}
    size = len(next(iter(tensors.values())))

    def sample(generator: Any) -> dict[str, Any]:
        index = torch.randint(0, size, (batch,), generator=generator)
        return {k: v[index] for k, v in tensors.items()}

    return sample


def run_lm_task(model: Any, task: str, spec: SizeSpec, seed: int, device: str = "cpu") -> dict[str, Any]:
    from zpx_hf.evaluation import perplexity, task_accuracy

    steps = spec.steps[task]
    if task == "text":
        train_blocks, heldout = text_data(spec, seed)
        rows = {"input_ids": train_blocks}
    else:
        train = lm_examples(task, steps * spec.batch, seed, spec)
        rows = {k: [r[k] for r in train] for k in ("input_ids", "attention_mask", "labels")}
    sample = lm_sampler(rows, spec.batch)

    def loss_fn(batch: dict[str, Any]) -> Any:
        batch = {k: v.to(device) for k, v in batch.items()}
        if "labels" not in batch:
            batch = {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}
        return model(**batch, use_cache=False).loss

    losses = train_loop(model, loss_fn, sample, steps, spec.lr)
    result: dict[str, Any] = {"final_train_loss": float(np.mean(losses[-10:]))}
    if task == "text":
        result["perplexity"] = perplexity(model, heldout, batch_size=16)["perplexity"]
    elif task == "passkey":
        for length in spec.passkey_lengths:
            data = as_dataset(lm_examples(task, spec.passkey_eval_examples, EVAL_SEED, spec, length=length))
            metrics = task_accuracy(model, data, batch_size=8)
            result[f"passkey_em@{length}"] = metrics["exact_match"]
            result[f"passkey_digit_acc@{length}"] = metrics["token_accuracy"]
    else:
        data = as_dataset(lm_examples(task, spec.eval_examples, EVAL_SEED, spec))
        metrics = task_accuracy(model, data, batch_size=32)
        result["accuracy"] = metrics["token_accuracy"]
        result["exact_match"] = metrics["exact_match"]
    return result


def nbody_data(spec: SizeSpec, seed: int, num: int) -> dict[str, np.ndarray]:
    from zpx_hf.data_geometry import nbody_trajectories

    return nbody_trajectories(num, seed, NBODY_CONTEXT + NBODY_ROLLOUT - 1)


def nbody_reference(spec: SizeSpec) -> dict[str, Any]:
    """Constant-velocity extrapolation and the simulator's own energy drift on the evaluation trajectories."""
    from zpx_hf.data_geometry import NBODY_DT, nbody_energy, split_state
    from zpx_hf.metrics import relative_energy_drift, rollout_mse

    data = nbody_data(spec, EVAL_SEED, spec.nbody_eval)
    x, v = split_state(data["states"].astype(np.float64), 5, 3)
    start = NBODY_CONTEXT - 1
    steps = np.arange(1, NBODY_ROLLOUT + 1)[None, :, None, None]
    pred_x = x[:, start : start + 1] + v[:, start : start + 1] * NBODY_DT * steps
    true_x = x[:, NBODY_CONTEXT:]
    final_e = nbody_energy(pred_x[:, -1], v[:, start], np.ones((len(x), 5)))
    return {
        "const_velocity_position_mse": rollout_mse(pred_x, true_x),
        "const_velocity_energy_drift": relative_energy_drift(final_e, data["energy"][:, start]),
        "simulator_energy_drift": relative_energy_drift(data["energy"][:, -1], data["energy"][:, start]),
    }


def run_nbody(model: Any, spec: SizeSpec, seed: int, device: str = "cpu") -> dict[str, Any]:
    import torch

    from zpx_hf.data_geometry import nbody_energy, split_state
    from zpx_hf.metrics import relative_energy_drift, rollout_mse

    train = torch.tensor(nbody_data(spec, seed, spec.nbody_train)["states"], device=device)
    mean, std = train.mean(dim=(0, 1)), train.std(dim=(0, 1))
    delta_std = (train[:, 1:] - train[:, :-1]).std(dim=(0, 1))
    steps = spec.steps["nbody"]

    def sample(generator: Any) -> Any:
        return train[torch.randint(0, len(train), (spec.batch,), generator=generator).to(device)]

    def loss_fn(states: Any) -> Any:
        pred = model((states[:, :-1] - mean) / std)
        target = (states[:, 1:] - states[:, :-1]) / delta_std
        loss = torch.nn.functional.mse_loss(pred, target)
        return loss if model.aux_loss is None else loss + model.aux_loss

    losses = train_loop(model, loss_fn, sample, steps, spec.lr)
    data = nbody_data(spec, EVAL_SEED, spec.nbody_eval)
    states = torch.tensor(data["states"], device=device)
    model.eval()
    with torch.no_grad():
        sequence = states[:, :NBODY_CONTEXT]
        for _ in range(NBODY_ROLLOUT):
            delta = model((sequence - mean) / std)[:, -1] * delta_std
            sequence = torch.cat((sequence, (sequence[:, -1] + delta)[:, None]), dim=1)
    pred = sequence[:, NBODY_CONTEXT:].double().cpu().numpy()
    true = states[:, NBODY_CONTEXT:].double().cpu().numpy()
    pred_x, pred_v = split_state(pred, 5, 3)
    true_x, _ = split_state(true, 5, 3)
    final_e = nbody_energy(pred_x[:, -1], pred_v[:, -1], np.ones((len(pred), 5)))
    drift = relative_energy_drift(final_e, data["energy"][:, NBODY_CONTEXT - 1])
    return {
        "final_train_loss": float(np.mean(losses[-10:])),
        "position_mse": rollout_mse(pred_x, true_x),
        "state_mse": rollout_mse(pred, true),
        "energy_drift": drift if math.isfinite(drift) else float("nan"),
    }


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One (variant, task, seed) training + evaluation; never raises (errors are recorded)."""
    import torch

    torch.set_num_threads(job.get("threads", 1))
    spec = SizeSpec(**job["spec"])
    row = {k: job[k] for k in ("variant", "task", "seed")}
    row.update({k: job["width"][k] for k in ("hidden", "intermediate", "params")})
    start = time.perf_counter()
    try:
        torch.manual_seed(job["seed"])
        model = build_model(job["variant"], job["task"], job["width"]["hidden"], job["width"]["intermediate"], spec)
        device = job.get("device", "cpu")
        model.to(device)
        if job["task"] == "nbody":
            row.update(run_nbody(model, spec, job["seed"], device))
        else:
            row.update(run_lm_task(model, job["task"], spec, job["seed"], device))
        row["status"] = "ok"
    except Exception as error:  # recorded in the results as "not run" with the reason
        row["status"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
        row["traceback"] = traceback.format_exc(limit=3)
    row["seconds"] = time.perf_counter() - start
    return row


# ---- reporting ----------------------------------------------------------------------------------

METRICS = {
    "mqar": [("accuracy", "MQAR acc", True)],
    "passkey": [],  # filled per size (one column per length)
    "selective_copy": [("accuracy", "sel. copy acc", True)],
    "spiral": [("accuracy", "spiral acc", True)],
    "text": [("perplexity", "text ppl/byte", False)],
    "nbody": [("position_mse", "N-body pos MSE", False), ("energy_drift", "N-body dE/E", False)],
}


def metric_columns(spec: SizeSpec, tasks: list[str]) -> list[tuple[str, str, str, bool]]:
    """(task, metric key, column label, higher is better)."""
    columns = []
    for task in tasks:
        if task == "passkey":
            for length in spec.passkey_lengths:
                tag = "" if length == spec.passkey_length else " (longer than trained)"
                columns.append((task, f"passkey_em@{length}", f"passkey EM @{length}{tag}", True))
        else:
            columns += [(task, key, label, better) for key, label, better in METRICS[task]]
    return columns


def summarise(runs: list[dict[str, Any]], spec: SizeSpec, tasks: list[str]) -> list[dict[str, Any]]:
    from zpx_hf.metrics import aggregate_runs

    keys = sorted({k for r in runs for k in r if k.startswith(("passkey_em@", "passkey_digit_acc@"))})
    metric_keys = ["accuracy", "exact_match", "perplexity", "position_mse", "state_mse", "energy_drift"]
    metric_keys += keys + ["final_train_loss", "seconds", "params"]
    return aggregate_runs([r for r in runs if r.get("status") == "ok"], ["variant", "task"], metric_keys)


def verdict(a: tuple[float, float], b: tuple[float, float], higher_better: bool) -> str:
    """`better`/`worse` than the baseline when the gap exceeds the sum of the two stds, else `~`."""
    (ma, sa), (mb, sb) = a, b
    if any(math.isnan(v) for v in (ma, mb)):
        return "-"
    gap = ma - mb if higher_better else mb - ma
    if abs(ma - mb) <= (sa or 0) + (sb or 0):
        return "~"
    return "better" if gap > 0 else "worse"


def findings(
    by: dict[tuple[str, str], dict[str, Any]],
    columns: list[tuple[str, str, str, bool]],
    variants: list[str],
    reference: dict[str, Any] | None,
) -> list[str]:
    """One generated sentence per metric: best variant, baseline, and who is better/worse beyond noise."""
    from zpx_hf.metrics import format_mean_std

    lines = ["Findings (generated from the numbers above):", ""]
    for task, key, label, higher in columns:
        scored = [(v, by[(v, task)]) for v in variants if f"{key}_mean" in by.get((v, task), {})]
        if not scored:
            continue
        digits = 4 if key == "position_mse" else 3
        best_value = (max if higher else min)(row[f"{key}_mean"] for _, row in scored)
        best = [v for v, row in scored if abs(row[f"{key}_mean"] - best_value) <= 1e-9]
        names = "all variants tied" if len(best) == len(scored) else ", ".join(best)
        text = f"- {label}: best {names} ({best_value:.{digits}f})"
        base = by.get(("baseline", task), {})
        if f"{key}_mean" in base:
            text += f"; baseline {format_mean_std(base[f'{key}_mean'], base[f'{key}_std'], digits)}"
            pair = (base[f"{key}_mean"], base[f"{key}_std"])
            groups: dict[str, list[str]] = {"better": [], "worse": []}
            for v, row in scored:
                if v != "baseline":
                    mark = verdict((row[f"{key}_mean"], row[f"{key}_std"]), pair, higher)
                    groups.setdefault(mark, []).append(v)
            text += f"; better than baseline beyond noise: {', '.join(groups['better']) or 'none'}"
            text += f"; worse: {', '.join(groups['worse']) or 'none'}"
        if len(best) == len(scored):
            text += " (all variants identical: the task was not learned at this budget)"
        if key == "position_mse" and reference:
            beating = [v for v, row in scored if row[f"{key}_mean"] < reference["const_velocity_position_mse"]]
            text += (
                f"; constant-velocity extrapolation scores {reference['const_velocity_position_mse']:.4f}, "
                f"beaten by: {', '.join(beating) or 'no trained variant'}"
            )
        lines.append(text + ".")
    if any(c[0] == "passkey" for c in columns):
        length = next(c[1].split("@")[1] for c in columns if c[0] == "passkey")
        passkey = [
            f"{v} {by[(v, 'passkey')][f'passkey_digit_acc@{length}_mean']:.2f}"
            for v in variants
            if f"passkey_digit_acc@{length}_mean" in by.get((v, "passkey"), {})
        ]
        if passkey:
            lines.append(
                f"- passkey digit accuracy at the trained length {length} (chance 0.10): {', '.join(passkey)}."
            )
    return lines


def markdown(
    aggregate: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    widths: dict[str, dict[str, Any]],
    spec: SizeSpec,
    meta: dict[str, Any],
    variants: list[str],
    tasks: list[str],
    reference: dict[str, Any] | None,
) -> str:
    from zpx_hf.metrics import format_mean_std

    by = {(r["variant"], r["task"]): r for r in aggregate}
    columns = metric_columns(spec, tasks)
    lines = [
        f"Command: `{meta['command']}` — {meta['date']} — {meta['machine']}. "
        f"{meta['seeds']} seeds, mean ± sample std; {meta['wall_minutes']:.1f} min wall clock.",
        "",
        f"Budget per run (every variant): {spec.layers} layers, baseline hidden {spec.hidden}, batch {spec.batch}, "
        f"AdamW lr {spec.lr}, steps "
        + ", ".join(f"{t} {spec.steps[t]}" for t in tasks)
        + f". Accuracy metrics: {spec.eval_examples} held-out examples ({spec.passkey_eval_examples} for passkey, "
        f"{spec.nbody_eval} N-body trajectories; fixed evaluation seed). ZPX: 4 phase channels per head, lambdas 1, "
        "centre-loss weight 1e-4; PCT: defaults (tau = sqrt(d), SRPE); Versor: one multivector channel per head.",
        "",
        "| variant | " + " | ".join(c[2] + (" ↑" if c[3] else " ↓") for c in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    failures: dict[tuple[str, str], str] = {}
    for r in runs:
        if r.get("status", "ok") != "ok":
            failures[(r["variant"], r["task"])] = r["status"]
    for variant in variants:
        cells = []
        for task, key, _, _ in columns:
            row = by.get((variant, task))
            if row and f"{key}_mean" in row:
                digits = 4 if key == "position_mse" else 3
                cells.append(format_mean_std(row[f"{key}_mean"], row[f"{key}_std"], digits))
            else:
                cells.append("not run" if (variant, task) in failures else "-")
        lines.append(f"| {VARIANT_LABELS[variant]} | " + " | ".join(cells) + " |")
    if reference and "nbody" in tasks:
        lines += [
            "",
            "N-body references on the same evaluation trajectories: constant-velocity extrapolation position MSE "
            f"{reference['const_velocity_position_mse']:.4f} "
            f"(energy drift {reference['const_velocity_energy_drift']:.3f}); "
            f"the simulator's own relative energy change over the 50-step window "
            f"{reference['simulator_energy_drift']:.4f}.",
        ]
    lines += ["", *findings(by, columns, variants, reference)]
    if "baseline" in variants:
        lines += [
            "",
            "Versus the baseline (`better`/`worse`: the mean gap exceeds the sum of the two stds; `~`: within noise):",
            "",
            "| variant | " + " | ".join(c[2] for c in columns) + " |",
            "|---|" + "---|" * len(columns),
        ]
        for variant in variants:
            if variant == "baseline":
                continue
            cells = []
            for task, key, _, higher in columns:
                a, b = by.get((variant, task), {}), by.get(("baseline", task), {})
                if f"{key}_mean" in a and f"{key}_mean" in b:
                    cells.append(
                        verdict((a[f"{key}_mean"], a[f"{key}_std"]), (b[f"{key}_mean"], b[f"{key}_std"]), higher)
                    )
                else:
                    cells.append("-")
            lines.append(f"| {VARIANT_LABELS[variant]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Parameter counts (hidden / intermediate / parameters; N-body excludes the unused token embedding; "
        "`*` = outside the ±10% match):",
        "",
        "| variant | " + " | ".join(tasks) + " |",
        "|---|" + "---:|" * len(tasks),
    ]
    for variant in variants:
        cells = []
        for task in tasks:
            w = widths.get(f"{variant}/{task}")
            if w is None:
                cells.append("-")
            else:
                star = "" if w["matched"] else "*"
                cells.append(f"{w['hidden']} / {w['intermediate']} / {w['params']:,}{star}")
        lines.append(f"| {VARIANT_LABELS[variant]} | " + " | ".join(cells) + " |")
    unmatched = sorted({k.split("/")[0] for k, w in widths.items() if not w["matched"]} & set(variants))
    if unmatched:
        reason = ""
        if any(VARIANTS[v]["family"] == "versor" for v in unmatched):
            cap = spec.versor_max_hidden or VERSOR_WIDTH_FACTOR * spec.hidden
            reason = (
                f" Versor's hidden size is capped at {cap} in this suite size: its grade-wise linear layers hold far "
                "fewer weights than dense ones, so a matched count would need a much wider model whose per-channel "
                "rotor algebra is too slow here; its rows are smaller models than the baseline, not "
                "parameter-matched ones."
            )
        lines += ["", f"Not parameter-matched: {', '.join(unmatched)}.{reason}"]
    if failures:
        lines += ["", "Runs that did not complete:", ""]
        for (variant, task), status in sorted(failures.items()):
            lines.append(f"- {variant} / {task}: {status}")
    return "\n".join(lines) + "\n"


def plots(aggregate: list[dict[str, Any]], spec: SizeSpec, variants: list[str], tasks: list[str], stem: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["variant"], r["task"]): r for r in aggregate}
    columns = [c for c in metric_columns(spec, tasks) if not c[1].startswith("passkey_em@")]
    paths = []
    if columns:
        cols = min(3, len(columns))
        rows = math.ceil(len(columns) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), dpi=100, squeeze=False)
        for ax, (task, key, label, higher) in zip(axes.flat, columns):
            names, means, stds = [], [], []
            for variant in variants:
                row = by.get((variant, task), {})
                if f"{key}_mean" in row:
                    names.append(variant)
                    means.append(row[f"{key}_mean"])
                    stds.append(row[f"{key}_std"])
            ax.barh(range(len(names)), means, xerr=stds, color="tab:blue", alpha=0.8)
            ax.set_yticks(range(len(names)), names, fontsize=8)
            ax.invert_yaxis()
            ax.set_title(f"{label} ({'higher' if higher else 'lower'} is better)", fontsize=9)
            if means and min(means) > 0 and max(means) / min(means) > 20:
                ax.set_xscale("log")
            ax.grid(axis="x", alpha=0.3)
        for ax in list(axes.flat)[len(columns) :]:
            ax.axis("off")
        fig.tight_layout()
        path = stem.parent / f"{stem.name}_tasks.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    if "passkey" in tasks:
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        for variant in variants:
            row = by.get((variant, "passkey"), {})
            xs = [n for n in spec.passkey_lengths if f"passkey_em@{n}_mean" in row]
            if xs:
                ys = [row[f"passkey_em@{n}_mean"] for n in xs]
                es = [row[f"passkey_em@{n}_std"] for n in xs]
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=variant)
        ax.axvline(spec.passkey_length, color="gray", linestyle=":", label="trained length")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("pass-key exact match")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = stem.parent / f"{stem.name}_passkey.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} CPU cores, torch {torch.__version__}, Python {platform.python_version()}"


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default: 2 small, 3 full)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--workers", type=int, default=2, help="parallel worker processes (1 thread each)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda: models train on the GPU, fp32)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="parameter-count match tolerance")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--tag", default=None, help="output file stem (default ablation_<size>)")
    parser.add_argument("--steps-scale", type=float, default=1.0, help="scale every step count (smoke tests only)")
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="re-render csv/md/png from a saved ablation_<size>.json, no training",
    )
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    spec = SIZES[args.size]
    if args.steps_scale != 1.0:
        spec = SizeSpec(
            **{**asdict(spec), "steps": {k: max(1, round(v * args.steps_scale)) for k, v in spec.steps.items()}}
        )
    seeds = args.seeds or spec.seeds
    tag = args.tag or f"ablation_{args.size}"
    args.output.mkdir(parents=True, exist_ok=True)
    stem = args.output / tag
    started = time.perf_counter()

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        meta, widths, runs = saved["meta"], saved["widths"], saved["runs"]
        spec = SizeSpec(**{**meta["size"], "passkey_lengths": tuple(meta["size"]["passkey_lengths"])})
        reference = nbody_reference(spec) if any(r["task"] == "nbody" for r in runs) else None
        write_outputs(runs, widths, spec, meta, args.variants, args.tasks, reference, stem)
        return
    widths: dict[str, dict[str, Any]] = {}
    for task in args.tasks:
        target = count_parameters(
            build_model("baseline", task, spec.hidden, int(FAMILY_SHAPE["zpx"][1] * spec.hidden) // 8 * 8, spec)
        )
        for variant in args.variants:
            widths[f"{variant}/{task}"] = match_width(variant, task, spec, target, args.tolerance)
        print(f"[widths] {task}: target {target:,}", flush=True)
    print(f"[widths] done in {time.perf_counter() - started:.0f}s", flush=True)

    # Longest jobs first (passkey/text, Versor) so the pool does not end on one straggler.
    cost = {"passkey": 0, "text": 1, "nbody": 2, "selective_copy": 3, "spiral": 4, "mqar": 5}
    jobs = [
        {
            "variant": variant,
            "task": task,
            "seed": seed,
            "spec": asdict(spec),
            "width": widths[f"{variant}/{task}"],
            "device": args.device,
        }
        for task in sorted(args.tasks, key=lambda t: cost.get(t, 9))
        for variant in sorted(args.variants, key=lambda v: VARIANTS[v]["family"] != "versor")
        for seed in range(seeds)
    ]
    runs: list[dict[str, Any]] = []
    with open(stem.with_suffix(".jsonl"), "w") as log:
        # CUDA cannot be used in forked children once initialised: spawn workers for GPU runs.
        context = multiprocessing.get_context("spawn" if args.device != "cpu" else None)
        with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
            for future in concurrent.futures.as_completed([pool.submit(run_job, job) for job in jobs]):
                row = future.result()
                runs.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
                shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "traceback"}
                print(f"[{len(runs)}/{len(jobs)}] {shown}", flush=True)

    runs.sort(key=lambda r: (list(VARIANTS).index(r["variant"]), list(TASKS).index(r["task"]), r["seed"]))
    reference = nbody_reference(spec) if "nbody" in args.tasks else None
    meta = {
        "command": " ".join(["python benchmarks/ablation.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine() + (f", trained on {gpu_name()}" if args.device != "cpu" else ""),
        "seeds": seeds,
        "wall_minutes": (time.perf_counter() - started) / 60,
        "size": asdict(spec),
    }
    write_outputs(runs, widths, spec, meta, args.variants, args.tasks, reference, stem)


def write_outputs(
    runs: list[dict[str, Any]],
    widths: dict[str, dict[str, Any]],
    spec: SizeSpec,
    meta: dict[str, Any],
    variants: list[str],
    tasks: list[str],
    reference: dict[str, Any] | None,
    stem: Path,
) -> None:
    """ablation_<size>.json / .csv / .md / *.png from the per-seed runs."""
    variants = [v for v in variants if any(r["variant"] == v for r in runs)]
    tasks = [t for t in tasks if any(r["task"] == t for r in runs)]
    aggregate = summarise(runs, spec, tasks)
    with open(stem.with_suffix(".json"), "w") as f:
        json.dump(
            {"meta": meta, "widths": widths, "nbody_reference": reference, "aggregate": aggregate, "runs": runs},
            f,
            indent=1,
        )
    fields = sorted({k for row in aggregate for k in row}, key=lambda k: (k not in ("variant", "task", "n"), k))
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(aggregate)
    text = markdown(aggregate, runs, widths, spec, meta, variants, tasks, reference)
    figures = plots(aggregate, spec, variants, tasks, stem)
    if figures:
        text += "\n" + "\n".join(f"![{p.stem}](benchmarks/results/{p.name})" for p in figures) + "\n"
    stem.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
