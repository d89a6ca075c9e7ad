"""PCT sigmoid attention in memory-lean PyTorch (the CPU fast path): query panels, recomputing backward.

Same function as `ops_pct_naive.pct_attention_naive`. Queries are processed in panels of
`PANEL_ROWS` rows against only the keys a panel can see (causal: the prefix up to its last row),
so no pass holds more than B x H x PANEL_ROWS x Lk gates; the backward recomputes each panel's
gates instead of storing them. Without gradients (generation) the forward runs without autograd
state. Per panel, with q' = tau q (tau folded into the query):

    forward    s = b + q' K^T  (bias as the GEMM's initial value),  a = sigmoid(s) masked,  out = a V
    backward   dP = dO V^T,  ds = dP a (1 - a),  dv += a^T dO,  dk += ds^T q',  g = ds K,
               dq = tau g,  dtau = sum q . g  (= sum ds q.k, from the dq product: no extra L x L pass),
               db = sum ds

Accumulation in float32 at least (float64 stays float64), autocast off inside the op.

One query row (decoding with a KV cache) takes `pct_attention_decode`: no panels, plain autograd, every
cached key visible under causality (the query is the last position), so only padding masks pairs.
"""

from __future__ import annotations

import struct

import torch

from .ops_pct_naive import autocast_off, prepare_inputs

PANEL_ROWS = 128  # query rows per panel; read at call time


def _panels(l_q: int, l_k: int, causal: bool, rows: int):
    """(start, end, keys): query rows [start, end) see keys [0, keys)."""
    offset = l_k - l_q
    for start in range(0, l_q, rows):
        end = min(start + rows, l_q)
        yield start, end, min(l_k, end + offset) if causal else l_k


def _mask_panel(gate, start, keys, offset, causal, key_padding_mask) -> torch.Tensor:
    """Zero the invisible pairs of a panel's gates [..., rows, keys] in place (leading dims batch-major)."""
    # keys [start + offset, keys) form a square block (keys - start - offset = end - start): row r (from start)
    # sees the first r + 1, so the block's upper triangle is hidden (tril_: ~6x a broadcast masked_fill_)
    if causal and keys - (start + offset) > 1:
        gate[..., start + offset : keys].tril_()
    if key_padding_mask is not None:  # [B, H * rows, keys] lines up with [B, 1, keys]
        gate.view(key_padding_mask.shape[0], -1, keys).masked_fill_(~key_padding_mask[:, None, :keys], 0.0)
    return gate


def _panel_gates(q_scaled, key, bias_bh, start, end, keys, offset, causal, key_padding_mask) -> torch.Tensor:
    """a = sigmoid(b + q'_[start:end] K_[:keys]^T), invisible pairs exactly 0; [B*H, rows, keys]."""
    gate = torch.baddbmm(bias_bh, q_scaled[:, start:end], key[:, :keys].transpose(1, 2)).sigmoid_()
    return _mask_panel(gate, start, keys, offset, causal, key_padding_mask)


def _per_row(value: torch.Tensor, batch: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-head vector [H] as [B*H, 1, 1] (batch-major rows), in `dtype`."""
    value = value.to(dtype)
    return (value if batch == 1 else value.expand(batch, -1).reshape(-1)).view(-1, 1, 1)


def _forward(query, key, value, tau, bias, key_padding_mask, causal) -> torch.Tensor:
    """out [B, H, Lq, D] panel by panel (no autograd state: the autograd forward and generation's path)."""
    batch, heads, l_q, dim = query.shape
    l_k = key.shape[2]
    acc = torch.promote_types(query.dtype, torch.float32)
    with autocast_off(query):
        tau_bh = _per_row(tau, batch, acc)
        bias_bh = _per_row(bias, batch, acc)
        q_scaled = query.to(acc).reshape(batch * heads, l_q, dim) * tau_bh
        k = key.to(acc).reshape(batch * heads, l_k, dim)
        v = value.to(acc).reshape(batch * heads, l_k, dim)
        panels = [
            torch.bmm(
                _panel_gates(q_scaled, k, bias_bh, start, end, keys, l_k - l_q, causal, key_padding_mask), v[:, :keys]
            )
            for start, end, keys in _panels(l_q, l_k, causal, PANEL_ROWS)
        ]
        out = panels[0] if len(panels) == 1 else torch.cat(panels, dim=1)
    return out.view(batch, heads, l_q, dim).to(query.dtype)


class _PCTAttentionTiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, tau, bias, key_padding_mask, causal):
        ctx.save_for_backward(query, key, value, tau, bias, key_padding_mask)
        ctx.causal = causal
        return _forward(query, key, value, tau, bias, key_padding_mask, causal)

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, tau, bias, key_padding_mask = ctx.saved_tensors
        batch, heads, l_q, dim = query.shape
        l_k = key.shape[2]
        acc = torch.promote_types(query.dtype, torch.float32)
        with autocast_off(query):
            tau_bh = _per_row(tau, batch, acc)
            bias_bh = _per_row(bias, batch, acc)
            q = query.to(acc).reshape(batch * heads, l_q, dim)
            q_scaled = q * tau_bh
            k = key.to(acc).reshape(batch * heads, l_k, dim)
            v = value.to(acc).reshape(batch * heads, l_k, dim)
            do = grad_out.to(acc).reshape(batch * heads, l_q, dim)
            g = torch.empty_like(q)  # ds K: dq / tau
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)
            dbias = q.new_zeros(batch * heads)
            for start, end, keys in _panels(l_q, l_k, ctx.causal, PANEL_ROWS):
                gate = _panel_gates(q_scaled, k, bias_bh, start, end, keys, l_k - l_q, ctx.causal, key_padding_mask)
                do_p = do[:, start:end]
                dv[:, :keys].baddbmm_(gate.transpose(1, 2), do_p)
                ds = torch.bmm(do_p, v[:, :keys].transpose(1, 2)).mul_(gate)  # dP a
                ds.addcmul_(ds, gate, value=-1.0)  # dP a (1 - a); hidden pairs: a = 0 -> 0
                g[:, start:end] = torch.bmm(ds, k[:, :keys])  # not out=: a strided slice breaks compiled graphs
                dk[:, :keys].baddbmm_(ds.transpose(1, 2), q_scaled[:, start:end])
                dbias += ds.sum(dim=(1, 2))
            dtau = (g * q).sum(dim=(1, 2))
            dq = g.mul_(tau_bh)
        shape = (batch, heads, -1, dim)
        return (
            dq.view(shape).to(query.dtype),
            dk.view(shape).to(key.dtype),
            dv.view(shape).to(value.dtype),
            dtau.view(batch, heads).sum(0).to(tau.dtype),
            dbias.view(batch, heads).sum(0).to(bias.dtype),
            None,
            None,
        )


def _as(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor.to(dtype)`, without a dispatched call when the dtype already matches."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _gate_number(number: float, acc: torch.dtype) -> float | torch.Tensor:
    """A Python tau or bias as `prepare_inputs` reads it (a tensor of the default dtype, ints int64, raised to
    float32 at least), in `acc`: with float32 the default, a host-side float32 rounding (no tensor op)."""
    if torch.get_default_dtype() == torch.float32 and not torch.compiler.is_compiling():
        try:
            return struct.unpack("f", struct.pack("f", number))[0]
        except OverflowError:  # beyond float32's range: the tensor path gives inf
            pass
    value = torch.as_tensor(number)
    return value.to(torch.promote_types(value.dtype, torch.float32)).to(acc)


def pct_attention_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor | float,
    bias: torch.Tensor | float,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per (batch, head): out = sigmoid(tau q.K^T + b) V, padded keys exactly 0.

    query [B, H, 1, D] (the last position: causal or not, it sees every key), key/value [B, H, Lk, D]; tau and
    bias [H] tensors or Python numbers; key_padding_mask [B, Lk] bool or None. No input checks: callers pass
    shapes `prepare_inputs` accepts (the model, or `pct_attention_tiled` after its checks).
    """
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32  # promote_types(dtype, float32)
    with autocast_off(query):
        # a Python number is rounded as `prepare_inputs` rounds it (so prefill and decoding agree)
        tau = _as(tau, acc).view(-1, 1, 1) if isinstance(tau, torch.Tensor) else _gate_number(tau, acc)
        bias = _as(bias, acc).view(-1, 1, 1) if isinstance(bias, torch.Tensor) else _gate_number(bias, acc)
        raw = torch.matmul(_as(query, acc) * tau, _as(key, acc).transpose(-1, -2))  # tau q.k_j, [B, H, 1, Lk]
        gate = torch.sigmoid(raw.add_(bias))
        if key_padding_mask is not None:
            gate = gate.masked_fill(~key_padding_mask[:, None, None, :], 0.0)  # not in place: sigmoid's backward
        out = torch.matmul(gate, _as(value, acc))
    return _as(out, query.dtype)


def pct_attention_tiled(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor | float,
    bias: torch.Tensor | float,
    *,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """PCT sigmoid attention in query panels with a recomputing backward (module doc); any device and dtype."""
    tau, bias, key_padding_mask = prepare_inputs(query, key, value, tau, bias, key_padding_mask)
    if query.shape[2] == 1:
        return pct_attention_decode(query, key, value, tau, bias, key_padding_mask)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, tau, bias)):
        return _PCTAttentionTiled.apply(query, key, value, tau, bias, key_padding_mask, bool(causal))
    return _forward(query, key, value, tau, bias, key_padding_mask, bool(causal))


__all__ = ["PANEL_ROWS", "pct_attention_decode", "pct_attention_tiled"]
