"""torchao quantisation of every family, every projection layer.

ZPX and PCT project with `nn.Linear`s (PCT's complex maps are two real `nn.Linear`s each), so torchao's own
entry points quantise them as they are: `quantize_(model, Int8WeightOnlyConfig())` and
`from_pretrained(..., quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))` (which, like Llama's,
leaves the tied `lm_head` in float). The fused fast paths step aside for weights that are not plain tensors
(`modeling_blocks.plain_tensor`), so a quantised layer always runs through its own `F.linear`.

Versor's channel mixers are `VersorLinear`s: one weight per grade, `[6, out, in]`, not `nn.Linear`s. torchao's
default filter and transformers' torchao loader only pick `nn.Linear`; name them explicitly:

    quantize_(model, Int8WeightOnlyConfig(), filter_fn=is_projection)
    from_pretrained(path, quantization_config=TorchAoConfig(projection_config(Int8WeightOnlyConfig())))

A quantised `VersorLinear` runs one `F.linear` per grade on `weight[g]` (per-(grade, output) row scales).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .modeling_versor import VersorLinear

# The weight of every projection of a Versor model: the VersorLinears of mixers and MLP and RRA's nn.Linear
# `bivector_proj` (the tied lm_head stays in float, as transformers leaves Llama's). Weights, not modules: a
# module pattern would also send a biased layer's bias to the quantiser.
VERSOR_PROJECTION_PATTERN = r"re:.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|bivector_proj)\.weight"


def is_projection(module: nn.Module, fqn: str = "") -> bool:
    """`quantize_` filter: every `nn.Linear` (torchao's default) and every `VersorLinear`."""
    return isinstance(module, (nn.Linear, VersorLinear))


def projection_config(config: Any) -> Any:
    """A torchao `FqnToConfig` applying `config` (e.g. `Int8WeightOnlyConfig()`) to every projection weight of a
    Versor model, for `TorchAoConfig(projection_config(config))` (a plain config reaches `nn.Linear`s only)."""
    from torchao.quantization import FqnToConfig

    return FqnToConfig({VERSOR_PROJECTION_PATTERN: config})


__all__ = ["VERSOR_PROJECTION_PATTERN", "is_projection", "projection_config"]
