"""The suite's variants as package models: configs, the LM heads, a regression readout, parameter matching.

Every variant is one of the package's families built through the transformers Auto classes with the
public `attn_implementation` argument. Token tasks train the family's `*ForCausalLM` (its own loss, which
for ZPX already adds `center_loss_weight * center_loss`); continuous tasks (N-body) run the backbone
`*Model` on `inputs_embeds` with a linear read-in / read-out, adding the backbone's own `center_loss`
output with the config's weight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM

from benchmarks.evidence.protocol import SizeSpec
from benchmarks.evidence.tasks import io_shape
from zpx_hf import PCTConfig, VersorConfig, ZPXConfig  # importing zpx_hf registers the families with the Auto classes

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
    "zpx_full": {
        "family": "zpx",
        "config": {"lambda_angle": 1.0, "lambda_sphere": 1.0, "rotary": "srpe", "center_loss_weight": 1e-4},
    },
    # the package defaults; `revision` 3 = PCT defaults_version 3 (tau from 5): a row of another revision (the
    # v2 defaults, tau from 20, which stayed at MQAR's plateau) is superseded, listed, never counted
    "pct": {"family": "pct", "config": {}, "revision": 3},
    # PCT score-scale options: the evidence suite's `pct_tuned` cell selects over every PCT entry here, so an
    # option is one line (3 more runs per task, +4 seeds if chosen). The fixed tau = sqrt(d) is the scale of
    # the defaults before issue 21 (its gate bias now also from the training length)
    "pct_tau_sqrt_d": {"family": "pct", "config": {"tau": "sqrt_d"}},
    # log-space scale from tau = 5 written out (pct_defaults.md: 0.997 on MQAR where 20 stays at the plateau); the
    # defaults since version 3, so its runs repeat `pct`'s: kept, as its rows chose those defaults
    "pct_tau5": {"family": "pct", "config": {"tau_init": 5.0}},
    "versor_gpa": {"family": "versor", "config": {"mixer": "gpa"}},
    "versor_rra": {"family": "versor", "config": {"mixer": "rra"}},
    "versor_hybrid": {"family": "versor", "config": {"mixer": "hybrid"}},
}
# hidden-size granule (2 heads, even head dim; Versor: 32 coefficients per channel), nominal MLP ratio
FAMILY_SHAPE = {"zpx": (8, 8 / 3), "pct": (4, 8 / 3), "versor": (32, 2.0)}
VERSOR_WIDTH_FACTOR = 4  # Versor widths are searched up to this multiple of the baseline hidden size
PHASE_CHANNELS = 4


def variant_revision(variant: str) -> int | None:
    """The revision of a variant's model (None: never revised); rows record it, and resume counts only its own."""
    return VARIANTS[base_variant(variant)].get("revision")


def family_of(variant: str) -> str:
    return VARIANTS[base_variant(variant)]["family"]


def base_variant(variant: str) -> str:
    """The model of a variant name: `versor_hybrid@time` (a wall-clock-matched row of the superseded medium
    protocol, still read from its jsonl for the step-time estimate) trained the `versor_hybrid` model."""
    return variant.split("@", 1)[0]


def model_config(
    variant: str,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    vocab: int,
    max_pos: int,
    train_length: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """Config of `variant` at the given widths (Versor: one multivector channel of 32 per head); PCT's gate bias
    starts at -log(train_length), the task's training length (default `max_pos`). `overrides` replace config
    fields of every variant alike (the body tokenisation's `causal=False, rotary="none"`)."""
    entry = VARIANTS[base_variant(variant)]
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 32 if entry["family"] == "versor" else heads,
        max_position_embeddings=max_pos,
        attn_implementation="sdpa",
        **{**entry["config"], **(overrides or {})},
    )
    if entry["family"] == "zpx":
        return ZPXConfig(phase_channels=PHASE_CHANNELS, **common)
    if entry["family"] == "pct":
        return PCTConfig(train_context_length=train_length or max_pos, **common)
    return VersorConfig(**common)


class SequenceRegressor(nn.Module):
    """linear read-in -> family backbone (`inputs_embeds`, causal) -> linear read-out, for state sequences."""

    def __init__(self, backbone: nn.Module, features: int) -> None:
        super().__init__()
        self.backbone = backbone
        probe = torch.zeros(1, 2, dtype=torch.long)
        with torch.no_grad():
            in_width = backbone.get_input_embeddings()(probe).shape[-1]
            out_width = backbone(input_ids=probe, use_cache=False).last_hidden_state.shape[-1]
        self.read_in = nn.Linear(features, in_width)
        self.read_out = nn.Linear(out_width, features)

    def forward(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(prediction [B, T, F], weighted ZPX centre loss or None)."""
        out = self.backbone(inputs_embeds=self.read_in(states), use_cache=False)
        weight = float(getattr(self.backbone.config, "center_loss_weight", 0.0))
        center = out.center_loss if weight > 0 else None  # the family's own regulariser output
        return self.read_out(out.last_hidden_state), (weight * center if center is not None else None)

    def counted_parameters(self) -> int:
        """Parameters without the backbone's token embedding (unused with `inputs_embeds`)."""
        unused = sum(p.numel() for p in self.backbone.get_input_embeddings().parameters())
        return sum(p.numel() for p in self.parameters()) - unused


# Cl(4,1) blades by generator bitmask (zpx_hf.clifford_algebra): e1..e3 are the space a body lives in
VECTOR_BLADES = (1, 2, 4)  # e1, e2, e3
PLANE_BLADES = (3, 5, 6)  # e12, e13, e23
INVARIANT_BLADES = (0, 8, 16)  # 1, e4, e5: fixed by rotations of e1..e3 (a conformal point's e_o, e_inf lie here)


class VectorRegressor(nn.Module):
    """Rotation- and translation-equivariant read-in / read-out around a Versor GPA backbone, for body tokens
    `[x (3), v (3)]` (one token per body, bidirectional, no positions).

    Read-in of body i, with p_i = x_i - mean_j x_j (translations cancel), into every channel c:

        e1..e3 (grade 1):   a_c p_i + b_c v_i
        e12, e13, e23:      w_c p_i ^ v_i
        1, e4, e5:          a linear map (with bias) of |p_i|^2, |v_i|^2, p_i . v_i      (rotation invariants)

    which spans the conformal embedding of p_i (p + |p|^2 / 2 e_inf + e_o, with e_o, e_inf in the e4-e5 plane).
    A rotation of e1..e3 acts on these coefficients as the rotor sandwich R m ~R does; VersorLinear, VersorNorm, the
    scalar-gated MLP and the GPA score (a scalar and a bivector norm of Q ~K) commute with it. Read-out: the
    e1..e3 part of every output channel, mixed over channels without bias: [dx, dv]_i = sum_c (u_c, s_c) <y_ic>_1.
    The RRA mixer's bivector projection is a dense map of all blades, so only `mixer="gpa"` qualifies.
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        config = backbone.config
        if config.model_type != "versor" or config.mixer != "gpa" or config.causal:
            raise ValueError(
                "VectorRegressor needs a bidirectional Versor backbone with mixer='gpa' (causal=False): RRA's "
                "bivector projection and a causal mask over bodies break rotation and permutation symmetry."
            )
        self.backbone = backbone
        channels = config.num_channels
        self.vector_in = nn.Parameter(torch.randn(channels, 2) / math.sqrt(2))
        self.plane_in = nn.Parameter(torch.randn(channels))
        self.invariant_in = nn.Linear(3, 3 * channels)
        self.read_out = nn.Linear(channels, 2, bias=False)
        self.register_buffer("blades", torch.tensor((*INVARIANT_BLADES, *VECTOR_BLADES, *PLANE_BLADES)), False)

    def forward(self, states: torch.Tensor) -> tuple[torch.Tensor, None]:
        """states [B, N, 6] -> ([B, N, 6] = [dx, dv] per body, no centre loss)."""
        x, v = states[..., :3], states[..., 3:]
        p = x - x.mean(dim=-2, keepdim=True)
        invariants = torch.stack(((p * p).sum(-1), (v * v).sum(-1), (p * v).sum(-1)), dim=-1)
        plane = torch.stack(
            (p[..., 0] * v[..., 1] - p[..., 1] * v[..., 0], p[..., 0] * v[..., 2] - p[..., 2] * v[..., 0],
             p[..., 1] * v[..., 2] - p[..., 2] * v[..., 1]), dim=-1,
        )  # fmt: skip
        channels = self.vector_in.shape[0]
        parts = (
            self.invariant_in(invariants).unflatten(-1, (channels, 3)),
            torch.einsum("ck,...kd->...cd", self.vector_in, torch.stack((p, v), dim=-2)),
            self.plane_in[:, None] * plane[..., None, :],
        )
        coefficients = torch.cat(parts, dim=-1)  # [B, N, C, 9] in the order of `blades`
        multivector = coefficients.new_zeros(*coefficients.shape[:-1], 32).index_copy(-1, self.blades, coefficients)
        hidden = self.backbone(inputs_embeds=multivector.flatten(-2), use_cache=False).last_hidden_state
        vectors = hidden.unflatten(-1, (channels, 32))[..., list(VECTOR_BLADES)]  # [B, N, C, 3]
        return self.read_out(vectors.transpose(-1, -2)).transpose(-1, -2).flatten(-2), None

    counted_parameters = SequenceRegressor.counted_parameters


def build_model(variant: str, width: dict[str, int], layers: int, heads: int, io: dict[str, Any]) -> nn.Module:
    """`*ForCausalLM` for token tasks (`io = {"vocab", "max_pos"}`), `SequenceRegressor` when `io` has
    `features` (continuous sequences); `io["config"]`, if given, overrides config fields (`model_config`)."""
    vocab = io.get("vocab", 4)
    config = model_config(
        variant,
        width["hidden"],
        width["intermediate"],
        layers,
        heads,
        vocab,
        io["max_pos"],
        io.get("train_length"),
        io.get("config"),
    )
    if "features" in io:
        return SequenceRegressor(AutoModel.from_config(config), io["features"])
    return AutoModelForCausalLM.from_config(config)


def count_parameters(model: nn.Module) -> int:
    if isinstance(model, (SequenceRegressor, VectorRegressor)):
        return model.counted_parameters()
    return sum(p.numel() for p in model.parameters())


def embedding_parameters(model: nn.Module) -> tuple[int, int]:
    """(token embedding, LM head) parameters of a `*ForCausalLM`; the head counts 0 when tied to the embedding."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    return embedding.numel(), 0 if head is embedding else head.numel()


def body_parameters(model: nn.Module) -> int:
    """Parameters of a `*ForCausalLM` without its token embedding and LM head: the body, which a family's width
    changes without the vocabulary's weight (a wide Versor's embeddings outweigh its body)."""
    return count_parameters(model) - sum(embedding_parameters(model))


def baseline_width(hidden: int) -> dict[str, int]:
    return {"hidden": hidden, "intermediate": int(FAMILY_SHAPE["zpx"][1] * hidden) // 8 * 8}


def match_width(
    variant: str,
    hidden: int,
    layers: int,
    heads: int,
    io: dict[str, int],
    tolerance: float,
    max_hidden: int | None,
    counter: Callable[[nn.Module], int] = count_parameters,
) -> dict[str, Any]:
    """Hidden/intermediate sizes whose parameter count (`counter`: all, or `body_parameters`) is nearest the
    baseline's at `hidden`.

    Parameters are affine in the intermediate size at a fixed hidden size, so two builds per hidden size
    give the intermediate size that hits the target; it is rounded to the family granule and verified.
    Versor's grade-wise linears hold far fewer weights than dense ones, so its hidden sizes are searched up
    to `max_hidden` (default VERSOR_WIDTH_FACTOR x hidden) and an unreachable count is reported as such."""
    target = counter(build_model("baseline", baseline_width(hidden), layers, heads, io))
    if variant == "baseline":
        return {**baseline_width(hidden), "params": target, "target": target, "matched": True}
    family = family_of(variant)
    granule, ratio = FAMILY_SHAPE[family]
    if family != "versor":
        granule = max(granule, 2 * heads)  # an even head dimension for every head (rotary pairs)
    inter_granule = 32 if family == "versor" else 8
    base = max(granule, round(hidden / granule) * granule)
    hiddens = sorted({max(granule, base + k * granule) for k in range(-4, 9)})
    if family == "versor":
        hiddens = list(range(granule, (max_hidden or VERSOR_WIDTH_FACTOR * hidden) + 1, granule))
    candidates = []
    for h in hiddens:
        lo, hi = inter_granule, 16 * inter_granule
        try:
            p_lo = counter(build_model(variant, {"hidden": h, "intermediate": lo}, layers, heads, io))
            p_hi = counter(build_model(variant, {"hidden": h, "intermediate": hi}, layers, heads, io))
        except ValueError:  # a width the family's config rejects (e.g. head shape): not a candidate
            continue
        slope = (p_hi - p_lo) / (hi - lo)
        if slope <= 0:
            continue
        inter = round((lo + (target - p_lo) / slope) / inter_granule) * inter_granule
        inter = int(min(max(inter, inter_granule), 12 * h))
        error = abs(p_lo + slope * (inter - lo) - target) / target
        candidates.append((error > tolerance, abs(math.log(inter / (ratio * h))), error, h, inter))
    _, _, _, h, inter = min(candidates)
    params = counter(build_model(variant, {"hidden": h, "intermediate": inter}, layers, heads, io))
    return {
        "hidden": h,
        "intermediate": inter,
        "params": params,
        "target": target,
        "matched": abs(params - target) / target <= tolerance,
    }


def width_table(spec: SizeSpec, variants: list[str], tasks: list[str], tolerance: float) -> dict[str, dict[str, Any]]:
    """`match_width` of every `variant/task`."""
    widths = {}
    for task in tasks:
        io = io_shape(task, spec.budgets[task], spec)
        for variant in variants:
            key = f"{base_variant(variant)}/{task}"
            if key not in widths:
                widths[key] = match_width(
                    base_variant(variant), spec.hidden, spec.layers, spec.heads, io, tolerance, spec.versor_max_hidden
                )
            widths[f"{variant}/{task}"] = widths[key]
    return widths


__all__ = [
    "FAMILY_SHAPE",
    "VARIANTS",
    "SequenceRegressor",
    "VectorRegressor",
    "base_variant",
    "baseline_width",
    "body_parameters",
    "build_model",
    "count_parameters",
    "embedding_parameters",
    "family_of",
    "match_width",
    "model_config",
    "width_table",
]
