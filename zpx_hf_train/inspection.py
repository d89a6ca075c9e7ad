"""Pictures of a trained model's geometry: ZPX phases, PCT gates, Versor rotors.

    zpx-inspect RUN_DIR [--text "..."] [--trust-remote-code]

Runs one sample text through the checkpoint in RUN_DIR (its saved tokenizer, eager attention) and writes
PNGs and `index.json` ([{"file", "title"}]) into RUN_DIR/inspection/:

* ZPX: every token's phase r e^{i phi} per layer and head (all phase channels, colour = position) with the
  per-channel centre of mass (1/n) sum_i r_i e^{i phi_i} that the centre-cancellation loss pushes to 0;
  the stereographic points s on the Riemann sphere; the attention weights.
* PCT: the sigmoid gates a_ij per head, their row sums (not 1: the gates do not compete), the learned
  temperature tau and gate bias b_h per layer.
* Versor: per RRA layer and head, over the sequence, the rotation angles, boost rapidity and |T~T - 1| of
  the rotor T_t the layer applies to token t (the accumulated R_t, times the per-token boost when
  `rra_accumulate="compact"`); per GPA layer and head the scalar and bivector-norm parts of the score.

Every figure is drawn from a data function (`zpx_circle_points`, `pct_gate_maps`, `rotor_geometry`, ...)
that reads only the model's public outputs and methods, so a test can compare the plotted arrays with the
model's own numbers. Run it as `zpx-inspect` or `python -m zpx_hf_train.inspection`.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError

import zpx_hf
from zpx_hf.clifford_algebra import (
    BIVECTOR_MASKS,
    NUM_BLADES,
    conformal_algebra,
    rotor_exp,
    rotor_norm_error,
    sandwich,
    to_matrix,
)

from .cli import guarded
from .config import ConfigError
from .job import weights_mismatch
from .run_folder import atomic_write, atomic_write_json, link_refused

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn
    from matplotlib.typing import RcKeyType

SAMPLE_TEXT = "The cat sat on the mat. The cat sat on the mat."
MAX_TOKENS = 64  # beyond this the per-token panels stop being readable
DPI = 100
VECTOR_MASKS = (1, 2, 4, 8, 16)  # e1..e4 (square +1), e5 (square -1)
BOOSTS = [i for i, mask in enumerate(BIVECTOR_MASKS) if mask & 16]  # e_i e5, in BIVECTOR_MASKS order

Drawing = tuple[str, str, Any]  # (file stem, one-line title, matplotlib Figure)


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def load_run(run_dir: str | Path, *, trust_remote_code: bool = False, device: str = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer) of a saved zpx-hf checkpoint, eager attention, eval mode.

    By default the installed zpx_hf classes load the weights; `trust_remote_code=True` runs the code
    saved in the folder instead, after `check_auto_map`. Raises `ConfigError` (a ValueError) naming the folder
    when it is not such a checkpoint and naming `device` when there is no such device."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError(f"run_dir {str(path)!r} is not a folder; pass the output_dir of a training run.")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"run_dir {str(path)!r} has no config.json; pass a folder written by save_pretrained.")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        model_type, auto_map = config.get("model_type"), config.get("auto_map", {})
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
        raise ConfigError(f"run_dir {str(path)!r}: config.json is not a UTF-8 JSON object ({error}).") from None
    if model_type not in zpx_hf.FAMILIES:
        raise ConfigError(
            f"run_dir {str(path)!r} holds model_type {model_type!r}, not a zpx-hf checkpoint "
            f"(expected one of {sorted(zpx_hf.FAMILIES)})."
        )
    if trust_remote_code and "AutoModelForCausalLM" not in auto_map:
        raise ConfigError(
            f"run_dir {str(path)!r} carries no model code (config.json auto_map has no AutoModelForCausalLM); "
            "load it without trust_remote_code."
        )
    if trust_remote_code:
        check_auto_map(path, auto_map)
    target = check_device(device)
    mismatch = weights_mismatch(path)
    if mismatch:
        raise ConfigError(f"run_dir {str(path)!r} could not be loaded: {mismatch}.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        if trust_remote_code:
            # The Auto classes prefer the registered zpx_hf classes even when remote code is trusted, so
            # the folder's class is fetched explicitly.
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            model_class = get_class_from_dynamic_module(auto_map["AutoModelForCausalLM"], str(path))
            if not issubclass(model_class, PreTrainedModel):
                raise ConfigError(
                    f"run_dir {str(path)!r}: auto_map's AutoModelForCausalLM {model_class.__name__} is not a "
                    "transformers model class; load it without trust_remote_code."
                )
            model = model_class.from_pretrained(path, attn_implementation="eager")
        else:
            model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    except (OSError, ValueError, SafetensorError) as error:  # missing or truncated files, wrong shapes
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"run_dir {str(path)!r} could not be loaded: {first_line}") from None
    # arg-type: transformers wraps `PreTrainedModel.to` in `functools.wraps`, which mypy does not bind to the instance
    return model.to(target).eval(), tokenizer  # type: ignore[arg-type]


_SAME_FOLDER_CLASS = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*$")  # module.Class, the module beside config.json


def check_auto_map(path: Path, auto_map: dict[str, Any]) -> None:
    """Every `auto_map` entry names a module file inside the checkpoint folder.

    transformers resolves `module.Class` as `os.path.join(folder, "module.py")`, so an absolute module path
    (`/elsewhere/code.Class`) or `../code.Class` runs a file outside the folder, and `owner/repo--code.Class`
    fetches code from another Hub repo; with `trust_remote_code=True` it runs. Refused here."""
    for key, value in auto_map.items():
        for reference in value if isinstance(value, list) else [value]:
            if reference is None:
                continue
            if not isinstance(reference, str) or not _SAME_FOLDER_CLASS.match(reference):
                raise ConfigError(
                    f"run_dir {str(path)!r}: config.json auto_map[{key!r}] = {reference!r} does not name a module in "
                    "the checkpoint folder (module.Class); refusing to run code from elsewhere."
                )
            module = reference.split(".")[0] + ".py"
            if not (path / module).is_file():
                raise ConfigError(f"run_dir {str(path)!r}: auto_map[{key!r}] names {module}, which is not there.")


def check_device(device: str) -> torch.device:
    """`--device` as a torch device that exists on this machine; `ConfigError` naming the flag otherwise."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"--device {device!r} is not a torch device ({error}); use cpu or cuda.") from None
    if resolved.type == "cpu":
        return resolved
    backend = getattr(torch, resolved.type, None)
    available = getattr(backend, "is_available", lambda: False)()
    count = getattr(backend, "device_count", lambda: 1)() if available else 0
    if not available or (resolved.index or 0) >= count:
        raise ConfigError(f"--device {device!r}: this machine has no such {resolved.type} device; use --device cpu.")
    return resolved


def encode(tokenizer: Any, text: str) -> tuple[torch.Tensor, list[str]]:
    """input_ids [1, L] of `text` and one printable label per token."""
    if not text:
        raise ConfigError("text is empty; pass a sample sentence (or leave --text out for the default).")
    input_ids = tokenizer(text, return_tensors="pt")["input_ids"]
    bos = tokenizer.bos_token_id
    if bos is not None and (input_ids.shape[1] == 0 or input_ids[0, 0] != bos):  # documents start with BOS in training
        input_ids = torch.cat((torch.full((1, 1), bos, dtype=input_ids.dtype), input_ids), dim=1)
    if input_ids.shape[1] > MAX_TOKENS:
        raise ConfigError(
            f"text has {input_ids.shape[1]} tokens; the pictures show at most {MAX_TOKENS}: pass a shorter --text."
        )
    labels = [tokenizer.decode([token]).replace(" ", "\u2423") or "?" for token in input_ids[0].tolist()]
    return input_ids, labels


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().to("cpu", torch.float64).numpy()


# --------------------------------------------------------------------------------------------------
# Data functions (arrays of the first sequence in the batch)
# --------------------------------------------------------------------------------------------------


def zpx_circle_points(outputs: Any) -> dict[str, np.ndarray]:
    """From `outputs.phases` (per layer Phi [B, L, H, C, 7] = [log_r, cos phi, sin phi, X, Y, Z, b]; H counts
    key-value heads, one phase each, in a grouped-query model):
    `points` [layers, L, H, C, 2] = r (cos phi, sin phi) with r = exp(log_r), and `center`
    [layers, H, C, 2] = (1/n) sum_i r_i e^{i phi_i}."""
    phi = np.stack([_numpy(layer[0]) for layer in outputs.phases])  # [layers, L, H, C, 7]
    radius = np.exp(phi[..., 0])
    points = np.stack((radius * phi[..., 1], radius * phi[..., 2]), axis=-1)
    return {"points": points, "center": points.mean(axis=1)}


def zpx_sphere_points(outputs: Any) -> np.ndarray:
    """The stereographic points s = (X, Y, Z) of Phi, [layers, L, H, C, 3]."""
    return np.stack([_numpy(layer[0, ..., 3:6]) for layer in outputs.phases])


def attention_maps(outputs: Any) -> np.ndarray:
    """`outputs.attentions` (per layer [B, H, L, L]) as [layers, H, L, L]: ZPX softmax weights, PCT gates."""
    if outputs.attentions is None or any(a is None for a in outputs.attentions):
        raise ValueError("the model returned no attention weights; load it with attn_implementation='eager'.")
    return np.stack([_numpy(layer[0]) for layer in outputs.attentions])


def pct_gate_maps(outputs: Any) -> dict[str, np.ndarray]:
    """PCT gates a_ij [layers, H, L, L] and their row sums sum_j a_ij [layers, H, L]."""
    gates = attention_maps(outputs)
    return {"gates": gates, "row_sums": gates.sum(axis=-1)}


def pct_parameters(model: Any) -> dict[str, Any]:
    """Per layer and head: `tau` [layers, H] (`temperature()`, broadcast when fixed) and `gate_bias` b_h."""
    taus, biases = [], []
    for layer in model.model.layers:
        attention = layer.self_attn
        bias = _numpy(attention.gate_bias)
        tau = attention.temperature()
        taus.append(_numpy(tau) if torch.is_tensor(tau) else np.full_like(bias, float(tau)))
        biases.append(bias)
    return {"tau": np.stack(taus), "gate_bias": np.stack(biases), "tau_learned": model.config.learnable_tau}


def versor_mixer_inputs(model: Any, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the normed hidden states its mixer receives (first positional argument), captured by a pre-hook."""
    captured: dict[int, torch.Tensor] = {}

    def hook_for(index: int) -> Callable:
        def hook(module: torch.nn.Module, args: tuple) -> None:
            captured[index] = args[0].detach()

        return hook

    handles = [layer.mixer.register_forward_pre_hook(hook_for(i)) for i, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return [captured[index] for index in range(len(model.model.layers))]  # every mixer ran once


def vector_representation(rotors: torch.Tensor) -> torch.Tensor:
    """Lambda [..., 5, 5] of rotors [..., 32]: column b holds the e1..e5 coefficients of R e_b ~R (float64)."""
    rotor_matrix = to_matrix(rotors.double())[..., None, :, :, :]  # [..., 1, 2, 4, 4]
    basis = torch.zeros(len(VECTOR_MASKS), NUM_BLADES, dtype=torch.float64, device=rotors.device)
    basis[range(len(VECTOR_MASKS)), list(VECTOR_MASKS)] = 1.0
    images = sandwich(rotor_matrix, basis)  # [..., b, 32]
    return images[..., list(VECTOR_MASKS)].transpose(-1, -2)


def rotor_geometry(rotors: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rotation angles, boost rapidity and |R~R - 1| of rotors [..., 32] (float64, shape [...] each).

    Through the vector representation Lambda in SO+(4,1) (metric diag(1, 1, 1, 1, -1)):
      rapidity   eta = arccosh(Lambda_55)      (Lambda e5 = (p, gamma), gamma = cosh eta)
      polar form Lambda = L(p) Q with the pure boost L(p) = [[I + p p^T / (1 + gamma), p], [p^T, gamma]],
                 so Q = L(-p) Lambda fixes e5 and its 4x4 block Q4 is in SO(4)
      angles     Q4 has eigenvalues e^{+-i theta1}, e^{+-i theta2}:  c1 + c2 = tr Q4 / 2,
                 c1^2 + c2^2 = tr Q4^2 / 4 + 1 with c = cos theta, so c = (S -+ sqrt(2T - S^2)) / 2.
    A rotor exp(-(a e12 + b e34)/2) gives angles (|a|, |b|) in [0, pi]; exp(-eta e15/2) gives rapidity |eta|.
    """
    lam = vector_representation(rotors)
    gamma = lam[..., 4, 4]
    p = lam[..., :4, 4]
    eye = torch.eye(4, dtype=lam.dtype, device=lam.device)
    spatial = eye + p[..., :, None] * p[..., None, :] / (1.0 + gamma)[..., None, None]
    q4 = spatial @ lam[..., :4, :4] - p[..., :, None] * lam[..., 4, None, :4]
    s = torch.diagonal(q4, dim1=-2, dim2=-1).sum(-1) / 2
    t = torch.diagonal(q4 @ q4, dim1=-2, dim2=-1).sum(-1) / 4 + 1
    spread = torch.sqrt(torch.clamp(2 * t - s * s, min=0.0))
    return {
        "theta1": torch.arccos(torch.clamp((s - spread) / 2, -1.0, 1.0)),
        "theta2": torch.arccos(torch.clamp((s + spread) / 2, -1.0, 1.0)),
        "rapidity": torch.arccosh(torch.clamp(gamma, min=1.0)),
        "norm_error": rotor_norm_error(to_matrix(rotors.double())),
    }


def rra_rotor_data(model: Any, mixer_inputs: Sequence[torch.Tensor]) -> list[tuple[int, dict[str, np.ndarray]]]:
    """Per RRA layer, for the first sequence: `rotors` R_t [L, H, 32] (`rotor_trajectory`), `applied` T_t, the
    rotor whose sandwich T_t v_t ~T_t the layer applies to token t, and T_t's `rotor_geometry` [L, H].

    accumulate="full": T_t = R_t. "compact": R_t holds only the rotations and T_t = R_t exp(-A_t/2) with A_t
    the boost part of B_t (ops_rra), so the rapidity shown is that of the per-token boost."""
    from zpx_hf.ops_rra import rotor_trajectory

    algebra = conformal_algebra()
    result = []
    for index, layer in enumerate(model.model.layers):
        if layer.mixer_type != "rra":
            continue
        with torch.no_grad():
            bivectors = layer.mixer.bivectors(mixer_inputs[index])[0:1]
            rotors = rotor_trajectory(bivectors, accumulate=model.config.rra_accumulate)[0].double()
            applied = rotors
            if model.config.rra_accumulate == "compact":
                boosts = torch.zeros_like(bivectors[0], dtype=torch.float64)
                boosts[..., BOOSTS] = bivectors[0, ..., BOOSTS].double()
                applied = algebra.geometric_product(rotors, rotor_exp(boosts))
        data = {name: _numpy(value) for name, value in rotor_geometry(applied).items()}
        data.update(rotors=_numpy(rotors), applied=_numpy(applied))
        result.append((index, data))
    return result


def gpa_score_data(model: Any, mixer_inputs: Sequence[torch.Tensor]) -> list[tuple[int, dict[str, np.ndarray]]]:
    """Per GPA layer: `scalar` <P_ij>_0 and `bivector` ||<P_ij>_2|| [H, L, L], and `gamma` [H]."""
    from zpx_hf.ops_gpa import gpa_score_parts

    result = []
    for index, layer in enumerate(model.model.layers):
        if layer.mixer_type != "gpa":
            continue
        with torch.no_grad():
            query, key, _ = layer.mixer.project(mixer_inputs[index][0:1])
            scalar, bivector = gpa_score_parts(query, key, eps=model.config.gpa_eps)
        data = {"scalar": _numpy(scalar[0]), "bivector": _numpy(bivector[0]), "gamma": _numpy(layer.mixer.gamma)}
        result.append((index, data))
    return result


# --------------------------------------------------------------------------------------------------
# Figures (matplotlib Figure objects, no pyplot state)
# --------------------------------------------------------------------------------------------------

STYLE: dict[RcKeyType, Any] = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "figure.titlesize": 9,
}
PHASE = r"$r\,e^{i\varphi}$"


def _figure(width: float, height: float) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _token_ticks(ax: Any, labels: Sequence[str]) -> None:
    """Token labels on both axes of an [L, L] map (every k-th when there are many)."""
    step = max(1, math.ceil(len(labels) / 24))
    ticks = list(range(0, len(labels), step))
    shown = [labels[i] for i in ticks]
    ax.set_xticks(ticks, shown, fontsize=6, rotation=90 if max(map(len, shown)) > 3 else 0)
    ax.set_yticks(ticks, shown, fontsize=6)


def _colour_scale(norm: Any, cmap: str) -> Any:
    """The colour bar's scale: the norm and colour map every panel's artist uses (any panel's artist would do)."""
    from matplotlib.cm import ScalarMappable

    return ScalarMappable(norm=norm, cmap=cmap)


def _positions_norm(length: int) -> Any:
    """Token positions 0 .. L-1 onto the colour map (what a scatter of them scales to by itself)."""
    from matplotlib.colors import Normalize

    return Normalize(vmin=0, vmax=length - 1)


def circle_figure(data: dict[str, np.ndarray]) -> Any:
    """Grid layer x head: r e^{i phi} of every token and channel (colour = position), the unit circle and
    the per-channel centres of mass. Artists: gid "tokens" (points flattened token-major) and "center"."""
    points, center = data["points"], data["center"]
    layers, length, heads, channels = points.shape[:4]
    fig = _figure(2.6 * heads + 0.9, 2.8 * layers + 1.0)
    axes = fig.subplots(layers, heads, squeeze=False)
    positions, norm = np.repeat(np.arange(length), channels), _positions_norm(length)
    circle = np.linspace(0, 2 * np.pi, 200)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer, head]
            xy = points[layer, :, head].reshape(-1, 2)
            ax.plot(np.cos(circle), np.sin(circle), color="0.55", lw=0.8, ls="--", label="unit circle r = 1")
            tokens = ax.scatter(
                xy[:, 0], xy[:, 1], c=positions, cmap="viridis", norm=norm, s=7, label=f"token phase {PHASE}"
            )
            tokens.set_gid("tokens")
            com = ax.scatter(*center[layer, head].T, marker="x", color="red", s=36, label="centre of mass per channel")
            com.set_gid("center")
            reach = max(1.2, 1.05 * float(np.abs(xy).max()))
            ax.set_xlim(-reach, reach)
            ax.set_ylim(-reach, reach)
            ax.set_aspect("equal")
            mean_norm = float(np.linalg.norm(center[layer, head], axis=-1).mean())
            ax.set_title(f"layer {layer} head {head}\nmean |centre| = {mean_norm:.2f}")
            if layer == layers - 1:  # every panel keeps its tick labels: the scales differ
                ax.set_xlabel(r"$r\cos\varphi$")
            if head == 0:
                ax.set_ylabel(r"$r\sin\varphi$")
    fig.colorbar(_colour_scale(norm, "viridis"), ax=axes, shrink=0.6, label="token position")
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=3)
    fig.suptitle(f"ZPX phases {PHASE}: {length} tokens x {channels} channels per head")
    return fig


def sphere_figure(sphere: np.ndarray) -> Any:
    """Grid layer x head: the stereographic points s on the Riemann sphere (colour = position).
    Artist: gid "tokens" (a 3-D scatter of the points flattened token-major)."""
    layers, length, heads, channels = sphere.shape[:4]
    fig = _figure(2.6 * heads + 0.9, 2.6 * layers + 0.8)
    positions, norm = np.repeat(np.arange(length), channels), _positions_norm(length)
    angle = np.linspace(0, 2 * np.pi, 120)
    for layer in range(layers):
        for head in range(heads):
            ax = fig.add_subplot(layers, heads, layer * heads + head + 1, projection="3d")
            ax.plot(np.cos(angle), np.sin(angle), 0 * angle, color="0.45", lw=0.8)  # equator r = 1
            for meridian in (0.0, np.pi / 2):
                ax.plot(np.cos(meridian) * np.sin(angle), np.sin(meridian) * np.sin(angle), np.cos(angle),
                        color="0.75", lw=0.6, ls=":")  # fmt: skip
            xyz = sphere[layer, :, head].reshape(-1, 3)
            tokens = ax.scatter(*xyz.T, c=positions, cmap="viridis", norm=norm, s=6, depthshade=False)
            tokens.set_gid("tokens")
            ax.text(0, 0, 1.12, r"N: $r\to\infty$", ha="center", fontsize=7)
            ax.text(0, 0, -1.25, "S: r = 0", ha="center", fontsize=7)
            ax.set_box_aspect((1, 1, 1))
            ax.view_init(elev=20, azim=-60)
            ax.set_axis_off()
            ax.set_title(f"layer {layer} head {head}")
    fig.colorbar(_colour_scale(norm, "viridis"), ax=fig.axes, shrink=0.6, label="token position")
    fig.suptitle(
        r"ZPX Riemann sphere $s = (2x,\ 2y,\ r^2-1)\,/\,(1+r^2)$"
        + "\nsolid circle: equator r = 1 (view from 20° elevation)"
    )
    return fig


def map_figure(
    maps: np.ndarray, labels: Sequence[str], title: str, colour_label: str, vmax: float | None = None
) -> Any:
    """Grid layer x head of [L, L] maps (query rows, key columns) on a square-root colour scale from 0 to
    `vmax` (default: the largest entry), so small weights stay visible. Artist: each panel's AxesImage holds
    `maps[layer, head]`."""
    from matplotlib.colors import PowerNorm

    layers, heads = maps.shape[:2]
    fig = _figure(2.9 * heads + 0.9, 2.9 * layers + 0.6)
    axes = fig.subplots(layers, heads, squeeze=False)
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=float(maps.max()) if vmax is None else vmax)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer, head]
            ax.imshow(maps[layer, head], cmap="magma", norm=norm, interpolation="nearest")
            ax.set_title(f"layer {layer} head {head}")
            _token_ticks(ax, labels)
            ax.set_xlabel("key j")
            ax.set_ylabel("query i")
    fig.colorbar(_colour_scale(norm, "magma"), ax=axes, shrink=0.6, label=f"{colour_label} (square-root scale)")
    fig.suptitle(title)
    return fig


def row_sum_figure(row_sums: np.ndarray) -> Any:
    """Per layer: sum_j a_ij against the query position i, one line per head, and the softmax level 1."""
    layers, heads, length = row_sums.shape
    fig = _figure(min(4.0 * layers, 12.0), 3.0)
    axes = fig.subplots(1, layers, squeeze=False)[0]
    for layer, ax in enumerate(axes):
        for head in range(heads):
            ax.plot(np.arange(length), row_sums[layer, head], marker=".", ms=3, lw=1, label=f"head {head}")
        ax.axhline(1.0, color="0.3", ls="--", lw=0.8, label="softmax (rows sum to 1)")
        ax.set_xlabel("query position i")
        ax.set_ylabel(r"$\sum_j a_{ij}$")
        ax.set_title(f"layer {layer}")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("PCT gate row sums: the non-competitive gates need not sum to 1")
    return fig


def pct_parameter_figure(params: dict[str, Any]) -> Any:
    """tau and b_h against the layer, one marker series per head."""
    tau, bias = params["tau"], params["gate_bias"]
    layers, heads = bias.shape
    fig = _figure(7.0, 2.9)
    axes = fig.subplots(1, 2)
    tau_kind = "learned" if params["tau_learned"] else "fixed by the config"
    panels = ((axes[0], tau, rf"temperature $\tau$ ({tau_kind})"), (axes[1], bias, r"gate bias $b_h$"))
    for ax, values, name in panels:
        for head in range(heads):
            ax.plot(np.arange(layers), values[:, head], marker="o", ms=4, lw=0.8, label=f"head {head}")
        ax.set_xticks(range(layers))
        ax.set_xlabel("layer")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[1].legend()
    fig.suptitle(r"PCT gate $a_{ij} = \sigma(\tau\,\cos(q_i, k_j) + b_h)$: parameters per layer and head")
    return fig


def rra_figure(layers: Sequence[tuple[int, dict[str, np.ndarray]]], accumulate: str) -> Any:
    """Rows: RRA layers; columns: rotation angles, boost rapidity and |T~T - 1| of the applied rotor T_t
    against t, per head. Artists: lines labelled "head h theta1", "head h theta2", "head h"."""
    fig = _figure(11.0, 2.6 * len(layers) + 0.7)
    axes = fig.subplots(len(layers), 3, squeeze=False)
    for row, (layer, data) in enumerate(layers):
        length, heads = data["theta1"].shape
        t = np.arange(length)
        for head in range(heads):
            colour = f"C{head % 10}"
            axes[row, 0].plot(t, data["theta1"][:, head], color=colour, lw=1, label=f"head {head} theta1")
            axes[row, 0].plot(t, data["theta2"][:, head], color=colour, lw=1, ls="--", label=f"head {head} theta2")
            axes[row, 1].plot(t, data["rapidity"][:, head], color=colour, lw=1, label=f"head {head}")
            axes[row, 2].plot(t, data["norm_error"][:, head], color=colour, lw=1, label=f"head {head}")
        axes[row, 0].set_ylabel(f"layer {layer}\nangle (rad)")
        axes[row, 1].set_ylabel(r"rapidity $\eta$")
        axes[row, 2].set_ylabel(r"max $|T\tilde T - 1|$")
        axes[row, 2].set_yscale("log")
        for ax in axes[row]:
            ax.set_xlabel("token position t")
            ax.grid(alpha=0.3)
    axes[0, 0].set_title(r"rotation angles of $T_t$: $\theta_1$ (solid) $\geq \theta_2$ (dashed)")
    axes[0, 1].set_title(r"boost rapidity of $T_t$")
    axes[0, 2].set_title("distance from the rotor group")
    axes[0, 1].legend()
    if accumulate == "compact":
        how = r"$T_t = R_t\,e^{-A_t/2}$: accumulated rotations $R_t$, per-token boost $A_t$ (compact)"
    else:
        how = r"$T_t = R_t = dR_0 \cdots dR_t$, rotations and boosts accumulated (full)"
    fig.suptitle(f"Versor RRA rotor applied to token t per head: {how}")
    return fig


def gpa_figure(layers: Sequence[tuple[int, dict[str, np.ndarray]]], labels: Sequence[str], causal: bool) -> Any:
    """Rows (layer, head); columns <P_ij>_0 and ||<P_ij>_2||; keys after the query are masked when causal.
    Artists: the AxesImage of each panel holds the (masked) part."""
    rows = [(layer, head, data) for layer, data in layers for head in range(data["scalar"].shape[0])]
    fig = _figure(6.4, 2.9 * len(rows) + 0.6)
    axes = fig.subplots(len(rows), 2, squeeze=False)
    for row, (layer, head, data) in enumerate(rows):
        scalar, bivector = data["scalar"][head], data["bivector"][head]
        hidden = np.triu(np.ones(scalar.shape, dtype=bool), k=1) if causal else np.zeros(scalar.shape, dtype=bool)
        limit = float(np.abs(scalar[~hidden]).max()) or 1.0
        titles = (
            rf"layer {layer} head {head}: scalar part $\langle P_{{ij}}\rangle_0$",
            rf"bivector norm $\|\langle P_{{ij}}\rangle_2\|$, $\gamma_h$ = {data['gamma'][head]:.3f}",
        )
        panels = ((scalar, "RdBu_r", -limit, limit), (bivector, "magma", 0.0, None))
        for ax, title, (values, cmap, vmin, vmax) in zip(axes[row], titles, panels):
            image = ax.imshow(
                np.ma.masked_array(values, hidden), cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest"
            )
            fig.colorbar(image, ax=ax, shrink=0.8)
            _token_ticks(ax, labels)
            ax.set_title(title)
            ax.set_xlabel("key j")
            ax.set_ylabel("query i")
    fig.suptitle(
        r"Versor GPA score parts, $P_{ij} = \sum_{ch} Q_i \tilde K_j$"
        + "\n"
        + r"score $= (\langle P\rangle_0 + \gamma_h \|\langle P\rangle_2\|)/\sqrt{d}$"
    )
    return fig


# --------------------------------------------------------------------------------------------------
# Per family
# --------------------------------------------------------------------------------------------------


def zpx_drawings(model: Any, input_ids: torch.Tensor, labels: Sequence[str]) -> list[Drawing]:
    with torch.no_grad():
        outputs = model(input_ids=input_ids, output_phases=True, output_attentions=True, return_dict=True)
    return [
        ("zpx_phase_circle", "ZPX token phases r e^{i phi} per layer and head, with the centre of mass",
         circle_figure(zpx_circle_points(outputs))),
        ("zpx_phase_sphere", "ZPX token phases on the Riemann sphere (stereographic points s)",
         sphere_figure(zpx_sphere_points(outputs))),
        ("zpx_attention", "ZPX attention weights (eager path) per layer and head",
         map_figure(attention_maps(outputs), labels, "ZPX attention weights (eager softmax)", "weight", 1.0)),
    ]  # fmt: skip


def pct_drawings(model: Any, input_ids: torch.Tensor, labels: Sequence[str]) -> list[Drawing]:
    with torch.no_grad():
        outputs = model(input_ids=input_ids, output_attentions=True, return_dict=True)
    gates = pct_gate_maps(outputs)
    title = r"PCT gates $a_{ij} = \sigma(\tau \cos(q_i, k_j) + b_h) \in (0, 1)$, colour scale up to the largest gate"
    return [
        ("pct_gates", "PCT sigmoid gates a_ij per layer and head",
         map_figure(gates["gates"], labels, title, "gate")),
        ("pct_row_sums", "PCT gate row sums per query (softmax would give 1)", row_sum_figure(gates["row_sums"])),
        ("pct_parameters", "PCT learned temperature tau and gate bias b_h per layer and head",
         pct_parameter_figure(pct_parameters(model))),
    ]  # fmt: skip


def versor_drawings(model: Any, input_ids: torch.Tensor, labels: Sequence[str]) -> list[Drawing]:
    inputs = versor_mixer_inputs(model, input_ids)
    drawings = []
    rra = rra_rotor_data(model, inputs)
    if rra:
        drawings.append(
            ("versor_rra_rotors", "Versor RRA rotor R_t per head: rotation angles, boost rapidity, |R~R - 1|",
             rra_figure(rra, model.config.rra_accumulate))
        )  # fmt: skip
    gpa = gpa_score_data(model, inputs)
    if gpa:
        drawings.append(
            ("versor_gpa_scores", "Versor GPA score parts per head: scalar <P>_0 and bivector norm ||<P>_2||",
             gpa_figure(gpa, labels, bool(model.config.causal)))
        )  # fmt: skip
    return drawings


FAMILY_DRAWINGS: dict[str, Callable[[Any, torch.Tensor, Sequence[str]], list[Drawing]]] = {
    "zpx": zpx_drawings,
    "pct": pct_drawings,
    "versor": versor_drawings,
}


def inspect_run(
    run_dir: str | Path, text: str | None = None, *, device: str = "cpu", trust_remote_code: bool = False
) -> list[Path]:
    """Draw the geometry of the checkpoint in `run_dir` for `text` (default `SAMPLE_TEXT`).

    Writes RUN_DIR/inspection/<name>.png and RUN_DIR/inspection/index.json ([{"file", "title"}]);
    returns the PNG paths."""
    import matplotlib

    model, tokenizer = load_run(run_dir, trust_remote_code=trust_remote_code, device=device)
    input_ids, labels = encode(tokenizer, SAMPLE_TEXT if text is None else text)
    folder = Path(run_dir) / "inspection"
    if folder.is_symlink():
        raise link_refused(folder)
    paths, index = [], []
    with matplotlib.rc_context(STYLE):
        for name, title, fig in FAMILY_DRAWINGS[model.config.model_type](model, input_ids.to(device), labels):
            path = folder / f"{name}.png"
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png")
            atomic_write(path, buffer.getvalue())
            paths.append(path)
            index.append({"file": path.name, "title": title})
    atomic_write_json(folder / "index.json", index)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="zpx-inspect", description="Draw the geometry of a trained zpx-hf model into RUN_DIR/inspection/."
    )
    parser.add_argument("run_dir", help="folder written by save_pretrained (model, config and tokenizer)")
    parser.add_argument("--text", default=None, help=f"sample text (default: {SAMPLE_TEXT!r})")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="run the model code saved in RUN_DIR instead of zpx_hf's"
    )
    args = parser.parse_args(argv)
    code, paths = guarded(
        lambda: inspect_run(args.run_dir, args.text, device=args.device, trust_remote_code=args.trust_remote_code),
        "zpx-inspect",
    )
    for path in paths or []:
        print(path)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
