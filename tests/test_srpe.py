"""SRPE (docs/design.md §2) against an independent float64 transcription and against transformers' Llama RoPE."""

import math

import numpy as np
import pytest
import torch
from conftest import assert_close_eps
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from zpx_hf import ZPXConfig
from zpx_hf.rotary_srpe import SpiralRotaryEmbedding, apply_rotary, build_rotary


def seed_srpe_tables(positions, head_dim, theta0, k_s, a_s, f_s):
    """The formula of docs/design.md §2.1 in float64 numpy, element by element."""
    cos = np.zeros((len(positions), head_dim))
    sin = np.zeros((len(positions), head_dim))
    for row, p in enumerate(positions):
        for j in range(head_dim // 2):
            omega = theta0 ** (-2.0 * j / head_dim)
            winding = p * omega * (1.0 + (1.0 / k_s if k_s else 0.0))
            radius = 1.0 + a_s * math.sin(p * f_s * omega)
            for col in (j, j + head_dim // 2):  # halves duplicated for rotate_half
                cos[row, col] = radius * math.cos(winding)
                sin[row, col] = radius * math.sin(winding)
    return cos, sin


@pytest.mark.parametrize("head_dim,theta0,k_s,a_s,f_s", [(16, 10000.0, 8.0, 0.1, 0.01), (32, 500.0, 3.0, 0.3, 0.2)])
def test_srpe_matches_seed_formula(head_dim, theta0, k_s, a_s, f_s):
    positions = [0, 1, 2, 7, 100, 511, 2047]
    srpe = SpiralRotaryEmbedding(head_dim, "srpe", theta0, k_s, a_s, f_s)
    cos, sin = srpe(torch.zeros(1, dtype=torch.float32), torch.tensor([positions]))
    ref_cos, ref_sin = seed_srpe_tables(positions, head_dim, theta0, k_s, a_s, f_s)
    # float32 tables of angles up to ~2300 rad: absolute error ~ ulp(angle)
    np.testing.assert_allclose(cos[0].double().numpy(), ref_cos, atol=5e-4)
    np.testing.assert_allclose(sin[0].double().numpy(), ref_sin, atol=5e-4)
    np.testing.assert_allclose(cos[0, :4].double().numpy(), ref_cos[:4], atol=2e-6)

    # the rotation itself: q' = q cos + rotate_half(q) sin, pair j mixes features j and j + d/2
    q = torch.randn(1, 1, len(positions), head_dim, dtype=torch.float64)
    rotated = apply_rotary(q, cos.double(), sin.double())
    half = head_dim // 2
    lo, hi = q[0, 0, :, :half].numpy(), q[0, 0, :, half:].numpy()
    c, s = ref_cos[:, :half], ref_sin[:, :half]
    expected = np.concatenate([lo * c - hi * s, hi * c + lo * s], axis=-1)
    np.testing.assert_allclose(rotated[0, 0].numpy(), expected, atol=5e-3)


@pytest.mark.parametrize("rotary,k_s,a_s", [("srpe", None, 0.0), ("rope", 8.0, 0.1)])
def test_plain_limit_equals_llama_rotary(rotary, k_s, a_s):
    head_dim, theta0 = 32, 10000.0
    llama = LlamaRotaryEmbedding(
        LlamaConfig(
            hidden_size=128,
            num_attention_heads=4,
            head_dim=head_dim,
            rope_parameters={"rope_type": "default", "rope_theta": theta0},
        )
    )
    srpe = SpiralRotaryEmbedding(head_dim, rotary, theta0, k_s=k_s, a_s=a_s, f_s=0.01)
    position_ids = torch.tensor([[0, 1, 5, 17, 300, 4095], [3, 3, 9, 10, 11, 12]])
    x = torch.zeros(1, dtype=torch.float32)
    ours, theirs = srpe(x, position_ids), llama(x, position_ids)
    torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours[1], theirs[1], rtol=0, atol=1e-6)


def test_tables_follow_position_ids_at_any_length():
    srpe = SpiralRotaryEmbedding(8, "srpe")
    x = torch.zeros(1)
    short = srpe(x, torch.tensor([[0, 1, 2, 3]]))
    long = srpe(x, torch.tensor([[1000, 2, 3]]))  # far beyond any training length: nothing to extend
    assert_close_eps(long[0][:, 1:], short[0][:, 2:], ulps=4)
    single = srpe(x, torch.tensor([[1000]]))
    assert_close_eps(long[0][:, :1], single[0], ulps=4)
    # SRPE really differs from RoPE at the defaults
    rope = SpiralRotaryEmbedding(8, "rope")(x, torch.tensor([[5]]))
    assert not torch.allclose(rope[0], srpe(x, torch.tensor([[5]]))[0])


def test_rotary_none_and_odd_head_dim_errors():
    assert build_rotary(ZPXConfig(rotary="none", hidden_size=30, num_attention_heads=2)) is None
    with pytest.raises(ValueError, match="head_dim"):
        ZPXConfig(rotary="srpe", hidden_size=30, num_attention_heads=2)
    with pytest.raises(ValueError, match="head_dim"):
        SpiralRotaryEmbedding(15)
