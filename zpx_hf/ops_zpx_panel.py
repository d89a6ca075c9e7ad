"""ZPX angle-sphere attention as fused scaled-dot-product attention in query panels (kernel `panel`, any device).
Same function as `ops_zpx_naive.zpx_attention_naive`.

cos(a - b) = cos a cos b + sin a sin b, so with q^ = [q/sqrt(d), (la/C) cos phi, (la/C) sin phi, (ls/C) s]
and k^ = [k, cos phi, sin phi, s] the score is S = q^ . k^: ordinary SDPA (scale 1) on head dim d + 5C
with O(L) memory. Without padding or documents that is one SDPA call (`is_causal`); with them, query
panels (at most `PANEL_ROWS` rows and `MASK_ELEMENTS` mask entries), each against only the keys it can see
(`query_panels`: causality, documents), recomputed in the backward when the masks kept for it would exceed
`KEPT_MASK_ELEMENTS` in all: never an L x L mask. Grouped keys and values (Hkv < H) go to SDPA's grouped mode
(`enable_gqa`: query head h reads key-value head h // group), never repeated here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .ops_common import query_panels, visible_block
from .ops_zpx_base import augment_query

MASK_ELEMENTS = 1 << 20  # batch x query rows x keys of one panel's mask (and its scores); read at call time
PANEL_ROWS = 256  # at most this many query rows per panel (narrow panels skip more of other documents' keys)
KEPT_MASK_ELEMENTS = 1 << 24  # past this many mask entries kept for the backward in all, panels are recomputed


def _panel(query, key, value, key_padding_mask, document_ids, block, sizes, causal, dropout) -> torch.Tensor:
    """SDPA of query rows [r0, r1) against keys [k0, k1) (the slices given) under the block's mask; rows with no
    visible key give 0."""
    (r0, r1, k0, k1), (l_q, l_k) = block, sizes
    mask = visible_block((r0, r1), (k0, k1), l_q, l_k, causal, key_padding_mask, document_ids, query.device)
    seen = None
    if mask is not None and key_padding_mask is not None:  # open empty rows for softmax, zero them after
        seen = mask.any(dim=-1, keepdim=True)
        mask = mask | ~seen
    gqa = query.shape[1] != key.shape[1]
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=1.0, enable_gqa=gqa
    )
    return output if seen is None else output * seen


def _slices(query_aug, key_aug, value, block) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The query rows and keys / values one panel reads."""
    r0, r1, k0, k1 = block
    return query_aug[:, :, r0:r1], key_aug[:, :, k0:k1], value[:, :, k0:k1]


def _panels_into_one(query_aug, key_aug, value, key_padding_mask, document_ids, blocks, sizes, causal, dropout):
    """Every panel written into one output tensor as it is computed (no autograd state): a panel's temporaries
    (its mask, SDPA's buffers) are freed before the next one's are made. Panels kept as separate tensors until a
    final `torch.cat` would sit between those temporaries, whose sizes grow panel by panel (causal), and fragment
    the heap: RSS then grew with L^2 (2.4 GiB at L = 64K for one padded key, issue 38)."""
    output = query_aug.new_empty(*query_aug.shape[:3], value.shape[-1])
    for block in blocks:
        pieces = _slices(query_aug, key_aug, value, block)
        output[:, :, block[0] : block[1]] = _panel(
            *pieces, key_padding_mask, document_ids, block, sizes, causal, dropout
        )
    return output


class _RecomputedPanels(torch.autograd.Function):
    """The panels of `zpx_attention_panel` with nothing kept between passes but q^, k^, v: the forward writes each
    panel's output into one tensor without autograd state, the backward recomputes one panel at a time and adds
    its gradients into three preallocated buffers (no per-panel full-size gradient, one mask alive at a time)."""

    @staticmethod
    def forward(ctx, query_aug, key_aug, value, key_padding_mask, document_ids, blocks, sizes, causal):
        ctx.save_for_backward(query_aug, key_aug, value, key_padding_mask, document_ids)
        ctx.blocks, ctx.sizes, ctx.causal = blocks, sizes, causal
        return _panels_into_one(query_aug, key_aug, value, key_padding_mask, document_ids, blocks, sizes, causal, 0.0)

    @staticmethod
    def backward(ctx, grad_output):
        query_aug, key_aug, value, key_padding_mask, document_ids = ctx.saved_tensors
        grads = [torch.zeros_like(query_aug), torch.zeros_like(key_aug), torch.zeros_like(value)]
        for block in ctx.blocks:
            r0, r1, k0, k1 = block
            with torch.enable_grad():
                # the slices as leaves: their gradients only, no full-size temporaries per panel
                q, k, v = (t.detach().requires_grad_() for t in _slices(query_aug, key_aug, value, block))
                pieces = (q, k, v)
                output = _panel(q, k, v, key_padding_mask, document_ids, block, ctx.sizes, ctx.causal, 0.0)
                parts = torch.autograd.grad(output, pieces, grad_output[:, :, r0:r1])
            for grad, part, (a, b) in zip(grads, parts, ((r0, r1), (k0, k1), (k0, k1))):
                grad[:, :, a:b] += part
        return (*grads, None, None, None, None, None)


def zpx_attention_panel(
    query: torch.Tensor,
    key_aug: torch.Tensor,
    value: torch.Tensor,
    query_features: torch.Tensor,
    *,
    causal: bool,
    scaling: float,
    lambda_angle: float,
    lambda_sphere: float,
    dropout: float,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, None]:
    """`ops_zpx_base.ZPXKernel`; returns (output [B, Lq, H, dv] (a transposed view), None)."""
    batch, _, l_q, _ = query.shape
    l_k = key_aug.shape[2]
    query_aug = augment_query(query, query_features, scaling, lambda_angle, lambda_sphere)
    value_dim = value.shape[-1]
    if value_dim != query_aug.shape[-1]:
        # Fused SDPA kernels (flash on CPU and GPU) need one head dim for q, k and v: pad v with zeros
        # and drop the padding from the output.
        value = F.pad(value, (0, query_aug.shape[-1] - value_dim))
    if key_padding_mask is None and document_ids is None and (not causal or l_q == l_k):
        output = F.scaled_dot_product_attention(
            # a Python bool: under torch.export `l_q > 1` is a SymBool, which SDPA refuses (dynamic dims are >= 2)
            query_aug,
            key_aug,
            value,
            dropout_p=dropout,
            is_causal=bool(causal and l_q > 1),
            scale=1.0,
            enable_gqa=query_aug.shape[1] != key_aug.shape[1],
        )
        return output[..., :value_dim].transpose(1, 2), None
    rows = max(16, min(PANEL_ROWS, MASK_ELEMENTS // max(1, batch * l_k)))
    blocks = query_panels(l_q, l_k, causal, rows, document_ids)
    # With gradients, SDPA keeps each panel's mask for its backward: past KEPT_MASK_ELEMENTS in all, every panel
    # is recomputed in the backward instead (one panel's mask alive at a time).
    kept = batch * sum((r1 - r0) * (k1 - k0) for r0, r1, k0, k1 in blocks)
    recompute = kept > KEPT_MASK_ELEMENTS and torch.is_grad_enabled() and not torch.compiler.is_compiling()
    args = (query_aug, key_aug, value, key_padding_mask, document_ids)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in args[:3])):  # inference: no autograd state
        output = _panels_into_one(*args, blocks, (l_q, l_k), causal, dropout)
    elif recompute and dropout == 0.0:
        output = _RecomputedPanels.apply(*args, blocks, (l_q, l_k), causal)
    else:  # dropout: torch's checkpoint replays the random state
        panels = []
        for block in blocks:
            panel_args = (*_slices(*args[:3], block), *args[3:], block, (l_q, l_k), causal, dropout)
            panels.append(checkpoint(_panel, *panel_args, use_reentrant=False) if recompute else _panel(*panel_args))
        output = panels[0] if len(panels) == 1 else torch.cat(panels, dim=2)
    return output[..., :value_dim].transpose(1, 2), None


__all__ = [
    "KEPT_MASK_ELEMENTS",
    "MASK_ELEMENTS",
    "PANEL_ROWS",
    "zpx_attention_panel",
]
