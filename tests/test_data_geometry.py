"""N-body simulator and spiral generator: determinism, physics, labels recomputed independently."""

import numpy as np
import pytest

from zpx_hf.tokenization_bytes import BOS_ID, BYTE_OFFSET, text_to_ids
from zpx_hf_train.data_geometry import (
    NBODY_SOFTENING,
    nbody_accelerations,
    nbody_energy,
    nbody_initial_conditions,
    nbody_trajectories,
    quantize_points,
    reflect_walls,
    simulate_nbody,
    spiral_examples,
    spiral_points,
    split_state,
    state_vector,
)
from zpx_hf_train.evaluation import task_accuracy


def test_nbody_deterministic_and_seed_dependent():
    a = nbody_trajectories(3, seed=5, num_steps=20)
    b = nbody_trajectories(3, seed=5, num_steps=20)
    c = nbody_trajectories(3, seed=6, num_steps=20)
    np.testing.assert_array_equal(a["states"], b["states"])
    assert not np.allclose(a["states"], c["states"])
    assert a["states"].shape == (3, 21, 2 * 5 * 3)
    assert a["energy"].shape == (3, 21)


def test_accelerations_match_pairwise_loop():
    rng = np.random.default_rng(0)
    x, m = rng.normal(size=(4, 3)), rng.uniform(0.5, 1.5, size=4)
    expected = np.zeros_like(x)
    for i in range(4):
        for j in range(4):
            if i != j:
                d = x[j] - x[i]
                expected[i] += m[j] * d / (d @ d + NBODY_SOFTENING**2) ** 1.5
    np.testing.assert_allclose(nbody_accelerations(x, m), expected, rtol=1e-12)


def test_energy_matches_pairwise_loop_and_force_is_its_gradient():
    rng = np.random.default_rng(1)
    x, v, m = rng.normal(size=(5, 3)), rng.normal(size=(5, 3)), rng.uniform(0.5, 1.5, size=5)
    potential = sum(
        -m[i] * m[j] / np.sqrt(np.sum((x[i] - x[j]) ** 2) + NBODY_SOFTENING**2) for i in range(5) for j in range(i)
    )
    kinetic = 0.5 * np.sum(m[:, None] * v * v)
    assert nbody_energy(x, v, m) == pytest.approx(kinetic + potential, rel=1e-12)
    # m_i a_i = -dU/dx_i (central differences on the potential energy, v = 0)
    h, grad = 1e-6, np.zeros_like(x)
    for i in range(5):
        for d in range(3):
            xp, xm = x.copy(), x.copy()
            xp[i, d] += h
            xm[i, d] -= h
            grad[i, d] = (nbody_energy(xp, 0 * v, m) - nbody_energy(xm, 0 * v, m)) / (2 * h)
    np.testing.assert_allclose(m[:, None] * nbody_accelerations(x, m), -grad, rtol=1e-5, atol=1e-7)


def test_verlet_conserves_energy_without_walls_second_order():
    x0, v0, m = nbody_initial_conditions(4, seed=3, init_speed=0.3, mass_range=(0.5, 1.5))
    errors = []
    for dt, steps in ((0.01, 200), (0.005, 400)):
        xs, vs = simulate_nbody(x0, v0, m, steps, dt=dt, wall=None, eps=0.3)
        energy = nbody_energy(xs, vs, m[:, None, :], eps=0.3)
        errors.append(np.max(np.abs(energy - energy[:, :1]) / np.abs(energy[:, :1])))
    assert errors[0] < 5e-3
    assert errors[0] / errors[1] > 3.0  # halving dt cuts the (oscillating) energy error ~4x


def test_walls_keep_bodies_inside_and_reflect():
    d = nbody_trajectories(8, seed=0, num_steps=200, init_speed=2.0)
    positions, velocities = split_state(d["states"], 5, 3)
    assert np.all(np.abs(positions) <= 2.0 + 1e-6)
    x, v = np.array([[2.1, -2.05, 0.0]]), np.array([[1.0, -1.0, 0.5]])
    x, v = reflect_walls(x, v, 2.0)
    np.testing.assert_allclose(x, [[1.9, -1.95, 0.0]])
    np.testing.assert_allclose(v, [[-1.0, 1.0, 0.5]])


def test_initial_conditions_zero_momentum_and_state_roundtrip():
    x, v, m = nbody_initial_conditions(6, seed=2, mass_range=(0.5, 2.0))
    np.testing.assert_allclose(np.sum(m[..., None] * v, axis=1), 0.0, atol=1e-12)
    back_x, back_v = split_state(state_vector(x, v), 5, 3)
    np.testing.assert_array_equal(back_x, x)
    np.testing.assert_array_equal(back_v, v)


def _winding_and_chirality(points: np.ndarray) -> tuple[int, int]:
    """Independent recomputation: total signed angle swept around the centroid of the noiseless curve."""
    angles = np.unwrap(np.arctan2(points[:, 1], points[:, 0]))
    swept = (angles[-1] - angles[0]) / (2 * np.pi)
    return int(round(abs(swept))), int(swept < 0)


def test_spiral_labels_recomputed_from_points():
    points, labels = spiral_points(200, seed=11, num_points=48, windings=(1, 2), noise=0.0)
    for pts, label in zip(points, labels):
        # the centre offset is <= 0.05 and the radius >= 0.1, so angles about the origin sweep the same turns
        winding, clockwise = _winding_and_chirality(pts)
        assert label == 2 * (winding - 1) + clockwise
    assert set(labels.tolist()) == {0, 1, 2, 3}


def test_spiral_examples_deterministic_format_and_tokens():
    a = spiral_examples(16, seed=4, num_points=20, seq_len=32)
    assert a == spiral_examples(16, seed=4, num_points=20, seq_len=32)
    assert a != spiral_examples(16, seed=5, num_points=20, seq_len=32)
    points, labels = spiral_points(16, seed=4, num_points=20)
    tokens = quantize_points(points)
    for ex, row, label in zip(a, tokens, labels):
        assert len(ex["input_ids"]) == 32
        assert ex["input_ids"][0] == BOS_ID
        assert ex["input_ids"][1:21] == row.tolist()
        assert ex["input_ids"][21:23] == text_to_ids("|") + text_to_ids(str(label))
        assert ex["label"] == label
        assert sum(ex["answer_mask"]) == 1 and ex["answer_mask"][22] == 1
        assert ex["labels"][22] == ex["input_ids"][22] and ex["labels"][21] == -100
        assert sum(ex["attention_mask"]) == 23
    with pytest.raises(ValueError, match="seq_len"):
        spiral_examples(1, seed=0, num_points=40, seq_len=32)


def test_quantize_points_cells():
    pts = np.array([[-1.0, -1.0], [0.999, 0.999], [0.0, -0.01], [5.0, -5.0]])
    np.testing.assert_array_equal(
        quantize_points(pts, grid=16), BYTE_OFFSET + np.array([0, 15 * 16 + 15, 8 * 16 + 7, 15 * 16 + 0])
    )
    with pytest.raises(ValueError, match="grid"):
        quantize_points(pts, grid=17)


def test_spiral_scored_by_task_accuracy():
    """An oracle model that predicts the stored class token scores 1.0 through `evaluation.task_accuracy`."""
    import torch
    from datasets import Dataset

    rows = spiral_examples(8, seed=0, num_points=10, seq_len=16)
    data = Dataset.from_dict(
        {k: [r[k] for r in rows] for k in ("input_ids", "attention_mask", "labels", "answer_mask")}
    )

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None):
            logits = torch.nn.functional.one_hot(input_ids.roll(-1, dims=1), 260).float()
            return type("Out", (), {"logits": logits})()

    assert task_accuracy(Oracle(), data)["exact_match"] == 1.0
