"""The training loop every run shares (token tasks, N-body, calibration, the PCT sweep) and its batch seeds.

AdamW, linear warm-up, then a constant learning rate, gradient clipping 1.0; with a constant rate a run of N steps
is the first N steps of a longer one, which is what the calibration measures.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.evidence.protocol import TaskBudget
from benchmarks.measure import clock  # the one wall clock of every benchmark


def train_seed(seed: int, step: int) -> int:
    """Data seed of run seed `seed`'s batch at `step`: >= 1,000,003, so never EVAL_SEED or VAL_SEED."""
    return 1_000_003 * (seed + 1) + step


def train_loop(
    model: torch.nn.Module,
    loss_fn: Callable[[int], torch.Tensor],
    budget: TaskBudget,
    probe: Callable[[int], bool] | None = None,
    probe_every: int = 0,
) -> dict[str, Any]:
    """AdamW, warm-up then constant lr; `loss_fn(step)` builds its own batch. Stops after `budget.steps`, or when
    `probe(step)` returns True (calibration; the evidence suite's curve probe never stops a run)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=budget.lr, weight_decay=budget.weight_decay)
    warmup = max(1, budget.warmup)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    losses: list[float] = []
    model.train()
    start = clock()
    step = 0
    for step in range(budget.steps):
        loss = loss_fn(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"training loss became {losses[-1]} at step {step}")
        if probe is not None and probe_every and (step + 1) % probe_every == 0 and probe(step + 1):
            break
    model.train()
    return {
        "steps_done": step + 1,
        "train_seconds": clock() - start,
        "final_train_loss": float(np.mean(losses[-20:])),
    }
