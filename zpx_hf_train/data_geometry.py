"""Geometric synthetic data: N-body dynamics (sequence regression) and spiral-chirality classification.

Both generators are deterministic given a seed (their own `numpy.random.Generator`, no global state).

**N-body** (the Versor paper's protocol). `n_bodies` (5) point masses in `dim` (3) dimensions,
gravitational constant G = 1, time step dt = 0.01, velocity Verlet, reflecting walls at +-`wall` (2).
Forces use Plummer softening `eps` (0.3: with dt = 0.01 Verlet then keeps |dE/E| below ~0.3% over 200 steps
without walls; at eps = 0.1 close encounters give errors of several %):

    a_i    = G sum_{j != i} m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^{3/2}
    E      = sum_i m_i |v_i|^2 / 2  -  G sum_{i<j} m_i m_j / sqrt(|x_i - x_j|^2 + eps^2)
    Verlet: v += a dt/2;  x += v dt;  (walls);  a = a(x);  v += a dt/2

The softened potential is the one whose gradient is the softened force, so Verlet conserves this `E`
(to O(dt^2), no secular drift) away from the walls. Walls: a coordinate that leaves [-wall, wall] is
mirrored back (x -> 2 wall - x, or -2 wall - x) and its velocity component negated (elastic; kinetic energy
unchanged, the potential changes by the O(dt) mirror displacement). Initial positions are uniform in
[-`init_box`, `init_box`]^dim, velocities normal with std `init_speed`, then the centre-of-mass velocity is
removed; masses are 1 unless `mass_range` draws them uniformly. A state is `[x (n*dim), v (n*dim)]`, one
per time step (`stride` integrator steps apart).

**Spiral chirality and winding.** Each example is a sequence of `num_points` 2-D points on an
Archimedean spiral

    r(t) = r0 + (r1 - r0) t,   angle(t) = a0 + s 2 pi w t,   t = k / (num_points - 1), k = 0..num_points-1

with chirality s in {+1 (counter-clockwise), -1 (clockwise)}, winding w in `windings` (full turns),
random start angle a0 (so the class is rotation-invariant), random radii 0.1 <= r0 < r1 <= 0.95, a
random centre offset (|c| <= 0.05 per axis) and Gaussian jitter `noise`.

    label = 2 * windings.index(w) + (s == -1)        (4 classes for windings (1, 2))

Points are quantised onto a `grid` x `grid` lattice of [-1, 1]^2 (clipped) and each point is one token
`BYTE_OFFSET + ix * grid + iy` (grid <= 16 keeps every id inside the byte tokenizer's vocabulary). The LM
form `<s> p_0 ... p_{n-1} | c` has the class token `c` = the digit character of the label as the only
answer position, in the same dict format as `data_tasks` (input_ids, attention_mask, labels with -100
elsewhere, answer_mask), so `evaluation.task_accuracy` scores it exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from zpx_hf.tokenization_bytes import BOS_ID, BYTE_OFFSET, PAD_ID, text_to_ids

from .data_tasks import IGNORE_INDEX

NBODY_G = 1.0
NBODY_DT = 0.01
NBODY_WALL = 2.0
NBODY_SOFTENING = 0.3


# ---- N-body -----------------------------------------------------------------------------------


def nbody_accelerations(
    positions: np.ndarray, masses: np.ndarray, g: float = NBODY_G, eps: float = NBODY_SOFTENING
) -> np.ndarray:
    """a_i = G sum_j m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^{3/2}; positions [..., n, dim], masses [..., n]."""
    diff = positions[..., None, :, :] - positions[..., :, None, :]  # [..., i, j, dim] = x_j - x_i
    inv = (np.sum(diff * diff, axis=-1) + eps * eps) ** -1.5
    n = positions.shape[-2]
    inv = inv * (1.0 - np.eye(n))  # no self-force
    return g * np.einsum("...ij,...j,...ijd->...id", inv, masses, diff)


def nbody_energy(
    positions: np.ndarray,
    velocities: np.ndarray,
    masses: np.ndarray,
    g: float = NBODY_G,
    eps: float = NBODY_SOFTENING,
) -> np.ndarray:
    """E = sum_i m_i |v_i|^2 / 2 - G sum_{i<j} m_i m_j / sqrt(|x_i - x_j|^2 + eps^2); shape [...]."""
    kinetic = 0.5 * np.sum(masses * np.sum(velocities * velocities, axis=-1), axis=-1)
    diff = positions[..., None, :, :] - positions[..., :, None, :]
    inv = (np.sum(diff * diff, axis=-1) + eps * eps) ** -0.5
    pair = masses[..., :, None] * masses[..., None, :] * inv
    n = positions.shape[-2]
    potential = -g * 0.5 * np.sum(pair * (1.0 - np.eye(n)), axis=(-1, -2))
    return kinetic + potential


def reflect_walls(positions: np.ndarray, velocities: np.ndarray, wall: float) -> tuple[np.ndarray, np.ndarray]:
    """Mirror coordinates beyond +-wall back inside and negate those velocity components (in place)."""
    over, under = positions > wall, positions < -wall
    positions[over] = 2 * wall - positions[over]
    positions[under] = -2 * wall - positions[under]
    velocities[over | under] *= -1.0
    return positions, velocities


def verlet_step(
    positions: np.ndarray,
    velocities: np.ndarray,
    accelerations: np.ndarray,
    masses: np.ndarray,
    dt: float = NBODY_DT,
    g: float = NBODY_G,
    eps: float = NBODY_SOFTENING,
    wall: float | None = NBODY_WALL,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One velocity-Verlet step (kick-drift-kick), walls applied after the drift; returns (x, v, a)."""
    velocities = velocities + 0.5 * dt * accelerations
    positions = positions + dt * velocities
    if wall is not None:
        positions, velocities = reflect_walls(positions, velocities, wall)
    accelerations = nbody_accelerations(positions, masses, g, eps)
    velocities = velocities + 0.5 * dt * accelerations
    return positions, velocities, accelerations


def nbody_initial_conditions(
    num_systems: int,
    seed: int,
    n_bodies: int = 5,
    dim: int = 3,
    init_box: float = 1.0,
    init_speed: float = 0.5,
    mass_range: tuple[float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions [S, n, dim], velocities [S, n, dim] with zero centre-of-mass velocity, masses [S, n])."""
    rng = np.random.default_rng([seed, 7919])
    positions = rng.uniform(-init_box, init_box, size=(num_systems, n_bodies, dim))
    velocities = rng.normal(0.0, init_speed, size=(num_systems, n_bodies, dim))
    if mass_range is None:
        masses = np.ones((num_systems, n_bodies))
    else:
        masses = rng.uniform(mass_range[0], mass_range[1], size=(num_systems, n_bodies))
    com_velocity = np.sum(masses[..., None] * velocities, axis=1, keepdims=True) / np.sum(masses, axis=1)[:, None, None]
    return positions, velocities - com_velocity, masses


def simulate_nbody(
    positions: np.ndarray,
    velocities: np.ndarray,
    masses: np.ndarray,
    num_steps: int,
    dt: float = NBODY_DT,
    stride: int = 1,
    g: float = NBODY_G,
    eps: float = NBODY_SOFTENING,
    wall: float | None = NBODY_WALL,
) -> tuple[np.ndarray, np.ndarray]:
    """Integrate `num_steps * stride` Verlet steps; returns (positions, velocities) [S, num_steps + 1, n, dim]
    (index 0 is the initial state)."""
    x, v = np.array(positions, dtype=np.float64), np.array(velocities, dtype=np.float64)
    a = nbody_accelerations(x, masses, g, eps)
    xs, vs = [x], [v]
    for _ in range(num_steps):
        for _ in range(stride):
            x, v, a = verlet_step(x, v, a, masses, dt, g, eps, wall)
        xs.append(x)
        vs.append(v)
    return np.stack(xs, axis=1), np.stack(vs, axis=1)


def state_vector(positions: np.ndarray, velocities: np.ndarray) -> np.ndarray:
    """[..., n, dim] x 2 -> [..., 2 n dim] = [x flattened, v flattened]."""
    flat = positions.shape[:-2] + (-1,)
    return np.concatenate((positions.reshape(flat), velocities.reshape(flat)), axis=-1)


def split_state(states: np.ndarray, n_bodies: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `state_vector`: [..., 2 n dim] -> (positions, velocities) [..., n, dim]."""
    half = n_bodies * dim
    lead = states.shape[:-1]
    return states[..., :half].reshape(*lead, n_bodies, dim), states[..., half:].reshape(*lead, n_bodies, dim)


def nbody_trajectories(
    num_trajectories: int,
    seed: int,
    num_steps: int,
    n_bodies: int = 5,
    dim: int = 3,
    dt: float = NBODY_DT,
    stride: int = 1,
    wall: float | None = NBODY_WALL,
    eps: float = NBODY_SOFTENING,
    init_box: float = 1.0,
    init_speed: float = 0.5,
    mass_range: tuple[float, float] | None = None,
) -> dict[str, np.ndarray]:
    """Trajectories for sequence regression: `states` [S, num_steps + 1, 2 n dim] (float32), `masses` [S, n],
    `energy` [S, num_steps + 1] (float64, from the simulator's own states)."""
    x0, v0, masses = nbody_initial_conditions(num_trajectories, seed, n_bodies, dim, init_box, init_speed, mass_range)
    xs, vs = simulate_nbody(x0, v0, masses, num_steps, dt, stride, NBODY_G, eps, wall)
    energy = nbody_energy(xs, vs, masses[:, None, :], NBODY_G, eps)
    return {"states": state_vector(xs, vs).astype(np.float32), "masses": masses, "energy": energy}


# ---- spirals ----------------------------------------------------------------------------------

SPIRAL_SEPARATOR = "|"


def spiral_points(
    num_examples: int,
    seed: int,
    num_points: int = 24,
    windings: Sequence[int] = (1, 2),
    noise: float = 0.01,
) -> tuple[np.ndarray, np.ndarray]:
    """(points [N, num_points, 2] in about [-1, 1]^2, labels [N]); see the module docstring for the labels."""
    rng = np.random.default_rng([seed, 104729])
    num_classes = 2 * len(windings)
    labels = rng.integers(0, num_classes, size=num_examples)
    winding = np.asarray(windings, dtype=np.float64)[labels // 2]
    chirality = np.where(labels % 2 == 1, -1.0, 1.0)
    start = rng.uniform(0.0, 2 * np.pi, size=num_examples)
    r0 = rng.uniform(0.1, 0.3, size=num_examples)
    r1 = rng.uniform(0.7, 0.95, size=num_examples)
    centre = rng.uniform(-0.05, 0.05, size=(num_examples, 2))
    t = np.linspace(0.0, 1.0, num_points)[None, :]
    radius = r0[:, None] + (r1 - r0)[:, None] * t
    angle = start[:, None] + chirality[:, None] * 2 * np.pi * winding[:, None] * t
    points = np.stack((radius * np.cos(angle), radius * np.sin(angle)), axis=-1) + centre[:, None, :]
    points = points + rng.normal(0.0, noise, size=points.shape)
    return points, labels


def quantize_points(points: np.ndarray, grid: int = 16) -> np.ndarray:
    """Token ids BYTE_OFFSET + ix * grid + iy of points in [-1, 1]^2 (cell index floor((p + 1) / 2 * grid))."""
    if not 2 <= grid <= 16:
        raise ValueError(f"spiral grid={grid} must be in [2, 16] so every cell id is a byte token.")
    cells = np.clip(np.floor((points + 1.0) * 0.5 * grid), 0, grid - 1).astype(np.int64)
    return BYTE_OFFSET + cells[..., 0] * grid + cells[..., 1]


def spiral_examples(
    num_examples: int,
    seed: int,
    num_points: int = 24,
    windings: Sequence[int] = (1, 2),
    noise: float = 0.01,
    grid: int = 16,
    seq_len: int | None = None,
) -> list[dict[str, Any]]:
    """LM-form spiral classification `<s> p_0 .. p_{n-1} | c` (the class digit is the answer; `label` int)."""
    if 2 * len(windings) > 10:
        raise ValueError(f"spiral windings={tuple(windings)}: at most 5 windings (class tokens are digits 0-9).")
    points, labels = spiral_points(num_examples, seed, num_points, windings, noise)
    tokens = quantize_points(points, grid)
    separator = text_to_ids(SPIRAL_SEPARATOR)
    out = []
    for row, label in zip(tokens.tolist(), labels.tolist()):
        answer = text_to_ids(str(label))
        input_ids = [BOS_ID, *row, *separator, *answer]
        answer_mask = [0] * (len(input_ids) - 1) + [1]
        length = len(input_ids)
        if seq_len is not None:
            if length > seq_len:
                raise ValueError(f"spiral examples need {length} tokens but seq_len={seq_len}: raise seq_len.")
            input_ids += [PAD_ID] * (seq_len - length)
            answer_mask += [0] * (seq_len - length)
        out.append(
            {
                "input_ids": input_ids,
                "attention_mask": [1] * length + [0] * (len(input_ids) - length),
                "labels": [tok if m else IGNORE_INDEX for tok, m in zip(input_ids, answer_mask)],
                "answer_mask": answer_mask,
                "label": int(label),
            }
        )
    return out


__all__ = [
    "NBODY_DT",
    "NBODY_G",
    "NBODY_SOFTENING",
    "NBODY_WALL",
    "nbody_accelerations",
    "nbody_energy",
    "nbody_initial_conditions",
    "nbody_trajectories",
    "quantize_points",
    "reflect_walls",
    "simulate_nbody",
    "spiral_examples",
    "spiral_points",
    "split_state",
    "state_vector",
    "verlet_step",
]
