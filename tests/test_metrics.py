"""Metric code on hand-computed cases."""

import math

import numpy as np
import pytest

from zpx_hf_train.metrics import (
    aggregate_runs,
    format_mean_std,
    mean_std,
    relative_energy_drift,
    rollout_mse,
    rollout_mse_per_step,
)


def test_rollout_mse_hand_computed():
    pred = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    true = np.array([[[0.0, 2.0], [1.0, 4.0]]])
    assert rollout_mse(pred, true) == pytest.approx((1 + 0 + 4 + 0) / 4)
    np.testing.assert_allclose(rollout_mse_per_step(pred, true), [0.5, 2.0])
    with pytest.raises(ValueError, match="rollout_mse: shapes differ"):
        rollout_mse(pred, true[:, :1])


def test_relative_energy_drift_hand_computed():
    assert relative_energy_drift(np.array([-9.0, 2.2]), np.array([-10.0, 2.0])) == pytest.approx((0.1 + 0.1) / 2)


def test_mean_std_sample_std():
    mean, std = mean_std([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert std == pytest.approx(math.sqrt(5 / 3))
    assert mean_std([7.0]) == (7.0, 0.0)
    assert mean_std([1.0, float("nan"), 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert all(math.isnan(v) for v in mean_std([]))


def test_aggregate_runs_groups_and_orders():
    runs = [
        {"variant": "b", "task": "t", "seed": 0, "acc": 0.5, "loss": 1.0},
        {"variant": "a", "task": "t", "seed": 0, "acc": 1.0},
        {"variant": "b", "task": "t", "seed": 1, "acc": 0.7, "loss": 3.0},
    ]
    rows = aggregate_runs(runs, ["variant", "task"], ["acc", "loss"])
    assert [r["variant"] for r in rows] == ["b", "a"]
    assert rows[0]["n"] == 2
    assert rows[0]["acc_mean"] == pytest.approx(0.6)
    assert rows[0]["acc_std"] == pytest.approx(math.sqrt(0.02))
    assert rows[0]["loss_mean"] == 2.0
    assert rows[1]["acc_std"] == 0.0 and "loss_mean" not in rows[1]


def test_format_mean_std():
    assert format_mean_std(0.81234, 0.0126) == "0.812 ± 0.013"
    assert format_mean_std(float("nan"), 0.1) == "-"
    assert format_mean_std(1.5, None, digits=1) == "1.5"
