"""zpx-inspect: the pictures of a trained model show the model's own numbers (tiny random models per family)."""

import json
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from helpers_remote import run_remote_code

from zpx_hf import PCTConfig, PCTForCausalLM, VersorConfig, VersorForCausalLM, ZPXConfig, ZPXForCausalLM
from zpx_hf.clifford_algebra import BIVECTOR_MASKS, conformal_algebra, rotor_exp
from zpx_hf.tokenization_bytes import VOCAB_SIZE, build_byte_tokenizer
from zpx_hf_train.inspection import (
    SAMPLE_TEXT,
    attention_maps,
    circle_figure,
    encode,
    gpa_figure,
    gpa_score_data,
    inspect_run,
    load_run,
    main,
    map_figure,
    pct_gate_maps,
    pct_parameter_figure,
    pct_parameters,
    rotor_geometry,
    row_sum_figure,
    rra_figure,
    rra_rotor_data,
    sphere_figure,
    versor_mixer_inputs,
    zpx_circle_points,
    zpx_sphere_points,
)


def tiny_config(config_class, **fields):
    base = dict(vocab_size=VOCAB_SIZE, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    return config_class(**{**base, "max_position_embeddings": 64, **fields})


def save_run(model, folder):
    model.save_pretrained(folder)
    build_byte_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def zpx_run(tmp_path_factory):
    torch.manual_seed(0)
    # initializer_range 0.3: phases spread over the circle and the radius off 1
    config = tiny_config(ZPXConfig, hidden_size=32, phase_channels=3, initializer_range=0.3)
    return save_run(ZPXForCausalLM(config), tmp_path_factory.mktemp("zpx"))


@pytest.fixture(scope="module")
def pct_run(tmp_path_factory):
    torch.manual_seed(0)
    config = tiny_config(PCTConfig, hidden_size=16, tau="learnable")
    model = PCTForCausalLM(config)
    with torch.no_grad():  # distinct values per layer and head, as training would leave them
        for i, layer in enumerate(model.model.layers):
            layer.self_attn.tau.copy_(torch.tensor([2.0 + i, 3.5 - i]))
            layer.self_attn.gate_bias.copy_(torch.tensor([-1.0 - i, 0.5 * i]))
    return save_run(model, tmp_path_factory.mktemp("pct"))


def sample_outputs(run_dir, **flags):
    model, tokenizer = load_run(run_dir)
    input_ids, labels = encode(tokenizer, SAMPLE_TEXT)
    with torch.no_grad():
        outputs = model(input_ids=input_ids, output_attentions=True, return_dict=True, **flags)
    return model, input_ids, labels, outputs


def check_pictures(paths, run_dir, names):
    folder = run_dir / "inspection"
    assert [p.name for p in paths] == [f"{name}.png" for name in names]
    index = json.loads((folder / "index.json").read_text())
    assert [entry["file"] for entry in index] == [p.name for p in paths]
    assert all(entry["title"] and "\n" not in entry["title"] for entry in index)
    for path in paths:
        assert path.parent == folder
        assert 5_000 < path.stat().st_size < 400_000  # a picture, small enough for a model card
        pixels = matplotlib.image.imread(path)[..., :3]
        assert pixels.std() > 0.05  # not a blank canvas


def by_gid(ax, gid):
    (artist,) = [c for c in ax.collections if c.get_gid() == gid]
    return artist


def test_zpx_pictures_plot_the_phase_tensor(zpx_run):
    paths = inspect_run(zpx_run)
    check_pictures(paths, zpx_run, ["zpx_phase_circle", "zpx_phase_sphere", "zpx_attention"])

    model, input_ids, labels, outputs = sample_outputs(zpx_run, output_phases=True)
    assert model.config._attn_implementation == "eager"
    assert len(labels) == input_ids.shape[1] == len(SAMPLE_TEXT) + 1  # bytes + BOS
    phi = torch.stack(outputs.phases)[:, 0].double()  # [layers, L, H, C, 7]
    radius = phi[..., 0].exp()
    data = zpx_circle_points(outputs)
    float64 = {"rtol": 4 * np.finfo(np.float64).eps, "atol": 0}  # numpy's exp against torch's
    np.testing.assert_allclose(data["points"][..., 0], (radius * phi[..., 1]).numpy(), **float64)
    np.testing.assert_allclose(data["points"][..., 1], (radius * phi[..., 2]).numpy(), **float64)
    # independent of Phi's layout: the plotted radius is exp(log_r), the angle that of (cos phi, sin phi)
    np.testing.assert_allclose(np.hypot(*np.moveaxis(data["points"], -1, 0)), radius.numpy(), rtol=1e-6)
    assert radius.min() < 0.9 and radius.max() > 1.1  # the test model's phases are off the unit circle
    sums = torch.complex(radius * phi[..., 1], radius * phi[..., 2]).sum(dim=1) / input_ids.shape[1]
    np.testing.assert_allclose(data["center"][..., 0] + 1j * data["center"][..., 1], sums.numpy(), rtol=0, atol=1e-12)

    sphere = zpx_sphere_points(outputs)
    np.testing.assert_array_equal(sphere, phi[..., 3:6].numpy())
    # the sphere points are the stereographic images of the plotted plane points
    x, y = np.moveaxis(data["points"], -1, 0)
    den = 1 + x**2 + y**2
    stereo = np.stack((2 * x / den, 2 * y / den, (x**2 + y**2 - 1) / den), axis=-1)
    np.testing.assert_allclose(sphere, stereo, rtol=0, atol=1e-6)  # Phi is float32

    weights = attention_maps(outputs)
    np.testing.assert_array_equal(weights, torch.stack(outputs.attentions)[:, 0].double().numpy())
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)  # softmax rows
    assert np.all(np.triu(weights, k=1) == 0)  # causal

    layers, heads = weights.shape[:2]
    circle = circle_figure(data)
    sphere_fig = sphere_figure(sphere)
    maps = map_figure(weights, labels, "attention", "weight", 1.0)
    for layer in range(layers):
        for head in range(heads):
            k = layer * heads + head
            ax = circle.axes[k]
            np.testing.assert_array_equal(
                by_gid(ax, "tokens").get_offsets(), data["points"][layer, :, head].reshape(-1, 2)
            )
            np.testing.assert_array_equal(by_gid(ax, "center").get_offsets(), data["center"][layer, head])
            # a 3-D scatter keeps its data points in `_offsets3d` (matplotlib has no public getter)
            xs, ys, zs = by_gid(sphere_fig.axes[k], "tokens")._offsets3d
            np.testing.assert_array_equal(np.stack((xs, ys, zs), axis=-1), sphere[layer, :, head].reshape(-1, 3))
            np.testing.assert_array_equal(maps.axes[k].images[0].get_array(), weights[layer, head])
            assert maps.axes[k].get_title() == f"layer {layer} head {head}"


def test_pct_pictures_plot_the_gates_and_parameters(pct_run):
    paths = inspect_run(pct_run)
    check_pictures(paths, pct_run, ["pct_gates", "pct_row_sums", "pct_parameters"])

    model, input_ids, labels, outputs = sample_outputs(pct_run)
    data = pct_gate_maps(outputs)
    gates = torch.stack(outputs.attentions)[:, 0].double().numpy()
    np.testing.assert_array_equal(data["gates"], gates)
    np.testing.assert_allclose(data["row_sums"], gates.sum(-1), rtol=1e-12)
    causal = np.tril(np.ones(gates.shape[-2:], dtype=bool))
    assert np.all(gates[..., ~causal] == 0) and np.all(gates[..., causal] > 0) and gates.max() < 1
    assert np.abs(data["row_sums"] - 1).max() > 0.5  # non-competitive: rows are not normalised

    params = pct_parameters(model)
    assert params["tau_learned"]
    np.testing.assert_array_equal(params["tau"], [[2.0, 3.5], [3.0, 2.5]])
    np.testing.assert_array_equal(params["gate_bias"], [[-1.0, 0.0], [-2.0, 0.5]])

    maps = map_figure(data["gates"], labels, "gates", "gate", 1.0)
    sums = row_sum_figure(data["row_sums"])
    parameters = pct_parameter_figure(params)
    layers, heads = gates.shape[:2]
    for layer in range(layers):
        lines = {line.get_label(): line for line in sums.axes[layer].get_lines()}
        for head in range(heads):
            np.testing.assert_array_equal(maps.axes[layer * heads + head].images[0].get_array(), gates[layer, head])
            np.testing.assert_array_equal(lines[f"head {head}"].get_ydata(), data["row_sums"][layer, head])
    for ax, values in zip(parameters.axes[:2], (params["tau"], params["gate_bias"])):
        lines = {line.get_label(): line for line in ax.get_lines()}
        for head in range(heads):
            np.testing.assert_array_equal(lines[f"head {head}"].get_ydata(), values[:, head])


def test_pct_fixed_temperature_is_drawn_per_head(tmp_path):
    torch.manual_seed(0)
    config = tiny_config(PCTConfig, hidden_size=16, num_hidden_layers=1, tau="sqrt_d")
    model = PCTForCausalLM(config)
    params = pct_parameters(model)
    assert not params["tau_learned"]
    fixed = model.model.layers[0].self_attn.temperature()
    assert isinstance(fixed, float)
    np.testing.assert_array_equal(params["tau"], np.full((1, 2), fixed))


def test_remote_code_checkpoint_is_inspected_through_its_own_code(zpx_run, tmp_path):
    ids = torch.tensor([[1, 50, 60, 70, 80]])
    remote = run_remote_code(zpx_run, "AutoModelForCausalLM", {"input_ids": ids}, tmp_path)
    assert remote["class"] == "ZPXForCausalLM"  # the folder's code stands alone (no zpx_hf in that Python)

    model, _ = load_run(zpx_run, trust_remote_code=True)
    local, _ = load_run(zpx_run)
    assert type(model).__module__.startswith("transformers_modules")
    assert type(local).__module__ == "zpx_hf.modeling_zpx"
    with torch.no_grad():
        from_remote = model(input_ids=ids, output_phases=True, output_attentions=True)
        from_local = local(input_ids=ids, output_phases=True, output_attentions=True)
    np.testing.assert_array_equal(zpx_circle_points(from_remote)["points"], zpx_circle_points(from_local)["points"])
    np.testing.assert_array_equal(attention_maps(from_remote), attention_maps(from_local))

    paths = inspect_run(zpx_run, "remote code", trust_remote_code=True)
    assert [p.name for p in paths] == ["zpx_phase_circle.png", "zpx_phase_sphere.png", "zpx_attention.png"]


@pytest.mark.parametrize(
    "setup,message",
    [
        ("missing", "is not a folder"),
        ("empty", "has no config.json"),
        ("llama", "not a zpx-hf checkpoint"),
        ("no_weights", "could not be loaded"),
        ("not_utf8", "config.json is not a UTF-8 JSON object"),
        ("mismatch", "model.safetensors but [32, 96] by its config.json"),
    ],
)
def test_cli_bad_run_dir_exits_2_with_one_line(setup, message, tmp_path, capsys, zpx_run):
    folder = tmp_path / "run"
    if setup != "missing":
        folder.mkdir()
    if setup == "llama":
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if setup == "no_weights":
        (folder / "config.json").write_text((zpx_run / "config.json").read_text())
    if setup == "not_utf8":
        (folder / "config.json").write_bytes(b'{"model_type": "zpx\xff"}')
    if setup == "mismatch":  # weights of one width, a config.json of another
        shutil.copytree(zpx_run, folder, dirs_exist_ok=True)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    assert main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zpx-inspect: ") and message in err
    assert "Traceback" not in err


def test_cli_rejects_text_too_long_or_empty(zpx_run, capsys):
    assert main([str(zpx_run), "--text", "x" * 200]) == 2
    assert "pass a shorter --text" in capsys.readouterr().err
    assert main([str(zpx_run), "--text", ""]) == 2
    assert "text is empty" in capsys.readouterr().err


def test_cli_writes_the_pictures(zpx_run, capsys):
    assert main([str(zpx_run), "--text", "abc abc"]) == 0
    printed = capsys.readouterr().out.split()
    assert [p.rsplit("/", 1)[-1] for p in printed] == [
        "zpx_phase_circle.png",
        "zpx_phase_sphere.png",
        "zpx_attention.png",
    ]


def bivector(**coefficients):
    """Bivector coefficients [10] (order BIVECTOR_MASKS) from blade names like e12=1.1, e15=0.7."""
    out = torch.zeros(len(BIVECTOR_MASKS), dtype=torch.float64)
    for name, value in coefficients.items():
        mask = sum(1 << (int(digit) - 1) for digit in name[1:])
        out[BIVECTOR_MASKS.index(mask)] = value
    return out


def test_rotor_geometry_recovers_angles_and_rapidity_of_known_rotors():
    algebra = conformal_algebra()
    rotation = rotor_exp(bivector(e12=1.1, e34=-0.4))  # exp(-B/2): rotates e1e2 by 1.1, e3e4 by 0.4
    boost = rotor_exp(bivector(e15=0.7))  # boost of rapidity 0.7 along e1
    rotors = torch.stack(
        (
            rotation,
            algebra.geometric_product(boost, rotation),
            algebra.geometric_product(rotation, boost),  # the boost direction is rotated, its rapidity is not
            rotor_exp(bivector(e12=2.5, e35=-1.3)),  # commuting rotation and boost in disjoint planes
        )
    )
    geometry = rotor_geometry(rotors)
    expected_angles = torch.tensor([[1.1, 0.4], [1.1, 0.4], [1.1, 0.4], [2.5, 0.0]], dtype=torch.float64)
    expected_rapidity = torch.tensor([0.0, 0.7, 0.7, 1.3], dtype=torch.float64)
    angles = torch.stack((geometry["theta1"], geometry["theta2"]), dim=-1)
    # arccos / arccosh at 1 turn an eps-sized rounding into ~sqrt(eps): the zero cases get that tolerance
    torch.testing.assert_close(angles[:3], expected_angles[:3], rtol=0, atol=1e-12)
    torch.testing.assert_close(angles[3], expected_angles[3], rtol=0, atol=1e-7)
    torch.testing.assert_close(geometry["rapidity"][1:], expected_rapidity[1:], rtol=0, atol=1e-12)
    assert geometry["rapidity"][0] < 1e-7
    assert geometry["norm_error"].max() < 1e-13

    drifted = rotors[1] * 1.01  # off the group: R~R = 1.0201
    assert torch.isclose(rotor_geometry(drifted)["norm_error"], torch.tensor(0.0201, dtype=torch.float64))


def versor_run(folder, accumulate):
    torch.manual_seed(0)
    config = tiny_config(
        VersorConfig,
        hidden_size=64,
        mixer="hybrid",  # layer 0 RRA, layer 1 GPA
        rra_accumulate=accumulate,
        rra_bivector_scale=0.3,  # the full product's boosts stay within float32 over the sample
        initializer_range=0.2,
    )
    return save_run(VersorForCausalLM(config), folder)


def product_reference(bivectors, algebra):
    """R_t = exp(-B_0/2) ... exp(-B_t/2) by one geometric product per step, float64, [L, H, 32]."""
    steps = rotor_exp(bivectors.double())
    rotors, state = [], steps[0]
    for t in range(steps.shape[0]):
        state = steps[0] if t == 0 else algebra.geometric_product(state, steps[t])
        rotors.append(state)
    return torch.stack(rotors)


@pytest.mark.parametrize("accumulate", ["compact", "full"])
def test_versor_pictures_plot_the_rotors_and_score_parts(accumulate, tmp_path):
    run = versor_run(tmp_path / accumulate, accumulate)
    paths = inspect_run(run)
    check_pictures(paths, run, ["versor_rra_rotors", "versor_gpa_scores"])

    model, tokenizer = load_run(run)
    input_ids, labels = encode(tokenizer, SAMPLE_TEXT)
    inputs = versor_mixer_inputs(model, input_ids)
    algebra = conformal_algebra()
    f32 = torch.finfo(torch.float32).eps
    length = input_ids.shape[1]

    ((rra_layer, rra),) = rra_rotor_data(model, inputs)
    assert rra_layer == 0 and model.model.layers[0].mixer_type == "rra"
    with torch.no_grad():
        bivectors = model.model.layers[0].mixer.bivectors(inputs[0])[0].double()  # [L, H, 10]
    rotation = torch.zeros(len(BIVECTOR_MASKS), dtype=torch.bool)
    rotation[[i for i, mask in enumerate(BIVECTOR_MASKS) if not mask & 16]] = True
    boosts = bivectors * ~rotation
    if accumulate == "compact":  # docs/design.md §5.5: rotations accumulated, the boost applied per token
        expected_rotors = product_reference(bivectors * rotation, algebra)
        expected_applied = algebra.geometric_product(expected_rotors, rotor_exp(boosts))
    else:
        expected_rotors = expected_applied = product_reference(bivectors, algebra)
    scale = float(expected_rotors.abs().max())
    tolerance = {"rtol": 0, "atol": 8 * length * f32 * scale}  # float32 scan of `length` products
    torch.testing.assert_close(torch.from_numpy(rra["rotors"]), expected_rotors, **tolerance)
    torch.testing.assert_close(torch.from_numpy(rra["applied"]), expected_applied, **tolerance)
    geometry = rotor_geometry(torch.from_numpy(rra["applied"]))
    for name in ("theta1", "theta2", "rapidity", "norm_error"):
        np.testing.assert_array_equal(rra[name], geometry[name].numpy())
    if accumulate == "compact":
        # the applied boost exp(-A_t/2), A_t = a e5 with a in span(e1..e4), has rapidity |a|
        np.testing.assert_allclose(rra["rapidity"], boosts.norm(dim=-1).numpy(), rtol=0, atol=1e-5)
        assert rotor_geometry(torch.from_numpy(rra["rotors"]))["rapidity"].max() < 1e-3  # pure rotations

    ((gpa_layer, gpa),) = gpa_score_data(model, inputs)
    assert gpa_layer == 1
    mixer = model.model.layers[1].mixer
    with torch.no_grad():
        query, key, _ = mixer.project(inputs[1])
    q = query[0].double().unflatten(-1, (-1, 32))  # [H, L, c, 32]
    k = key[0].double().unflatten(-1, (-1, 32))
    products = algebra.geometric_product(q[:, :, None], algebra.reverse(k)[:, None, :]).sum(dim=3)  # [H, L, L, 32]
    expected_scalar = products[..., 0]
    expected_bivector = (products[..., list(BIVECTOR_MASKS)].pow(2).sum(-1) + model.config.gpa_eps).sqrt()
    terms = q.shape[-1] * q.shape[-2]
    bound = {"rtol": 0, "atol": terms**2 * f32 * float(q.abs().max() * k.abs().max())}  # float32 dot products
    torch.testing.assert_close(torch.from_numpy(gpa["scalar"]), expected_scalar, **bound)
    torch.testing.assert_close(torch.from_numpy(gpa["bivector"]), expected_bivector, **bound)
    np.testing.assert_array_equal(gpa["gamma"], mixer.gamma.detach().double().numpy())

    rotors_fig = rra_figure([(rra_layer, rra)], accumulate)
    lines = {line.get_label(): line for ax in rotors_fig.axes[:3] for line in ax.get_lines()}
    for head in range(rra["theta1"].shape[1]):
        np.testing.assert_array_equal(lines[f"head {head} theta1"].get_ydata(), rra["theta1"][:, head])
        np.testing.assert_array_equal(lines[f"head {head} theta2"].get_ydata(), rra["theta2"][:, head])
    for ax, name in zip(rotors_fig.axes[1:3], ("rapidity", "norm_error")):
        for head, line in enumerate(ax.get_lines()):
            np.testing.assert_array_equal(line.get_ydata(), rra[name][:, head])
    scores_fig = gpa_figure([(gpa_layer, gpa)], labels, causal=True)
    causal = np.tril(np.ones((length, length), dtype=bool))
    image_axes = [ax for ax in scores_fig.axes if ax.images]
    for head in range(gpa["scalar"].shape[0]):
        for ax, part in zip(image_axes[2 * head : 2 * head + 2], ("scalar", "bivector")):
            shown = ax.images[0].get_array()
            np.testing.assert_array_equal(shown.data[causal], gpa[part][head][causal])
            assert shown.mask[~causal].all() and not shown.mask[causal].any()


@pytest.fixture
def copied_run(zpx_run, tmp_path):
    import shutil

    return Path(shutil.copytree(zpx_run, tmp_path / "copy"))


def test_cli_truncated_weights_exit_2_with_one_line(copied_run, capsys):
    weights = copied_run / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert main([str(copied_run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zpx-inspect: ") and "could not be loaded" in err, err


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("bogus", "--device 'bogus' is not a torch device"),
        pytest.param(
            "cuda",
            "--device 'cuda': this machine has no such cuda device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
        ("cpu:7x", "is not a torch device"),
    ],
)
def test_cli_bad_device_exits_2_with_one_line(zpx_run, capsys, device, message):
    assert main([str(zpx_run), "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("reference", ["{folder}/outside.Outside", "someone/repo--modeling_zpx.ZPXForCausalLM"])
def test_remote_code_from_outside_the_checkpoint_is_refused(copied_run, tmp_path, capsys, reference):
    """transformers joins `module.Class` to the folder with os.path.join, so an absolute module path runs a file
    anywhere on the machine (and `repo--module.Class` fetches another repo's code); zpx-inspect refuses both."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    ran = tmp_path / "ran"
    (outside / "outside.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\nclass Outside: pass\n")
    config = json.loads((copied_run / "config.json").read_text())
    config["auto_map"]["AutoModelForCausalLM"] = reference.format(folder=outside)
    (copied_run / "config.json").write_text(json.dumps(config))
    assert main([str(copied_run), "--trust-remote-code"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not name a module in the checkpoint folder" in err, err
    assert not ran.exists()


def test_remote_code_whose_model_entry_is_not_a_model_class_is_refused(copied_run, capsys):
    """auto_map's AutoModelForCausalLM naming a class of the folder that is no transformers model (here the config)
    stops in one line instead of failing later on what that class returns."""
    config = json.loads((copied_run / "config.json").read_text())
    config["auto_map"]["AutoModelForCausalLM"] = "configuration_zpx.ZPXConfig"
    (copied_run / "config.json").write_text(json.dumps(config))
    assert main([str(copied_run), "--trust-remote-code"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ZPXConfig is not a transformers model class" in err, err
