"""PCT attention: the design conditions C1-C4 and a float64 complex transcription of the formula."""

import math

import pytest
import torch

from zpx_hf import PCTConfig, PCTModel
from zpx_hf.ops_pct import pct_attention, pct_attention_weights


def tiny_config(**overrides):
    base = dict(
        vocab_size=50,
        hidden_size=32,  # real widths: 16 complex features
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
        rotary="srpe",
        srpe_a=0.3,
        srpe_f=0.2,  # visible radial modulation
    )
    base.update(overrides)
    return PCTConfig(**base)


def randomise(model, seed=0):
    """Non-trivial values for every parameter (including biases, gains, tau, b_h)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("gate_bias"):
                param.copy_(-1.0 - torch.rand(param.shape, generator=generator))
            elif name.endswith("tau"):
                param.copy_(1.0 + 3 * torch.rand(param.shape, generator=generator))
            else:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return model


def rotate(z, angle):
    """z e^{i angle} for every complex feature of `z` laid out [re | im] on the last dimension."""
    re, im = z.chunk(2, dim=-1)
    cos, sin = math.cos(angle), math.sin(angle)
    return torch.cat((re * cos - im * sin, im * cos + re * sin), dim=-1)


def to_complex(x):
    half = x.shape[-1] // 2
    return torch.complex(x[..., :half].double(), x[..., half:].double())


def complex_weight(linear):
    """ComplexLinear -> (W = A + iB, c = (a - b) + i(a + b)) in complex128."""
    weight = torch.complex(linear.real.weight.double(), linear.imag.weight.double())
    if linear.real.bias is None:
        return weight, torch.zeros(weight.shape[0], dtype=torch.complex128)
    a, b = linear.real.bias.double(), linear.imag.bias.double()
    return weight, torch.complex(a - b, a + b)


def srpe_factor(positions, config):
    """r_j(p) e^{i Theta_j(p)} from docs/design.md §2.1 in float64, one pair per complex feature (real head dim 2d)."""
    d = config.complex_head_dim
    omega = config.rope_theta ** (-2.0 * torch.arange(d, dtype=torch.float64) / (2 * d))
    base = positions.double()[..., None] * omega
    theta = base * (1.0 + 1.0 / config.srpe_k)
    radius = 1.0 + config.srpe_a * torch.sin(base * config.srpe_f)
    return radius * torch.exp(1j * theta)


def attention_formula(attention, hidden, attention_mask, config):
    """docs/design.md §4.1 transcribed with complex128 tensors."""
    batch, length = hidden.shape[:2]
    heads, d = config.num_attention_heads, config.complex_head_dim
    z = to_complex(hidden)

    def project(linear):
        weight, bias = complex_weight(linear)
        return (z @ weight.T + bias).view(batch, length, heads, d).transpose(1, 2)

    q, k, v = project(attention.q_proj), project(attention.k_proj), project(attention.v_proj)
    q = q / torch.sqrt((q.abs() ** 2).sum(-1, keepdim=True) + config.qk_norm_eps)
    k = k / torch.sqrt((k.abs() ** 2).sum(-1, keepdim=True) + config.qk_norm_eps)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    rotation = srpe_factor(positions, config)[:, None]  # [B, 1, L, d]
    q, k = q * rotation, k * rotation
    if config.tau == "log_learnable":
        tau = attention.log_tau.double().exp()  # tau_h = exp(log_tau_h)
    elif config.tau == "learnable":
        tau = attention.tau.double()
    else:
        tau = torch.full((heads,), math.sqrt(d)).double()
    scores = tau[:, None, None] * torch.einsum("bhim,bhjm->bhij", q, k.conj()).real
    gates = torch.sigmoid(scores + attention.gate_bias.double()[:, None, None])
    visible = torch.tril(torch.ones(length, length, dtype=torch.bool))[None, None]
    visible = visible & attention_mask.bool()[:, None, None, :]
    gates = gates * visible
    out = torch.einsum("bhij,bhjm->bhim", gates.to(torch.complex128), v)  # real gate x complex value
    weight, bias = complex_weight(attention.o_proj)
    out = out.transpose(1, 2).reshape(batch, length, heads * d) @ weight.T + bias
    return torch.cat((out.real, out.imag), dim=-1), gates


def capture_attention(model, input_ids, attention_mask, **kwargs):
    """(attention input, attention output, gates) of layer 0 through forward hooks."""
    store = {}
    attention = model.layers[0].self_attn

    def hook(module, args, output):
        store["input"] = args[0].detach()
        store["output"] = output[0].detach()

    handle = attention.register_forward_hook(hook)
    try:
        outputs = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True, **kwargs)
    finally:
        handle.remove()
    return store["input"], store["output"], outputs.attentions[0]


@pytest.mark.parametrize("tau", ["sqrt_d", "learnable", "log_learnable"])
@pytest.mark.parametrize("attention_bias", [False, True])
def test_attention_equals_complex_float64_formula(tau, attention_bias):
    torch.manual_seed(0)
    config = tiny_config(tau=tau, attention_bias=attention_bias)
    model = randomise(PCTModel(config).eval())
    ids = torch.randint(3, 50, (2, 11))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    mask[1, 9:] = 0  # right padding
    with torch.no_grad():
        hidden, output, gates = capture_attention(model, ids, mask)
    expected, expected_gates = attention_formula(model.layers[0].self_attn, hidden, mask, config)
    assert (output.double() - expected).abs().max() < 1e-5
    assert (gates.double() - expected_gates).abs().max() < 1e-5


def test_c1_non_competitive_a_gate_ignores_other_keys():
    torch.manual_seed(0)
    model = randomise(PCTModel(tiny_config(causal=False)).eval())
    ids = torch.randint(3, 50, (1, 9))
    with torch.no_grad():
        gates = model(input_ids=ids, output_attentions=True).attentions[0]
        # appending a key (and query) at the end leaves every existing pair's gate unchanged
        longer = model(input_ids=torch.cat([ids, ids[:, :1]], -1), output_attentions=True).attentions[0]
        # changing token 4 changes only row 4 and column 4
        changed = ids.clone()
        changed[0, 4] = (ids[0, 4] + 7) % 47 + 3
        edited = model(input_ids=changed, output_attentions=True).attentions[0]
    torch.testing.assert_close(longer[..., :9, :9], gates, rtol=0, atol=1e-6)
    keep = torch.ones(9, dtype=torch.bool)
    keep[4] = False
    torch.testing.assert_close(edited[..., keep, :][..., keep], gates[..., keep, :][..., keep], rtol=0, atol=1e-6)
    assert not torch.allclose(edited[..., 4], gates[..., 4])
    # contrast: softmax over the same scores is competitive (the other weights in row 0 move)
    softmax = torch.softmax(torch.logit(gates.double()), -1)
    softmax_edited = torch.softmax(torch.logit(edited.double()), -1)
    assert not torch.allclose(softmax_edited[..., 0, keep], softmax[..., 0, keep], atol=1e-4)


def test_c2_one_real_weight_per_pair_for_all_value_elements():
    generator = torch.Generator().manual_seed(0)
    heads, length, dim = 2, 7, 16  # dim >= length: value j can be the basis vector e_j
    q = torch.nn.functional.normalize(torch.randn(1, heads, length, dim, generator=generator), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, heads, length, dim, generator=generator), dim=-1)
    tau, bias = torch.tensor([3.0, 5.0]), torch.tensor([-1.0, -2.0])
    basis = torch.eye(dim)[:length].expand(1, heads, length, dim)
    probe = pct_attention(q, k, basis, tau, bias)  # out_i = sum_j a_ij e_j -> row i of A
    gates = probe[..., :length]
    torch.testing.assert_close(gates, pct_attention_weights(q, k, tau, bias), rtol=0, atol=1e-6)
    values = torch.randn(1, heads, length, dim, generator=generator)
    # every element (real and imaginary parts alike) is mixed by the same real matrix A
    torch.testing.assert_close(pct_attention(q, k, values, tau, bias), gates @ values, rtol=0, atol=1e-5)


def test_c3_gate_gradient_finite_and_lipschitz():
    generator = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(1, 1, 6, 8, generator=generator, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, 1, 6, 8, generator=generator, dtype=torch.float64), dim=-1)
    v = torch.randn(1, 1, 6, 8, generator=generator, dtype=torch.float64)
    tau = torch.tensor([4.0], dtype=torch.float64)

    def grad_at(bias_value):
        bias = torch.tensor([bias_value], dtype=torch.float64, requires_grad=True)
        out = pct_attention(q, k, v, tau, bias)
        return torch.autograd.grad(out.sum(), bias)[0].item()

    biases = torch.linspace(-60.0, 60.0, 601).tolist()  # step 0.2
    grads = torch.tensor([grad_at(b) for b in biases])
    assert torch.isfinite(grads).all()
    # |sigma''| <= 1/(6 sqrt 3): d(grad)/db is bounded by that times sum_ij |sum_m v_jm|
    bound = (1 / (6 * math.sqrt(3))) * torch.tril(v.sum(-1).abs().reshape(1, 6).expand(6, 6)).sum().item()
    slopes = (grads[1:] - grads[:-1]).abs() / 0.2
    assert slopes.max() <= bound * (1 + 1e-6)

    # the model's gradient stays finite where q = k = 0 (the eps-safe complex L2 norm)
    model = PCTModel(tiny_config(rotary="none")).eval()
    with torch.no_grad():
        for proj in ("q_proj", "k_proj"):
            getattr(model.layers[0].self_attn, proj).real.weight.zero_()
            getattr(model.layers[0].self_attn, proj).imag.weight.zero_()
    embeds = torch.randn(1, 5, 32, requires_grad=True)
    model(inputs_embeds=embeds).last_hidden_state.sum().backward()
    assert torch.isfinite(embeds.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_c4_value_rotation_rotates_the_output_and_global_qk_phase_is_invisible():
    generator = torch.Generator().manual_seed(0)
    heads, length, d = 2, 9, 8  # complex head dim d -> real 2d
    q = torch.nn.functional.normalize(torch.randn(2, heads, length, 2 * d, generator=generator), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(2, heads, length, 2 * d, generator=generator), dim=-1)
    v = torch.randn(2, heads, length, 2 * d, generator=generator)
    tau, bias = torch.tensor([3.0, 2.0]), torch.tensor([-1.5, -0.5])
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, :2] = False
    out = pct_attention(q, k, v, tau, bias, key_padding_mask=mask)
    for angle in (0.3, 2.0, -1.1):
        rotated = pct_attention(q, k, rotate(v, angle), tau, bias, key_padding_mask=mask)
        torch.testing.assert_close(rotated, rotate(out, angle), rtol=0, atol=1e-5)
        gates = pct_attention_weights(q, k, tau, bias, key_padding_mask=mask)
        spun = pct_attention_weights(rotate(q, angle), rotate(k, angle), tau, bias, key_padding_mask=mask)
        torch.testing.assert_close(spun, gates, rtol=0, atol=1e-6)


def rotate_linear(linear, angle):
    """W -> e^{i angle} W, c -> e^{i angle} c (rotates every output of a ComplexLinear)."""
    c, s = math.cos(angle), math.sin(angle)
    with torch.no_grad():
        a, b = linear.real.weight.clone(), linear.imag.weight.clone()
        linear.real.weight.copy_(a * c - b * s)
        linear.imag.weight.copy_(a * s + b * c)


def test_c4_in_the_model_layer():
    torch.manual_seed(0)
    model = randomise(PCTModel(tiny_config()).eval())
    attention = model.layers[0].self_attn
    ids = torch.randint(3, 50, (2, 10))
    captured = []
    handle = attention.o_proj.register_forward_pre_hook(lambda module, args: captured.append(args[0].detach()))
    with torch.no_grad():
        gates = model(input_ids=ids, output_attentions=True).attentions[0]
        rotate_linear(attention.v_proj, 0.7)
        model(input_ids=ids)
        rotate_linear(attention.q_proj, -1.3)
        rotate_linear(attention.k_proj, -1.3)
        spun = model(input_ids=ids, output_attentions=True).attentions[0]
    handle.remove()
    expected = to_complex(captured[0]) * complex(math.cos(0.7), math.sin(0.7))
    assert (to_complex(captured[1]) - expected).abs().max() < 1e-5
    torch.testing.assert_close(spun, gates, rtol=0, atol=1e-6)
