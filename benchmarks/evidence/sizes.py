"""The suite's sizes: model shape, per-task budgets and evaluation sizes of each `--size`, and the lr grid.

`evidence` (the current protocol, 2-core CPU), `evidence_smoke` (its machinery in about a minute per task) and
`full` (the seeds' scale, a GPU). The superseded `small` and `medium` protocols' results are frozen files
(docs/evidence_superseded.md); their calibration (results/calibration_medium.md) gave the budgets kept here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from benchmarks.evidence.nbody import NBODY_PROTOCOL
from benchmarks.evidence.protocol import SizeSpec, TaskBudget

TASKS = ("mqar", "passkey", "passkey_long", "selective_copy", "spiral", "text", "nbody", "listops")  # `tasks`, `nbody`
NEEDLE_80 = {"length": 80, "num_needles": 2, "num_distractors": 2, "num_digits": 2, "compact": True}
# LRA ListOps' generator settings (lra_benchmarks/data/listops.py flags): 500 < tokens < 2,000, depth 10, 10 args
LISTOPS_LRA = {"min_length": 500, "max_length": 2000, "max_depth": 10, "max_args": 10}
# the same task at a size a CPU trains in seconds (tests, smoke runs)
LISTOPS_TINY = {"min_length": 4, "max_length": 48, "max_depth": 4, "max_args": 4}
# Budgets of the superseded medium protocol that the evidence protocol keeps, from results/calibration_medium.md: the
# baseline's MQAR answer accuracy passes 0.9 within these steps and spiral is well above chance (a shared 2-core
# CPU). N-body: NBODY_PROTOCOL since issue 21 (the medium rows ran the earlier `delta` target;
# results/nbody_protocol.md).
MEDIUM_BUDGETS = {
    "mqar": TaskBudget(
        steps=300, batch=64, lr=1e-3, params={"num_pairs": 4, "num_queries": 8, "query_replacement": True}
    ),
    "spiral": TaskBudget(steps=400, batch=64, lr=1e-3, params={"num_points": 24}),
    "nbody": TaskBudget(steps=300, batch=16, lr=1e-3, params=NBODY_PROTOCOL),
}
# The evidence N-body protocol selects its lr on rollout and one-step error together (issue 37, item 3: rollout alone
# picked smooth under-fits, training losses 2-6x the best lr's); `nbody.SELECT_ON`
NBODY_SELECTED = {**NBODY_PROTOCOL, "select_on": "rollout_onestep"}
LR_GRID = (3e-4, 1e-3, 3e-3)  # the evidence protocol's learning rates (issue 21), selected on validation
MAX_TIER = 3  # the evidence plan's default last tier: tier 4 (spiral) only with --max-tier 4


def _budgets(steps: dict[str, int], batch: int, lr: float, params: dict[str, dict[str, Any]], **extra: Any) -> dict:
    return {task: TaskBudget(steps=steps[task], batch=batch, lr=lr, params=params[task], **extra) for task in steps}


SIZES = {
    # The evidence suite's machinery at the small size in about a minute per task (tests, quick checks)
    "evidence_smoke": SizeSpec(
        hidden=32,
        layers=1,
        heads=2,
        budgets=_budgets(
            {"mqar": 16, "passkey": 16, "passkey_long": 8, "spiral": 16, "nbody": 16, "listops": 16},
            batch=4,
            lr=1e-3,
            warmup=4,
            params={
                "mqar": {"num_pairs": 2},
                "passkey": {"length": 40, "num_digits": 2, "compact": True},
                "passkey_long": {"length": 64, "num_digits": 2, "compact": True},
                "spiral": {"num_points": 8},
                "listops": LISTOPS_TINY,
                "nbody": {
                    **NBODY_SELECTED,
                    "train_length": 60,
                    "train_trajectories": 16,
                    "val_trajectories": 8,
                    "eval_trajectories": 8,
                    "zero_shot_trajectories": 8,
                },
            },
        ),
        eval_examples=16,
        passkey_multiples=(1, 2),
        passkey_eval_examples=8,
        seeds=2,
        versor_max_hidden=64,
        protocol="evidence-smoke-v1",
        lrs=LR_GRID,
        checkpoints=(1 / 4, 1 / 2, 1),
        val_examples=8,
    ),
    # The evidence suite (issue 21): the medium protocol's model and budgets, every variant tuned over the lr grid on a
    # validation split, test numbers at the selected lr, curves, per-example hits for the bootstrap.
    "evidence": SizeSpec(
        hidden=128,
        layers=2,
        heads=4,
        budgets={
            "mqar": MEDIUM_BUDGETS["mqar"],
            # the extrapolation protocol: trained at 80 tokens, tested at 1, 2, 4, 8x. 800 steps: the baseline's
            # calibration curves at lr 1e-3 are at 0.92 / 0.94 / 0.73 there (0.95 / 0.96 / 0.83 at 1,000); medium's
            # 1,600 does not fit the lr grid and 5 seeds in the 5-hour CPU budget. The curves show every variant's
            # accuracy against steps, so a variant still rising at 800 is visible as such
            "passkey": TaskBudget(steps=800, batch=32, lr=1e-3, params=NEEDLE_80),
            # the same-length protocol (the PCT paper's setting, as long as a 2-core CPU allows): train = test = 512,
            # the same tokens per step as the 80-token needle's batch 32 x 1.6; not calibrated (see the curves)
            "passkey_long": TaskBudget(steps=400, batch=8, lr=1e-3, params={**NEEDLE_80, "length": 512}),
            "spiral": MEDIUM_BUDGETS["spiral"],
            # NBODY_PROTOCOL: 200 test trajectories (issue 21), selected on rollout and one-step error (issue 37)
            "nbody": replace(MEDIUM_BUDGETS["nbody"], params=NBODY_SELECTED),
        },
        eval_examples=512,
        passkey_multiples=(1, 2, 4, 8),
        passkey_eval_examples=512,
        seeds=5,
        versor_max_hidden=512,  # Versor at matched parameters: hidden 512 reaches the baseline's ~469K
        protocol="evidence-v1",
        lrs=LR_GRID,
        checkpoints=(1 / 8, 1 / 4, 1 / 2, 1),
        val_examples=256,
    ),
    # The seeds' own scale, for a GPU (`--device cuda`): the evidence protocol (lr grid, validation, 5 headline
    # seeds, curves) at 4 layers, the needle trained at 2,048 tokens and tested up to 8x (16K), trained and
    # tested at 16,384 tokens (seed 003's NIAH length), and LRA ListOps at LRA's lengths (up to 2,000 tokens) and
    # training budget (5,000 steps x batch 32; fresh expressions every step where LRA has a fixed 96K set).
    "full": SizeSpec(
        hidden=128,
        layers=4,
        heads=2,
        budgets={
            **_budgets(
                {"mqar": 2000, "spiral": 1500, "nbody": 2000},
                batch=32,
                lr=1e-3,
                params={
                    "mqar": {"num_pairs": 12, "num_queries": 24, "query_replacement": True},
                    "spiral": {"num_points": 48},
                    "nbody": {**NBODY_SELECTED, "train_trajectories": 2048, "eval_trajectories": 512},
                },
            ),
            "passkey": TaskBudget(steps=3000, batch=16, lr=1e-3, params={**NEEDLE_80, "length": 2048}),
            "passkey_long": TaskBudget(steps=2000, batch=4, lr=1e-3, params={**NEEDLE_80, "length": 16384}),
            "listops": TaskBudget(steps=5000, batch=32, lr=1e-3, params=LISTOPS_LRA),
        },
        eval_examples=512,
        passkey_multiples=(1, 2, 4, 8),
        passkey_eval_examples=512,
        seeds=5,
        versor_max_hidden=1024,
        protocol="full-v1",
        lrs=LR_GRID,
        checkpoints=(1 / 8, 1 / 4, 1 / 2, 1),
        val_examples=512,
    ),
}
