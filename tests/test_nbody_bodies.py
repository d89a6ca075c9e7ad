"""N-body with one token per body (benchmarks/evidence/nbody_bodies.py, nbody_geometry.py): the tokenisation, the
equivariance error against hand-built functions, the equivariant Versor read-in, constant velocity through the
rollout path, and the lr selection's ladder."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import AutoModel

from benchmarks.evidence import nbody, nbody_bodies, nbody_geometry
from benchmarks.evidence.models import SequenceRegressor, VectorRegressor
from zpx_hf import VersorConfig
from zpx_hf_train.data_geometry import NBODY_SOFTENING, nbody_initial_conditions, simulate_nbody, state_vector

SMALL = {
    **nbody_geometry.PARAMS,
    "rollout": 6,
    "train_length": 20,
    "train_trajectories": 4,
    "val_trajectories": 3,
    "eval_trajectories": 5,
    "zero_shot_trajectories": 3,
    "equivariance_states": 4,
}


@pytest.mark.parametrize("bodies", [3, 5, 7])
def test_body_tokens_hold_each_body_and_permute_with_the_bodies(bodies):
    x0, v0, masses = nbody_initial_conditions(2, 11, n_bodies=bodies)
    xs, vs = simulate_nbody(x0, v0, masses, 3)  # [S, T, n, 3]
    states = torch.tensor(state_vector(xs, vs))
    tokens = nbody_bodies.body_tokens(states, bodies)
    assert tokens.shape == (2, 4, bodies, 6)
    np.testing.assert_array_equal(tokens[..., :3].numpy(), xs)
    np.testing.assert_array_equal(tokens[..., 3:].numpy(), vs)
    torch.testing.assert_close(nbody_bodies.flat_states(tokens), states, rtol=0, atol=0)
    order = np.random.default_rng(bodies).permutation(bodies)
    permuted = nbody_bodies.body_tokens(torch.tensor(state_vector(xs[:, :, order], vs[:, :, order])), bodies)
    torch.testing.assert_close(permuted, tokens[..., order, :], rtol=0, atol=0)


def gravity(tokens):
    """An exactly equivariant predictor: [softened gravity on each body, v / 10] (float64)."""
    x = tokens[..., :3]
    diff = x[..., None, :, :] - x[..., :, None, :]  # x_j - x_i
    inverse = (diff.square().sum(-1) + NBODY_SOFTENING**2) ** -1.5
    return torch.cat(((inverse[..., None] * diff).sum(-2), tokens[..., 3:] / 10), dim=-1)


def test_equivariance_error_is_rounding_for_an_equivariant_function_and_order_one_otherwise():
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(6, 5, 6, generator=generator, dtype=torch.float64)
    weight = torch.randn(6, 6, generator=generator, dtype=torch.float64)
    index = torch.arange(5, dtype=torch.float64)[:, None]
    errors = {
        name: {group: nbody_bodies.equivariance_error(f, tokens, group) for group in nbody_bodies.GROUPS}
        for name, f in {
            "gravity": gravity,
            "per_body_linear": lambda s: s @ weight,  # the same dense map on every body: permutations only
            "indexed": lambda s: gravity(s) * (1 + index),  # depends on body order: rotations and translations only
        }.items()
    }
    assert max(errors["gravity"].values()) < 1e-13
    assert errors["per_body_linear"]["rotation"] > 0.1 and errors["per_body_linear"]["translation"] > 0.1
    assert errors["per_body_linear"]["permutation"] < 1e-13
    assert errors["indexed"]["permutation"] > 0.1
    assert max(errors["indexed"]["rotation"], errors["indexed"]["translation"]) < 1e-13
    with pytest.raises(ValueError, match="group="):
        nbody_bodies.equivariance_error(gravity, tokens, "scaling")


def versor_backbone(mixer="gpa", seed=0):
    torch.manual_seed(seed)
    config = VersorConfig(
        vocab_size=8, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=16, mixer=mixer, initializer_range=0.2, **nbody_bodies.BODY_CONFIG,
    )  # fmt: skip
    return AutoModel.from_config(config)


def test_versor_vector_read_in_is_equivariant_and_the_dense_one_is_not():
    generator = torch.Generator().manual_seed(1)
    vector = VectorRegressor(versor_backbone()).double().eval()
    dense = SequenceRegressor(versor_backbone(), 6).double().eval()
    for bodies in (3, 5, 7):
        tokens = torch.randn(4, bodies, 6, generator=generator, dtype=torch.float64)
        for group in nbody_bodies.GROUPS:
            assert nbody_bodies.equivariance_error(lambda s: vector(s)[0], tokens, group) < 1e-12, (bodies, group)
        assert nbody_bodies.equivariance_error(lambda s: dense(s)[0], tokens, "rotation") > 0.05
        assert nbody_bodies.equivariance_error(lambda s: dense(s)[0], tokens, "translation") > 0.05
    assert vector(tokens)[0].abs().mean() > 1e-3  # not equivariant by being zero
    with pytest.raises(ValueError, match="mixer='gpa'"):
        VectorRegressor(versor_backbone("hybrid"))


class ZeroModel(torch.nn.Module):
    def forward(self, states):
        return torch.zeros_like(states), None


def test_zero_increment_rollout_is_constant_velocity_and_matches_the_flat_task():
    params = {**SMALL, "eval_trajectories": 5}
    data = nbody_bodies.body_data(5, nbody.NBODY_TEST_SEED, 5, params["train_length"])
    norm = nbody_bodies.BodyNormaliser(data["tokens"])
    model_metrics = nbody_bodies.score(ZeroModel(), data, params, norm)
    reference = nbody_bodies.const_velocity(data, params)
    for key in ("position_mse", "onestep_position_mse", "energy_drift"):
        assert math.isclose(model_metrics[key], reference[key], rel_tol=1e-4), key
    flat = nbody.nbody_reference({**nbody.NBODY_PROTOCOL, **params, "val_trajectories": 0, "zero_shot_trajectories": 0})
    assert math.isclose(reference["position_mse"], flat["const_velocity_position_mse"], rel_tol=1e-12)
    assert math.isclose(reference["onestep_position_mse"], flat["const_velocity_onestep_position_mse"], rel_tol=1e-12)
    assert math.isclose(reference["energy_drift"], flat["const_velocity_energy_drift"], rel_tol=1e-12)


def test_run_row_has_every_metric_for_every_body_count():
    torch.manual_seed(0)
    model = VectorRegressor(versor_backbone())
    budget = replace(nbody_geometry.BUDGET, steps=2, batch=4, warmup=1, params=SMALL)
    row = nbody_bodies.run_bodies(model, budget, seed=1)
    for key in ("position_mse", "onestep_position_mse", "energy_drift", "val_position_mse", "val_onestep_position_mse"):
        assert math.isfinite(row[key]), key
    assert len(row["position_mse_per_trajectory"]) == SMALL["eval_trajectories"]
    for bodies in SMALL["zero_shot_bodies"]:
        assert len(row[f"bodies{bodies}_position_mse_per_trajectory"]) == SMALL["zero_shot_trajectories"]
    assert max(row[f"{group}_error"] for group in nbody_bodies.GROUPS) < 1e-5  # float32 rounding


def test_selection_widens_the_ladder_at_an_edge_and_scores_under_fits():
    ref = {"val_position_mse": 1.0, "val_onestep_position_mse": 1.0}

    def row(lr, rollout, onestep=1.0):
        return {"variant": "v", "seed": 0, "lr": lr, "val_position_mse": rollout, "val_onestep_position_mse": onestep}

    # a smooth under-fit: best rollout, one-step 10x worse than constant velocity -> not selected
    assert nbody_geometry.val_score(row(1e-3, 0.5, 10.0), ref) > nbody_geometry.val_score(row(1e-3, 0.8, 0.8), ref)
    assert nbody_geometry.val_score(row(1e-3, float("nan")), ref) == math.inf
    first = [row(3e-4, 0.9), row(1e-3, 0.8), row(3e-3, 0.7)]

    def pick(rows):
        grid = nbody_geometry.selection(rows, "v", ref)
        return grid["pick"], grid["missing"], grid["edge"]

    assert pick(first[:2]) == (None, [3e-3], False)
    assert pick(first) == (None, [1e-2], True)  # best at the top edge: one rung more
    assert pick([*first, row(1e-2, 0.75)]) == (3e-3, [], False)  # interior
    assert pick([*first, row(1e-2, 0.6)]) == (None, [3e-2], True)
    assert pick([*first, row(1e-2, 0.6), row(3e-2, 0.5)]) == (None, [1e-1], True)  # past the suite ladder's top
    diverged = {**row(1e-1, 0.1), "status": "diverged: loss nan"}
    assert pick([*first, row(1e-2, 0.6), row(3e-2, 0.5), diverged]) == (3e-2, [], False)  # scored as the worst
    rising = [row(lr, 1.0 / (i + 1)) for i, lr in enumerate(nbody_geometry.LR_LADDER[2:])]
    top = nbody_geometry.LR_LADDER[-1]
    assert pick(rising) == (top, [], True)  # the ladder's end: said so
    failed = [{**r, "status": "diverged: loss nan"} for r in first]
    assert nbody_geometry.selection(failed, "v", ref)["failed"]
    with pytest.raises(SystemExit):
        nbody_geometry.main(["--seeds", "0", "1", "--render"])


def test_a_diverged_run_is_kept_and_never_selected(monkeypatch):
    def diverge(*args, **kwargs):
        raise FloatingPointError("training loss became nan at step 3")

    monkeypatch.setattr(nbody_geometry, "run_bodies", diverge)
    row = nbody_geometry.run("baseline", 0, 3e-2, {"hidden": 32, "intermediate": 80}, {})
    assert row["status"] == "diverged: training loss became nan at step 3"
    assert nbody_geometry.val_score(row, {"val_position_mse": 1.0, "val_onestep_position_mse": 1.0}) == math.inf
