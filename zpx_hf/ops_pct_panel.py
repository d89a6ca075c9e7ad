"""PCT sigmoid attention in memory-lean PyTorch (kernel `panel`): query panels, recomputing backward.
Same function as `ops_pct_naive.pct_attention_naive`.

Queries are processed in panels of `PANEL_ROWS` rows against only the keys a panel can see
(`ops_common.query_panels`: causal, the prefix up to its last row; packed rows, nothing before the
first row's document), so no pass holds more than B x H x PANEL_ROWS x Lk gates; the backward
recomputes each panel's gates instead of storing them. Without gradients (generation) the forward
runs without autograd state. Per panel, with q' = tau q (tau folded into the query):

    forward    s = b + q' K^T  (bias as the GEMM's initial value),  a = sigmoid(s) masked,  out = a V
    backward   dP = dO V^T,  ds = dP a (1 - a),  dv += a^T dO,  dk += ds^T q',  g = ds K,
               dq = tau g,  dtau = sum q . g  (= sum ds q.k, from the dq product: no extra L x L pass),
               db = sum ds

Grouped keys (Hkv < H): each key-value head's group of query heads reads its keys once, its rows stacked
[B*Hkv, group * rows, D] against [B*Hkv, keys, D] in one GEMM; dk and dv sum over the group inside the same
GEMMs (a^T dO and ds^T q' over the stacked rows). Accumulation in float32 at least (float64 stays float64),
autocast off inside the op. Inputs come checked from the entry (`ops_pct.pct_attention`): tau and bias [H]
tensors, masks bool / int64.
"""

from __future__ import annotations

import torch

from .ops_common import autocast_off, query_panels

PANEL_ROWS = 128  # query rows per panel; read at call time


def _mask_panel(gate, block, offset, causal, key_padding_mask, document_ids) -> torch.Tensor:
    """Zero the invisible pairs of a panel's gates [B*H, rows, keys] in place (batch-major rows)."""
    start, end, lo, keys = block
    # keys [start + offset, keys) form a square block (keys - start - offset = end - start): row r (from start)
    # sees the first r + 1, so the block's upper triangle is hidden (tril_: ~6x a broadcast masked_fill_)
    if causal and keys - (start + offset) > 1:
        gate[..., start + offset - lo : keys - lo].tril_()
    if key_padding_mask is not None:  # [B, H * rows, keys] lines up with [B, 1, keys]
        gate.view(key_padding_mask.shape[0], -1, keys - lo).masked_fill_(~key_padding_mask[:, None, lo:keys], 0.0)
    if document_ids is not None:  # [B, H, rows, keys] against [B, 1, rows, keys]
        same = document_ids[:, start + offset : end + offset, None] == document_ids[:, None, lo:keys]
        gate.view(document_ids.shape[0], -1, end - start, keys - lo).masked_fill_(~same[:, None], 0.0)
    return gate


def _rows(x: torch.Tensor, block: tuple[int, int, int, int]) -> torch.Tensor:
    """A panel's query rows of x [B*Hkv, group, Lq, D] stacked per key-value head: [B*Hkv, group * rows, D] (a
    view with full heads)."""
    return x[:, :, block[0] : block[1]].flatten(1, 2)


def _panel_gates(q_scaled, key, bias_bh, block, offset, causal, key_padding_mask, document_ids) -> torch.Tensor:
    """a = sigmoid(b + q'_[start:end] K_[lo:keys]^T), invisible pairs exactly 0; [B*Hkv, group * rows, keys - lo],
    which is [B*H, rows, keys - lo] in memory (query head h = kv * group + g)."""
    start, end, lo, keys = block
    group = q_scaled.shape[1]
    if group > 1:  # per query head: [B*Hkv, group, 1, 1] -> one bias per stacked row
        bias_bh = bias_bh.view(-1, group, 1, 1).expand(-1, group, end - start, 1).flatten(1, 2)
    gate = torch.baddbmm(bias_bh, _rows(q_scaled, block), key[:, lo:keys].transpose(1, 2)).sigmoid_()
    _mask_panel(gate.view(-1, end - start, keys - lo), block, offset, causal, key_padding_mask, document_ids)
    return gate


def _per_row(value: torch.Tensor, batch: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-head vector [H] as [B*H, 1, 1] (batch-major rows), in `dtype`."""
    value = value.to(dtype)
    return (value if batch == 1 else value.expand(batch, -1).reshape(-1)).view(-1, 1, 1)


def _forward(query, key, value, tau, bias, key_padding_mask, document_ids, causal) -> torch.Tensor:
    """out [B, H, Lq, D] panel by panel (no autograd state: the autograd forward and generation's path)."""
    batch, heads, l_q, dim = query.shape
    key_heads, l_k = key.shape[1:3]
    acc = torch.promote_types(query.dtype, torch.float32)
    with autocast_off(query):
        tau_bh = _per_row(tau, batch, acc)
        bias_bh = _per_row(bias, batch, acc)
        q_scaled = (query.to(acc).reshape(batch * heads, l_q, dim) * tau_bh).view(batch * key_heads, -1, l_q, dim)
        k = key.to(acc).reshape(batch * key_heads, l_k, dim)
        v = value.to(acc).reshape(batch * key_heads, l_k, dim)
        # each panel written into `out` as it is computed: panels kept apart until a final cat would sit between
        # the growing gate temporaries and fragment the heap (as ZPX's did, issue 38)
        out = q_scaled.new_empty(batch * heads, l_q, dim)
        for block in query_panels(l_q, l_k, causal, PANEL_ROWS, document_ids):
            gate = _panel_gates(q_scaled, k, bias_bh, block, l_k - l_q, causal, key_padding_mask, document_ids)
            out[:, block[0] : block[1]] = torch.bmm(gate, v[:, block[2] : block[3]]).view(
                batch * heads, block[1] - block[0], dim
            )
            del gate  # freed before the next panel's gates are made
    return out.view(batch, heads, l_q, dim).to(query.dtype)


class _PCTAttentionPanel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, tau, bias, key_padding_mask, document_ids, causal):
        ctx.save_for_backward(query, key, value, tau, bias, key_padding_mask, document_ids)
        ctx.causal = causal
        return _forward(query, key, value, tau, bias, key_padding_mask, document_ids, causal)

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, tau, bias, key_padding_mask, document_ids = ctx.saved_tensors
        batch, heads, l_q, dim = query.shape
        key_heads, l_k = key.shape[1:3]
        grouped = (batch * key_heads, -1, l_q, dim)  # [B*Hkv, group, Lq, D]: one key-value head's query heads
        acc = torch.promote_types(query.dtype, torch.float32)
        with autocast_off(query):
            tau_bh = _per_row(tau, batch, acc)
            bias_bh = _per_row(bias, batch, acc)
            q = query.to(acc).reshape(batch * heads, l_q, dim)
            q_scaled = (q * tau_bh).view(grouped)
            k = key.to(acc).reshape(batch * key_heads, l_k, dim)
            v = value.to(acc).reshape(batch * key_heads, l_k, dim)
            do = grad_out.to(acc).reshape(grouped)
            g = torch.empty_like(q).view(grouped)  # ds K: dq / tau
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)
            dbias = q.new_zeros(batch * heads)
            for block in query_panels(l_q, l_k, ctx.causal, PANEL_ROWS, document_ids):
                start, end, lo, keys = block
                gate = _panel_gates(q_scaled, k, bias_bh, block, l_k - l_q, ctx.causal, key_padding_mask, document_ids)
                do_p = _rows(do, block)
                dv[:, lo:keys].baddbmm_(gate.transpose(1, 2), do_p)  # summed over the group's stacked rows
                ds = torch.bmm(do_p, v[:, lo:keys].transpose(1, 2)).mul_(gate)  # dP a
                ds.addcmul_(ds, gate, value=-1.0)  # dP a (1 - a); hidden pairs: a = 0 -> 0
                # not out=: a strided slice breaks compiled graphs
                g[:, :, start:end] = torch.bmm(ds, k[:, lo:keys]).view(batch * key_heads, -1, end - start, dim)
                dk[:, lo:keys].baddbmm_(ds.transpose(1, 2), _rows(q_scaled, block))
                dbias += ds.view(batch * heads, end - start, keys - lo).sum(dim=(1, 2))
            g = g.view(batch * heads, l_q, dim)
            dtau = (g * q).sum(dim=(1, 2))
            dq = g.mul_(tau_bh)
        return (
            dq.view(query.shape).to(query.dtype),
            dk.view(key.shape).to(key.dtype),
            dv.view(value.shape).to(value.dtype),
            dtau.view(batch, heads).sum(0).to(tau.dtype),
            dbias.view(batch, heads).sum(0).to(bias.dtype),
            None,
            None,
            None,
        )


def pct_attention_panel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor,
    bias: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
) -> torch.Tensor:
    """`ops_pct_base.PCTKernel` in query panels with a recomputing backward (module doc); any device and dtype."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, tau, bias)):
        return _PCTAttentionPanel.apply(query, key, value, tau, bias, key_padding_mask, document_ids, bool(causal))
    return _forward(query, key, value, tau, bias, key_padding_mask, document_ids, bool(causal))


__all__ = ["PANEL_ROWS", "pct_attention_panel"]
