"""ZPX attention: fidelity to the source design (docs/design.md §3.6), eager (materialised) vs sdpa, centre loss."""

import math

import pytest
import torch
from conftest import assert_close_eps
from seed_zpx_reference import SeedZPXAngleSphereAttention, seed_center_cancellation_loss

from zpx_hf import ZPXConfig, ZPXModel
from zpx_hf.modeling_zpx import ZPXAttention
from zpx_hf.ops_zpx import center_cancellation_loss, phase_tensor


def seed_configured_layer(dim, channels, lambda_angle, lambda_sphere, implementation):
    config = ZPXConfig(
        hidden_size=dim,
        num_attention_heads=1,
        head_dim=dim,
        phase_channels=channels,
        rotary="none",
        causal=False,
        attention_bias=True,
        phase_bias=True,
        lambda_angle=lambda_angle,
        lambda_sphere=lambda_sphere,
        attn_implementation=implementation,
    )
    return ZPXAttention(config, layer_idx=0).double()


def copy_seed_weights(layer, seed):
    """Seed q,k,v -> q_proj,k_proj,v_proj; phase_encoder.to_* keep their names; o_proj = identity."""
    with torch.no_grad():
        for ours, theirs in ((layer.q_proj, seed.q), (layer.k_proj, seed.k), (layer.v_proj, seed.v)):
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        for name in ("to_log_r", "to_theta", "to_b"):
            getattr(layer.phase_encoder, name).weight.copy_(getattr(seed.phase_encoder, name).weight)
            getattr(layer.phase_encoder, name).bias.copy_(getattr(seed.phase_encoder, name).bias)
        layer.o_proj.weight.copy_(torch.eye(layer.o_proj.weight.shape[0]))
        layer.o_proj.bias.zero_()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_seed_configuration_reproduces_seed_layer(implementation, with_mask):
    torch.manual_seed(0)
    batch, length, dim, channels = 2, 11, 24, 6
    seed = SeedZPXAngleSphereAttention(dim, dim, channels, lambda_angle=0.7, lambda_sphere=1.3).double()
    layer = seed_configured_layer(dim, channels, 0.7, 1.3, implementation)
    copy_seed_weights(layer, seed)
    h = torch.randn(batch, length, dim, dtype=torch.float64)
    valid = torch.ones(batch, length, dtype=torch.bool)
    valid[1, 7:] = False
    seed_mask = valid if with_mask else None
    expected, expected_attn, expected_phase = seed(h, mask=seed_mask)

    out, weights, phase = layer(h, padding_mask=valid if with_mask else None)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    if implementation == "eager":
        torch.testing.assert_close(weights[:, 0], expected_attn, rtol=1e-10, atol=1e-12)
    # Phi = [log_r, cos, sin, X, Y, Z, b] per channel (docs/design.md §3.5)
    torch.testing.assert_close(phase_tensor(phase)[:, :, 0], expected_phase["tensor"], rtol=1e-10, atol=1e-12)
    if not with_mask:
        torch.testing.assert_close(
            center_cancellation_loss(phase, None), seed_center_cancellation_loss(expected_phase), rtol=1e-10, atol=0
        )


def test_center_loss_ignores_padding_tokens():
    torch.manual_seed(1)
    layer = seed_configured_layer(16, 4, 1.0, 1.0, "sdpa")
    h = torch.randn(1, 9, 16, dtype=torch.float64)
    _, _, phase_full = layer(h[:, :6])
    _, _, phase_padded = layer(h)
    token_mask = torch.tensor([[1] * 6 + [0] * 3])
    torch.testing.assert_close(
        center_cancellation_loss(phase_padded, token_mask), center_cancellation_loss(phase_full, None)
    )


def small_config(**overrides):
    base = dict(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=3,
        phase_channels=5,
        lambda_angle=0.8,
        lambda_sphere=1.5,
        max_position_embeddings=64,
    )
    base.update(overrides)
    return ZPXConfig(**base)


def paired_models(**overrides):
    torch.manual_seed(0)
    eager = ZPXModel(small_config(attn_implementation="eager", **overrides)).double()
    sdpa = ZPXModel(small_config(attn_implementation="sdpa", **overrides)).double()
    sdpa.load_state_dict(eager.state_dict())
    return eager, sdpa


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("length", [1, 7, 33])
def test_eager_and_sdpa_agree_forward_and_gradients(causal, length):
    eager, sdpa = paired_models(causal=causal)
    torch.manual_seed(2)
    input_ids = torch.randint(3, 97, (3, length))
    attention_mask = torch.ones(3, length, dtype=torch.long)
    if length > 2:
        attention_mask[1, : length // 3] = 0  # left padding
        attention_mask[2, -(length // 4 or 1) :] = 0  # right padding
    outputs = []
    for model in (eager, sdpa):
        model.zero_grad()
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_phases=True)
        hidden = out.last_hidden_state * attention_mask[..., None]
        (hidden.pow(2).mean() + 1e-4 * out.center_loss).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        outputs.append((hidden.detach(), out.center_loss.detach(), grads))
    (h_e, c_e, g_e), (h_s, c_s, g_s) = outputs
    torch.testing.assert_close(h_s, h_e, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(c_s, c_e, rtol=1e-10, atol=1e-12)
    assert g_e.keys() == g_s.keys() and len(g_e) > 10
    for name in g_e:
        torch.testing.assert_close(g_s[name], g_e[name], rtol=1e-8, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


def test_sdpa_score_is_exactly_the_formula():
    """q^.k^ reproduces S_ij term by term (the identity behind the fast path)."""
    from zpx_hf.ops_zpx import phase_coordinates, phase_key_features
    from zpx_hf.ops_zpx_base import augment_query

    torch.manual_seed(3)
    b, h, l, d, c = 1, 2, 5, 8, 3
    q, k = torch.randn(b, h, l, d, dtype=torch.float64), torch.randn(b, h, l, d, dtype=torch.float64)
    state = phase_coordinates(*(torch.randn(b, h, l, c, dtype=torch.float64) for _ in range(3)), 4.0)
    feats = phase_key_features(state)
    la, ls = 0.6, 1.7
    fast = augment_query(q, feats, d**-0.5, la, ls) @ torch.cat((k, feats), -1).transpose(-1, -2)
    phi, s = state.phi, state.sphere
    direct = torch.zeros(b, h, l, l, dtype=torch.float64)
    for hh in range(h):
        for i in range(l):
            for j in range(l):
                content = float(q[0, hh, i] @ k[0, hh, j]) / math.sqrt(d)
                angle = sum(math.cos(float(phi[0, hh, i, m] - phi[0, hh, j, m])) for m in range(c)) / c
                sphere = sum(float(s[0, hh, i, m] @ s[0, hh, j, m]) for m in range(c)) / c
                direct[0, hh, i, j] = content + la * angle + ls * sphere
    torch.testing.assert_close(fast, direct, rtol=0, atol=1e-12)


@pytest.mark.parametrize("padded", [False, True])
def test_single_query_branch_equals_reference(padded):
    """One query (cached decoding) takes two bmm calls with v at its own head dim: the reference's numbers."""
    from zpx_hf.ops_zpx import phase_coordinates, phase_key_features, resolve_kernel, zpx_attention

    torch.manual_seed(4)
    b, h, k_len, d, dv, c = 2, 3, 9, 8, 6, 4
    query, key = torch.randn(b, h, 1, d, dtype=torch.float64), torch.randn(b, h, k_len, d, dtype=torch.float64)
    value = torch.randn(b, h, k_len, dv, dtype=torch.float64)
    features = phase_key_features(
        phase_coordinates(*(torch.randn(b, h, k_len, c, dtype=torch.float64) for _ in "rtb"), 4.0)
    )
    padding = torch.ones(b, k_len, dtype=torch.bool)
    if padded:
        padding[0, :3] = False
    kwargs = dict(causal=True, scaling=d**-0.5, lambda_angle=0.6, lambda_sphere=1.7)
    args = (query, torch.cat((key, features), -1), value, features[:, :, -1:])
    kwargs["key_padding_mask"] = padding if padded else None
    assert resolve_kernel("auto", query) == "decode"
    fast, _ = zpx_attention(*args, **kwargs)
    reference, _ = zpx_attention(*args, **kwargs, kernel="naive")
    assert fast.shape == (b, 1, h, dv)
    torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-12)


def test_hooked_phase_encoder_runs_its_modules_with_the_same_numbers():
    """The fused phase matmul is only for plain `nn.Linear` encoders; a hooked (or wrapped) encoder runs as
    itself, and both give the same phase."""
    torch.manual_seed(5)
    layer = seed_configured_layer(16, 4, 1.0, 1.0, "sdpa")
    h = torch.randn(2, 5, 16, dtype=torch.float64)
    fused = layer.phase_encoder(h)
    calls = []
    handle = layer.phase_encoder.to_theta.register_forward_hook(lambda *args: calls.append(1))
    separate = layer.phase_encoder(h)
    handle.remove()
    assert calls == [1]
    for name in ("log_r", "phi", "b", "cos_phi", "sin_phi", "sphere"):
        assert_close_eps(getattr(separate, name), getattr(fused, name), ulps=64)
