"""The evidence protocol's data: task budgets, suite sizes, data seeds and each task's selection metric.

A `SizeSpec` is one suite size (`sizes.SIZES`); a `TaskBudget` one task's training budget and generator
parameters, identical for every variant. Rows record the budget's fingerprint, so a changed budget reruns its task.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

EVAL_SEED = 10_000  # test data: the same for every training seed and variant

VAL_SEED = 20_000  # validation data (lr selection, curves): its own seed, distinct from test and training seeds

SELECT_SEED = 0  # the training seed of the lr-selection runs: never tested in a comparison, never reported
# Half-decade steps an lr grid widens along. 1e-1 and 3e-1: N-body picks reached 3e-2 (the optimum may lie above);
# a run that diverges there is scored as the worst, so a top rung costs a run, not a wrong pick.
LR_LADDER = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)


def widen_grid(
    start: Sequence[float], value: Callable[[float], float | None], ladder: Sequence[float] = LR_LADDER
) -> dict:
    """The lr grid as widened so far and its pick (the lowest `value`; negate a higher-is-better metric).

    `value(lr)`: the selection run's metric, None while it has not run, non-finite for a failed run. A pick on the
    grid's edge adds the next ladder lr beyond that edge, until the pick is interior or at the ladder's end (then
    `edge` stays true: the optimum may lie outside). While a grid run is missing `pick` is None and `provisional`
    is the pick of the last complete grid (None while a run of `start` is missing). Ties go to the lower lr."""
    grid, provisional = sorted(start), None
    while True:
        missing = [lr for lr in grid if value(lr) is None]
        if missing:
            return {
                "grid": grid,
                "pick": None,
                "missing": missing,
                "edge": provisional is not None,
                "provisional": provisional,
            }
        values = [float(value(lr)) for lr in grid]  # type: ignore[arg-type]
        finite = [(v, i) for i, v in enumerate(values) if math.isfinite(v)]
        if not finite:
            return {"grid": grid, "pick": None, "missing": [], "edge": False, "provisional": None, "failed": True}
        pick = grid[min(finite)[1]]
        index = ladder.index(pick) if pick in ladder else None
        if pick == grid[0] and index and len(grid) > 1:
            grid.insert(0, ladder[index - 1])
        elif pick == grid[-1] and index is not None and index < len(ladder) - 1 and len(grid) > 1:
            grid.append(ladder[index + 1])
        else:
            edge = len(grid) > 1 and pick in (grid[0], grid[-1])
            return {
                "grid": grid,
                "pick": pick,
                "missing": [],
                "edge": edge,
                "provisional": None,
                "values": dict(zip(grid, values)),
            }
        provisional = pick


@dataclass(frozen=True)
class TaskBudget:
    """Training budget and task shape of one task (identical for every variant)."""

    steps: int
    batch: int
    lr: float
    params: dict[str, Any] = field(default_factory=dict)  # generator parameters (see `task_seq_len`)
    weight_decay: float = 0.01
    warmup: int = 50

    def fingerprint(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class SizeSpec:
    """Model shape, per-task budgets and evaluation sizes of one suite size."""

    hidden: int
    layers: int
    heads: int
    budgets: dict[str, TaskBudget]
    eval_examples: int
    passkey_multiples: tuple[int, ...]
    passkey_eval_examples: int
    seeds: int
    versor_max_hidden: int | None = None
    protocol: str = ""  # protocol id recorded in every row (a changed protocol gets a new id)
    lrs: tuple[float, ...] = ()  # learning-rate grid, selected on validation (empty: the budget's lr only)
    checkpoints: tuple[float, ...] = ()  # fractions of the step budget at which validation accuracy is recorded
    val_examples: int = 0  # validation examples (trained length), 0: no validation

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SizeSpec:
        budgets = {task: TaskBudget(**b) for task, b in data["budgets"].items()}
        tuples = {k: tuple(data[k]) for k in ("passkey_multiples", "lrs", "checkpoints") if k in data}
        return cls(**{**data, "budgets": budgets, **tuples})

    def lr_grid(self, task: str) -> tuple[float, ...]:
        return self.lrs or (self.budgets[task].lr,)

    def multiples(self, task: str) -> tuple[int, ...]:
        """Evaluated multiples of the trained length: the extrapolation protocol (passkey) or 1x only."""
        return self.passkey_multiples if task == "passkey" else (1,)

    def passkey_lengths(self, task: str = "passkey") -> list[int]:
        length = self.budgets[task].params["length"]
        return [length * m for m in self.multiples(task)]


# the validation metric of a task's lr selection and curves: (key, higher is better)
SELECTION = {
    "mqar": ("val_accuracy", True),
    "selective_copy": ("val_accuracy", True),
    "spiral": ("val_accuracy", True),
    "listops": ("val_accuracy", True),
    "passkey": ("val_passkey_digit_acc@1x", True),
    "passkey_long": ("val_passkey_digit_acc@1x", True),
    "text": ("val_perplexity", False),
    "nbody": ("val_select_score", False),  # nbody.SELECT_ON: the budget's params["select_on"]
}
