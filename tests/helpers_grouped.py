"""Grouped-query models and their repeated twins: the same model with each key-value head's keys and values (and
ZPX's phase) copied to every query head of its group, built by copying projection rows. A grouped model must
compute exactly what its twin computes."""

import torch
from conftest import make_tiny_config
from transformers import AutoModelForCausalLM

# per family: the output rows of each grouped projection, as (module suffix, rows per head)
GROUPED_ROWS = {
    "zpx": lambda config: {
        "k_proj": config.head_dim,
        "v_proj": config.head_dim,
        "to_log_r": config.phase_channels,
        "to_theta": config.phase_channels,
        "to_b": config.phase_channels,
    },
    # complex projections: `.real` and `.imag` sub-linears, d = complex_head_dim rows per head each
    "pct": lambda config: {"k_proj": config.complex_head_dim, "v_proj": config.complex_head_dim},
    # VersorLinear weights [grades, out, in]: the output channels are dim 1 (head_channels per head)
    "versor": lambda config: {"k_proj": config.head_channels, "v_proj": config.head_channels},
}
OUTPUT_DIM = {"versor": 1}


def grouped_and_repeated(case: str, num_key_value_heads: int, **overrides):
    """(grouped model, repeated twin), float64, eval mode, same weights."""
    torch.manual_seed(0)
    config = make_tiny_config(case, num_key_value_heads=num_key_value_heads, **overrides)
    grouped = AutoModelForCausalLM.from_config(config).double().eval()
    full = AutoModelForCausalLM.from_config(make_tiny_config(case, **overrides)).double().eval()
    group = config.num_attention_heads // num_key_value_heads
    rows = GROUPED_ROWS[case.split("-")[0]](config)
    source = grouped.state_dict()
    with torch.no_grad():
        for name, parameter in full.state_dict().items():
            tensor = source[name]
            module = next((part for part in name.split(".") if part in rows), None)
            if module is not None and tensor.shape != parameter.shape:  # [Hkv * r, ...] -> [H * r, ...]
                dim = OUTPUT_DIM.get(case.split("-")[0], 0)
                tensor = tensor.unflatten(dim, (num_key_value_heads, rows[module]))
                tensor = tensor.repeat_interleave(group, dim=dim).flatten(dim, dim + 1)
            parameter.copy_(tensor)
    return grouped, full


def repeat_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """[B, Hkv, ...] -> [B, Hkv * group, ...]: key-value head kv copied to query heads kv * group .. + group - 1."""
    return x.repeat_interleave(group, dim=1)
