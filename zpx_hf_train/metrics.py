"""Metrics for continuous tasks and seed aggregation (LM perplexity and task accuracy: `evaluation.py`).

rollout MSE       = mean_{trajectories, steps, features} (pred - true)^2   (per step: mean over the rest)
energy drift      = mean_trajectories |E(pred_T) - E(true_0)| / |E(true_0)|   (T = last rollout step)
mean +- std       = sample mean and sample standard deviation (ddof = 1; 0 for one value) over seeds
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np


def rollout_mse(predicted: np.ndarray, target: np.ndarray) -> float:
    """Mean squared error over every trajectory, rollout step and feature."""
    predicted, target = np.asarray(predicted, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if predicted.shape != target.shape:
        raise ValueError(f"rollout_mse: shapes differ, {predicted.shape} vs {target.shape}.")
    return float(np.mean((predicted - target) ** 2))


def rollout_mse_per_step(predicted: np.ndarray, target: np.ndarray) -> np.ndarray:
    """MSE at each rollout step: [S, T, F] -> [T] (mean over trajectories and features)."""
    predicted, target = np.asarray(predicted, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if predicted.shape != target.shape or predicted.ndim != 3:
        raise ValueError(
            f"rollout_mse_per_step: expected two equal [S, T, F] arrays; got {predicted.shape}, {target.shape}."
        )
    return np.mean((predicted - target) ** 2, axis=(0, 2))


def relative_energy_drift(energy: np.ndarray, reference: np.ndarray) -> float:
    """mean_s |energy[s] - reference[s]| / |reference[s]| (energy: final rollout energies, reference: E_0)."""
    energy, reference = np.asarray(energy, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if energy.shape != reference.shape:
        raise ValueError(f"relative_energy_drift: shapes differ, {energy.shape} vs {reference.shape}.")
    return float(np.mean(np.abs(energy - reference) / np.maximum(np.abs(reference), 1e-12)))


def mean_std(values: Iterable[float | None]) -> tuple[float, float]:
    """(mean, sample std with ddof=1); None and NaN values are dropped; an empty input gives (nan, nan)."""
    finite = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not finite:
        return float("nan"), float("nan")
    mean = sum(finite) / len(finite)
    if len(finite) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))


def aggregate_runs(
    runs: Sequence[Mapping[str, Any]], group_keys: Sequence[str], metric_keys: Sequence[str]
) -> list[dict[str, Any]]:
    """Group per-seed rows by `group_keys` (first-seen order) and give `<metric>_mean`, `<metric>_std`
    and `n` (rows in the group) for every metric in `metric_keys` present in the group."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for run in runs:
        groups.setdefault(tuple(run.get(k) for k in group_keys), []).append(run)
    out = []
    for key, rows in groups.items():
        row: dict[str, Any] = dict(zip(group_keys, key))
        row["n"] = len(rows)
        for metric in metric_keys:
            values = [r[metric] for r in rows if r.get(metric) is not None]
            if values:
                row[f"{metric}_mean"], row[f"{metric}_std"] = mean_std(values)
        out.append(row)
    return out


def format_mean_std(mean: float | None, std: float | None, digits: int = 3) -> str:
    """`0.812 ± 0.013`; `-` when the mean is missing or NaN."""
    if mean is None or math.isnan(mean):
        return "-"
    if std is None or math.isnan(std):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


__all__ = [
    "aggregate_runs",
    "format_mean_std",
    "mean_std",
    "relative_energy_drift",
    "rollout_mse",
    "rollout_mse_per_step",
]
