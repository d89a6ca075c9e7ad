"""N-body task of the evidence suite: protocol, training, rollout evaluation, zero-shot tests and references.

Protocol (identical for every variant; lr is the suite's per-variant choice through `TaskBudget.lr`). A state
is `[x (n dim), v (n dim)]` (`zpx_hf_train.data_geometry`: 5 bodies, 3-D, G = 1, dt = 0.01, velocity Verlet,
walls at +-2). The model reads normalised states `(s - mean) / std` (training statistics) and predicts the
normalised next-step target `y / y_std`, teacher-forced over windows of the training trajectories, then rolls
out `rollout` steps autoregressively from `context` true states. Targets (`params["target"]`):

    delta:        y = s_{t+1} - s_t                                  (the protocol before issue 21)
    cv_residual:  y = s_{t+1} - s_t - [v_t dt, 0]                    (the default)
                    = [x_{t+1} - x_t - v_t dt,  v_t+1 - v_t]  = [~a dt^2 / 2, ~a dt]  for Verlet

`delta` asks the network to reproduce x_{t+1} - x_t = v_t dt + a dt^2 / 2, whose v_t dt part is 60x larger
than the acceleration part (std 7e-3 vs 1.2e-4 on the training states): a 1.5% error on it already loses to
constant velocity in one step, and 300 teacher-forced steps leave ~16% (one-step position MSE 100x constant
velocity's; results/nbody_protocol.md). `cv_residual` is the integrator prior of learned simulators (predict
the acceleration, integrate): a zero output is constant-velocity extrapolation, so beating it takes forces
predicted better than zero.

`noise` (optional, default 0) adds Gaussian input noise of `noise` x the per-feature target std to the
teacher-forced inputs and takes the target from the noisy state, so the model learns to pull a drifted
state back (input-noise training of learned simulators).

Evaluation: `eval_trajectories` test trajectories (seed NBODY_TEST_SEED) and `val_trajectories` validation
trajectories (NBODY_VAL_SEED, for the suite's lr selection), never a training seed (those are the run
seeds 0, 1, ...). Rows carry per-trajectory test errors so the suite can bootstrap over trajectories.
Zero-shot tests of the Versor paper on the test initial conditions, the trained model unchanged. The seed
(Versor write-up, section 5.2) defines them as:

    隐藏速度： • 挑战：不提供速度输入，要求推断动量
              • 结果：Versor 通过递归状态历史推断动量（0.003 MSE）
    分布外质量： • 挑战：测试时使用比训练时重 10 倍的粒子质量
                • 结果：Versor 的误差 反而改善 了 -19.9%  • 对比：Transformer 灾难性失败，误差暴增 +3097.2%

(hidden velocity: no velocity input, infer the momentum; OOD mass: test particles 10x heavier than in training)
here: `mass10_*` simulates the same initial states with every mass 10 (training: 1); `hidden_velocity_*`
zeroes the velocity half of every model input (context and rolled-out states) and scores positions. The
paper's third test (3 / 7 bodies) needs one token per body, where a token here is one 30-feature time step: it
runs in `nbody_bodies` / `nbody_geometry` (body tokens, equivariance errors, zero-shot body counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.evidence.protocol import TaskBudget
from benchmarks.evidence.training import train_loop, train_seed
from zpx_hf_train.data_geometry import NBODY_DT, nbody_energy, nbody_trajectories, split_state
from zpx_hf_train.metrics import relative_energy_drift, rollout_mse

NBODY = {"bodies": 5, "dim": 3}


NBODY_VAL_SEED = 20_000  # validation (lr selection) and test trajectories: seeds no training run uses


NBODY_TEST_SEED = 30_000


ZERO_SHOT_MASS = 10.0


TARGETS = ("delta", "cv_residual")


# The lr-selection score a row records as `val_select_score` (lower is better; CV: constant velocity on the same
# trajectories):
#   rollout:          log(rollout / CV)                                   (the protocol before issue 37)
#   rollout_onestep:  1/2 [log(rollout / CV) + log(one-step / CV)]        (nbody_geometry's; issue 37, item 3)
# Rollout alone rewards a smooth under-fit (a model near zero output is constant velocity, which rolls out well);
# the one-step term makes a pick also predict the next state.
SELECT_ON = {  # rule: the score in words (the evidence report's protocol text)
    "rollout": "log(rollout position MSE / CV's)",
    "rollout_onestep": "1/2 [log(rollout position MSE / CV's) + log(one-step position MSE / CV's)]",
}


def select_rule(params: dict[str, Any]) -> str:
    """The protocol's selection rule (SELECT_ON): `params["select_on"]`, `rollout` for protocols before issue 37."""
    return params.get("select_on", "rollout")


NBODY_PROTOCOL = {
    "context": 10,
    "rollout": 50,
    "train_length": 100,
    "train_trajectories": 200,
    "val_trajectories": 100,
    "eval_trajectories": 200,
    "zero_shot_trajectories": 100,
    "target": "cv_residual",
    "noise": 0.0,
}


def check_protocol(params: dict[str, Any]) -> None:
    """Fail early on a protocol the code would misread."""
    missing = [
        k for k in ("context", "rollout", "train_length", "train_trajectories", "eval_trajectories") if k not in params
    ]
    if missing:
        raise ValueError(f"nbody params lack {missing}; start from benchmarks.evidence.nbody.NBODY_PROTOCOL.")
    if params.get("target", "delta") not in TARGETS:
        raise ValueError(f"nbody params target={params['target']!r}: use one of {TARGETS}.")
    if select_rule(params) not in SELECT_ON:
        raise ValueError(f"nbody params select_on={params['select_on']!r}: use one of {tuple(SELECT_ON)}.")
    if params["context"] + params["rollout"] > params["train_length"]:
        raise ValueError("nbody params: context + rollout must not exceed train_length (the trajectory length).")


def nbody_data(params: dict[str, Any], seed: int, num: int, mass: float | None = None) -> dict[str, np.ndarray]:
    """Trajectories of the protocol: `train_length - 1` Verlet steps after the initial state. `mass` sets every
    mass (default 1); the initial positions and velocities of a seed do not depend on it."""
    masses = None if mass is None else (mass, mass)
    return nbody_trajectories(
        num, seed, params["train_length"] - 1, n_bodies=NBODY["bodies"], dim=NBODY["dim"], mass_range=masses
    )


def hide_velocity(states: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """States with the velocity half zeroed (the hidden-velocity test's model input)."""
    out = states.clone() if isinstance(states, torch.Tensor) else states.copy()
    out[..., NBODY["bodies"] * NBODY["dim"] :] = 0
    return out


def prior(states: torch.Tensor, target: str) -> torch.Tensor:
    """The part of the next-state change the target leaves out: [v dt, 0] for cv_residual, 0 for delta."""
    if target == "delta":
        return torch.zeros_like(states)
    half = NBODY["bodies"] * NBODY["dim"]
    return torch.cat((states[..., half:] * NBODY_DT, torch.zeros_like(states[..., half:])), dim=-1)


class Normaliser:
    """Input and target statistics of the training trajectories (per feature)."""

    def __init__(self, train: torch.Tensor, target: str) -> None:
        self.target = target
        self.mean, self.std = train.mean(dim=(0, 1)), train.std(dim=(0, 1))
        self.target_std = self.raw_target(train[:, :-1], train[:, 1:]).std(dim=(0, 1))

    def raw_target(self, current: torch.Tensor, following: torch.Tensor) -> torch.Tensor:
        return following - current - prior(current, self.target)

    def inputs(self, states: torch.Tensor) -> torch.Tensor:
        return (states - self.mean) / self.std

    def next_state(self, current: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        return current + prior(current, self.target) + output * self.target_std


def rollout(
    model: Any, states: torch.Tensor, context: int, steps: int, norm: Normaliser, hidden: bool = False
) -> torch.Tensor:
    """`steps` autoregressive states after `context` true ones: [S, steps, F]. With `hidden` every model input
    has its velocities zeroed (the model's own next-state prediction is what the rollout keeps)."""
    sequence = hide_velocity(states[:, :context]) if hidden else states[:, :context]
    with torch.no_grad():
        for _ in range(steps):
            output = model(norm.inputs(sequence))[0][:, -1]
            following = norm.next_state(sequence[:, -1], output)
            sequence = torch.cat((sequence, (hide_velocity(following) if hidden else following)[:, None]), dim=1)
    return sequence[:, context:]


def per_trajectory(predicted: np.ndarray, true: np.ndarray) -> list[float]:
    """Mean squared error of each trajectory (over steps, bodies, dims), 4 significant digits (row-sized)."""
    errors = np.mean((np.asarray(predicted, np.float64) - np.asarray(true, np.float64)) ** 2, axis=(1, 2, 3))
    return [float(f"{e:.4g}") for e in errors]


def paired_interval(a: list[float], b: list[float], draws: int = 4000) -> tuple[float, float, float]:
    """Mean of a - b over trajectories and its 95% bootstrap interval (trajectories resampled, seed 0)."""
    diff = np.asarray(a) - np.asarray(b)
    index = np.random.default_rng(0).integers(0, len(diff), size=(draws, len(diff)))
    means = diff[index].mean(axis=1)
    return float(diff.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def positions(states: np.ndarray) -> np.ndarray:
    return split_state(np.asarray(states, np.float64), NBODY["bodies"], NBODY["dim"])[0]


def score(
    model: Any, data: dict[str, np.ndarray], params: dict, norm: Normaliser, device: str, hidden: bool = False
) -> dict[str, Any]:
    """Rollout metrics on one trajectory set: position / state MSE, energy drift, per-trajectory position MSE."""
    context, steps = params["context"], params["rollout"]
    states = torch.tensor(data["states"], device=device)
    pred = rollout(model, states, context, steps, norm, hidden).double().cpu().numpy()
    true = data["states"][:, context : context + steps].astype(np.float64)
    pred_x, pred_v = split_state(pred, NBODY["bodies"], NBODY["dim"])
    drift = relative_energy_drift(
        nbody_energy(pred_x[:, -1], pred_v[:, -1], data["masses"]), data["energy"][:, context - 1]
    )
    out = {
        "position_mse": rollout_mse(pred_x, positions(true)),
        "per_trajectory": per_trajectory(pred_x, positions(true)),
    }
    if not hidden:
        out["state_mse"] = rollout_mse(pred, true)
        out["energy_drift"] = drift if math.isfinite(drift) else float("nan")
    return out


def onestep_position_mse(model: Any, data: dict[str, np.ndarray], params: dict, norm: Normaliser, device: str) -> float:
    """Teacher-forced one-step position MSE over the rollout span (true history): separates a one-step error
    from compounding in the rollout."""
    context, steps = params["context"], params["rollout"]
    states = torch.tensor(data["states"][:, : context + steps], device=device)
    with torch.no_grad():
        following = norm.next_state(states[:, :-1], model(norm.inputs(states[:, :-1]))[0])
    span = slice(context - 1, context + steps - 1)
    pred = following[:, span].double().cpu().numpy()
    return float(np.mean((positions(pred) - positions(data["states"][:, context : context + steps])) ** 2))


def cv_log_ratio(rollout: float, onestep: float | None, cv_rollout: float, cv_onestep: float | None) -> float:
    """log(rollout / cv_rollout), or with `onestep` 1/2 [log(rollout / cv_rollout) + log(onestep / cv_onestep)]: the
    selection score (lower is better; 0: constant velocity). inf for a non-finite or non-positive error."""
    pairs = [(rollout, cv_rollout)] + ([] if onestep is None else [(onestep, cv_onestep)])
    if not all(math.isfinite(e) and e > 0 for e, _ in pairs):
        return math.inf
    return sum(math.log(e / cv) for e, cv in pairs) / len(pairs)


def cv_errors(data: dict[str, np.ndarray], params: dict[str, Any], hidden: bool = False) -> dict[str, Any]:
    """Constant velocity on one trajectory set: rollout from the last context state (true v there; with `hidden` the
    velocity a positions-only predictor has, the last finite difference) and one step from every true state of the
    rollout span, position MSE against the simulator, with the per-trajectory errors and the static-positions
    rollout."""
    context, steps = params["context"], params["rollout"]
    start = context - 1
    x, v = split_state(data["states"].astype(np.float64), NBODY["bodies"], NBODY["dim"])
    true_x = x[:, context : context + steps]
    velocity = (x[:, start] - x[:, start - 1]) / NBODY_DT if hidden else v[:, start]
    pred_x = extrapolate(x, velocity, start, steps)
    onestep = x[:, start : start + steps] + v[:, start : start + steps] * NBODY_DT
    return {
        "position_mse": rollout_mse(pred_x, true_x),
        "per_trajectory": per_trajectory(pred_x, true_x),
        "onestep_position_mse": rollout_mse(onestep, true_x),
        "static_position_mse": rollout_mse(np.broadcast_to(x[:, start : start + 1], true_x.shape), true_x),
        "final_positions": pred_x[:, -1],
    }


def select_score(params: dict[str, Any], rollout: float, onestep: float, cv: dict[str, Any]) -> float:
    """The selection score of `params["select_on"]` (see SELECT_ON) from a model's errors and `cv_errors`."""
    both = select_rule(params) == "rollout_onestep"
    return cv_log_ratio(
        rollout, onestep if both else None, cv["position_mse"], cv["onestep_position_mse"] if both else None
    )


def training_loss(
    model: Any, train: torch.Tensor, norm: Normaliser, budget: TaskBudget, seed: int, device: str
) -> Callable[[int], torch.Tensor]:
    """Teacher-forced loss on random windows of the training trajectories (a fresh batch per step)."""
    params = budget.params
    window = params["context"] + params["rollout"]
    noise = float(params.get("noise", 0.0))
    generator = torch.Generator().manual_seed(train_seed(seed, 0))

    def loss_fn(step: int) -> torch.Tensor:
        rows = torch.randint(0, len(train), (budget.batch,), generator=generator)
        offsets = torch.randint(0, train.shape[1] - window + 1, (budget.batch,), generator=generator)
        index = offsets[:, None] + torch.arange(window)[None, :]
        states = train[rows[:, None].to(device), index.to(device)]
        current = states[:, :-1]
        if noise > 0:
            jitter = torch.randn(current.shape, generator=generator).to(device)
            current = current + noise * norm.target_std * jitter
        pred, center = model(norm.inputs(current))
        loss = torch.nn.functional.mse_loss(pred, norm.raw_target(current, states[:, 1:]) / norm.target_std)
        return loss if center is None else loss + center

    return loss_fn


def run_nbody(model: Any, budget: TaskBudget, seed: int, device: str) -> dict[str, Any]:
    """Train on the run seed's trajectories, then validation, test and zero-shot metrics (module docstring)."""
    params = budget.params
    check_protocol(params)
    train = torch.tensor(nbody_data(params, seed, params["train_trajectories"])["states"], device=device)
    norm = Normaliser(train, params.get("target", "delta"))
    result = train_loop(model, training_loss(model, train, norm, budget, seed, device), budget)
    model.eval()
    test = nbody_data(params, NBODY_TEST_SEED, params["eval_trajectories"])
    metrics = score(model, test, params, norm, device)
    result.update({k: metrics[k] for k in ("position_mse", "state_mse", "energy_drift")})
    result["position_mse_per_trajectory"] = metrics["per_trajectory"]
    result["onestep_position_mse"] = onestep_position_mse(model, test, params, norm, device)
    result["select_score"] = select_score(
        params, result["position_mse"], result["onestep_position_mse"], cv_errors(test, params)
    )
    if params.get("val_trajectories"):
        val = nbody_data(params, NBODY_VAL_SEED, params["val_trajectories"])
        result["val_position_mse"] = score(model, val, params, norm, device)["position_mse"]
        result["val_onestep_position_mse"] = onestep_position_mse(model, val, params, norm, device)
        result["val_select_score"] = select_score(
            params, result["val_position_mse"], result["val_onestep_position_mse"], cv_errors(val, params)
        )
    zero_shot = params.get("zero_shot_trajectories", 0)
    if zero_shot:  # the same initial states at mass 1 (velocities hidden) and at mass 10
        heavy = score(model, nbody_data(params, NBODY_TEST_SEED, zero_shot, ZERO_SHOT_MASS), params, norm, device)
        hidden = score(model, nbody_data(params, NBODY_TEST_SEED, zero_shot), params, norm, device, hidden=True)
        for name, metrics in (("mass10", heavy), ("hidden_velocity", hidden)):
            result[f"{name}_position_mse"] = metrics["position_mse"]
            result[f"{name}_position_mse_per_trajectory"] = metrics["per_trajectory"]
    return result


def extrapolate(x: np.ndarray, velocity: np.ndarray, start: int, steps: int) -> np.ndarray:
    """x_{start + k} = x_start + k dt velocity, k = 1..steps: [S, steps, n, dim]."""
    k = np.arange(1, steps + 1)[None, :, None, None]
    return x[:, start : start + 1] + velocity[:, None] * NBODY_DT * k


def nbody_reference(params: dict[str, Any]) -> dict[str, Any]:
    """Trivial predictors on the test trajectories: constant velocity (true v at the last context state; on the
    hidden-velocity test the finite difference of the last two positions), static positions, and the
    simulator's own energy drift; also on the validation and 10x-mass trajectories."""
    check_protocol(params)
    context, steps = params["context"], params["rollout"]
    start = context - 1
    out: dict[str, Any] = {}
    sets = {  # prefix: (seed, trajectories, mass)
        "": (NBODY_TEST_SEED, params["eval_trajectories"], None),
        "val_": (NBODY_VAL_SEED, params.get("val_trajectories", 0), None),
        "mass10_": (NBODY_TEST_SEED, params.get("zero_shot_trajectories", 0), ZERO_SHOT_MASS),
        "hidden_velocity_": (NBODY_TEST_SEED, params.get("zero_shot_trajectories", 0), None),
    }
    for prefix, (seed, num, mass) in sets.items():
        if not num:
            continue
        data = nbody_data(params, seed, num, mass)
        cv = cv_errors(data, params, hidden=prefix == "hidden_velocity_")
        out[f"{prefix}const_velocity_position_mse"] = cv["position_mse"]
        out[f"{prefix}const_velocity_position_mse_per_trajectory"] = cv["per_trajectory"]
        out[f"{prefix}static_position_mse"] = cv["static_position_mse"]
        if prefix in ("", "val_"):
            out[f"{prefix}const_velocity_onestep_position_mse"] = cv["onestep_position_mse"]
        if prefix == "":
            velocity = split_state(data["states"][:, start].astype(np.float64), NBODY["bodies"], NBODY["dim"])[1]
            final_e = nbody_energy(cv["final_positions"], velocity, data["masses"])
            out["const_velocity_energy_drift"] = relative_energy_drift(final_e, data["energy"][:, start])
            drift = relative_energy_drift(data["energy"][:, start + steps], data["energy"][:, start])
            out["simulator_energy_drift"] = drift
    return out
