"""Geometric product attention in O(L) memory with PyTorch ops (kernel "chunk"; earlier "cpu", "chunked").

The function of `ops_gpa_naive.gpa_naive`, computed flash-style. With Q^(m)_B = qsign_m[B] Q_{B xor C_m}
(the 11 signed permutations of the query, `form_tables`), <P_ij>_{C_m} = Q^(m)_i . K_j, so for a panel of
queries the 11 forms against a block of keys are one GEMM [11 P, D] x [D, N]. Per panel:

* only the key blocks a query can see are visited: causal blocks past the panel, fully padded blocks and
  (packed rows) blocks wholly outside every document of the panel are skipped;
* an online softmax keeps the running max and sum, and only the log-sum-exp per row is stored;
* the backward recomputes the scores (a `torch.autograd.Function`): with dS the score gradient,
  dK = [dS_0; dS_m] ^T [Q^(0); Q^(m)] (one GEMM), dQ^(m) = dS_m K, dQ = sum_m unpermute(dQ^(m)),
  dS_m = dS * gamma * <P>_{C_m} / norm for the bivector forms.

The query is pre-multiplied by `scaling`, with eps -> eps * scaling^2 (the same score, one pass fewer).
Memory is O(L) (q, k, v, out, lse and per-panel tiles); a query row with no visible key outputs zeros.
Grouped keys (Hkv < H): every product with a key block is one batched GEMM per key-value head over its group's
query heads (`_grouped`), and dK, dV sum the group's rows inside their GEMMs (`_group_sum`); keys are never
repeated. Computes in float32 (float64 for float64 inputs); called through `ops_gpa.geometric_product_attention`.
"""

from __future__ import annotations

import torch

from .ops_common import compute_dtype, document_spans
from .ops_gpa_base import NUM_FORMS, form_tables

PANEL = 128  # query rows per panel
BLOCK = 256  # keys per block


def _full_tables(dim: int, forms: int, device: torch.device, dtype: torch.dtype):
    """index/sign tables widened from one multivector (32) to D = 32 c columns: [forms, D]."""
    index, sign, query_sign = form_tables(device)
    channels = dim // 32
    offsets = torch.arange(channels, device=device).repeat_interleave(32) * 32
    full_index = index[:forms].repeat(1, channels) + offsets
    return full_index, sign[:forms].repeat(1, channels).to(dtype), query_sign[:forms].repeat(1, channels).to(dtype)


def _query_forms(q: torch.Tensor, full_index: torch.Tensor, query_sign: torch.Tensor) -> torch.Tensor:
    """[B, H, P, D] -> [B, H, forms * P, D], rows m * P + i = Q^(m)_i."""
    batch, heads, rows, dim = q.shape
    forms = q[..., full_index] * query_sign  # [B, H, P, forms, D]
    return forms.transpose(2, 3).reshape(batch, heads, -1, dim)


def _unpermute(grad_forms: torch.Tensor, full_index: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """d/dQ of sum_m <G_m, Q^(m)>: G [B, H, forms * P, D] -> [B, H, P, D] (index is an involution)."""
    batch, heads, _, dim = grad_forms.shape
    forms = full_index.shape[0]
    g = grad_forms.view(batch, heads, forms, -1, dim)
    gathered = torch.gather(g, -1, full_index[None, None, :, None, :].expand_as(g))
    return (gathered * sign[:, None, :]).sum(2)


def _grouped(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [B, H, R, X] @ b [B, Hkv, X, Y] -> [B, H, R, Y]: query head h against key-value head h // (H / Hkv)."""
    if a.shape[1] == b.shape[1]:
        return torch.matmul(a, b)
    return torch.matmul(a.unflatten(1, (b.shape[1], -1)), b.unsqueeze(2)).flatten(1, 2)


def _group_sum(a: torch.Tensor, b: torch.Tensor, key_heads: int) -> torch.Tensor:
    """sum over each group of a^T b: a [B, H, R, X], b [B, H, R, Y] -> [B, Hkv, X, Y] (the group's rows stacked)."""
    if a.shape[1] == key_heads:
        return torch.matmul(a.transpose(-1, -2), b)
    batch, _, _, width = a.shape
    return torch.matmul(
        a.reshape(batch, key_heads, -1, width).transpose(-1, -2), b.reshape(batch, key_heads, -1, b.shape[-1])
    )


class _Plan:
    """What forward and backward share: form tables, gamma [1, H, 1, 1], sqrt(eps) * scaling (None when
    bivector=False), and the key blocks each query panel visits with the mask a block needs."""

    def __init__(self, query, key, gamma, causal, key_padding_mask, document_ids, scaling, eps, bivector):
        q_len, k_len, device = query.shape[2], key.shape[2], query.device
        self.forms = NUM_FORMS if bivector else 1
        self.full_index, self.sign, self.query_sign = _full_tables(query.shape[-1], self.forms, device, query.dtype)
        self.gamma = gamma.view(1, -1, 1, 1)
        self.root_eps = torch.tensor(eps * scaling**2, dtype=query.dtype, device=device).sqrt() if bivector else None
        self.offset = k_len - q_len
        self.causal = causal
        self.device = device
        self.documents = document_ids
        self.host_reads = not torch.compiler.is_compiling()  # a compiled graph visits and masks every block
        if document_ids is not None and self.host_reads:
            self.doc_first, self.doc_end = document_spans(document_ids)
        self.blocks = []  # (start, stop, padding [B, 1, 1, N] or None)
        keys = None if key_padding_mask is None else key_padding_mask.to(device=device, dtype=torch.bool)
        for start in range(0, k_len, BLOCK):
            stop = min(start + BLOCK, k_len)
            padding = None
            if keys is not None:
                block = keys[:, start:stop]
                if not self.host_reads:
                    padding = block[:, None, None, :]
                elif not bool(block.any()):
                    continue  # every sequence's keys here are padding
                elif not bool(block.all()):
                    padding = block[:, None, None, :]
            self.blocks.append((start, stop, padding))

    def visits(self, q_start: int, q_stop: int):
        """(key start, key stop, mask [B|1, 1, P, N] or None) for the panel of queries [q_start, q_stop)."""
        last = q_stop - 1 + self.offset  # absolute position of the panel's last query
        first = q_start + self.offset
        lowest, highest = 0, None  # the keys any query of the panel can see
        if self.documents is not None and self.host_reads:
            lowest = int(self.doc_first[:, first].min())
            highest = int(self.doc_end[:, last].max()) - 1
        for start, stop, padding in self.blocks:
            if (self.causal and start > last) or (highest is not None and start > highest):
                break
            if stop <= lowest:
                continue
            mask = padding
            if self.causal and stop - 1 > first:  # the block crosses the diagonal
                q_pos = torch.arange(first, last + 1, device=self.device)[:, None]
                causal = (torch.arange(start, stop, device=self.device)[None, :] <= q_pos)[None, None]
                mask = causal if mask is None else mask & causal
            if self.documents is not None:
                same = self.documents[:, None, first : last + 1, None] == self.documents[:, None, None, start:stop]
                mask = same if mask is None else mask & same
            yield start, stop, mask


def _scores(products: torch.Tensor, gamma: torch.Tensor, root_eps: torch.Tensor | None):
    """products [B, H, forms, P, N] -> (score [B, H, P, N] (a new tensor), norm or None)."""
    if root_eps is None:
        return products[:, :, 0].clone(), None
    square = products[:, :, 1] * products[:, :, 1]
    for m in range(2, NUM_FORMS):
        square.addcmul_(products[:, :, m], products[:, :, m])
    norm = torch.hypot(square.sqrt_(), root_eps)  # sqrt(sum <P>_C^2 + root_eps^2)
    return torch.addcmul(products[:, :, 0], gamma, norm), norm


class _GPAChunkedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, gamma, causal, key_padding_mask, document_ids, scaling, eps, bivector):
        batch, heads, q_len, dim = query.shape
        plan = _Plan(query, key, gamma, causal, key_padding_mask, document_ids, scaling, eps, bivector)
        out = torch.zeros_like(query)
        lse = torch.full((batch, heads, q_len), float("inf"), dtype=query.dtype, device=query.device)
        for q_start in range(0, q_len, PANEL):
            q_stop = min(q_start + PANEL, q_len)
            q_forms = _query_forms(query[:, :, q_start:q_stop] * scaling, plan.full_index, plan.query_sign)
            rows = q_stop - q_start
            row_max = torch.full((batch, heads, rows), float("-inf"), dtype=query.dtype, device=query.device)
            row_sum = torch.zeros(batch, heads, rows, dtype=query.dtype, device=query.device)
            acc = torch.zeros(batch, heads, rows, dim, dtype=query.dtype, device=query.device)
            for k_start, k_stop, mask in plan.visits(q_start, q_stop):
                products = _grouped(q_forms, key[:, :, k_start:k_stop].transpose(-1, -2))
                score, _ = _scores(products.view(batch, heads, plan.forms, rows, -1), plan.gamma, plan.root_eps)
                if mask is not None:
                    score.masked_fill_(~mask, float("-inf"))
                new_max = torch.maximum(row_max, score.amax(-1))
                shift = new_max.masked_fill(new_max == float("-inf"), 0.0)  # rows with nothing visible yet
                p = score.sub_(shift[..., None]).exp_()
                alpha = torch.exp(row_max - shift)
                row_sum = row_sum * alpha + p.sum(-1)
                acc = acc * alpha[..., None] + _grouped(p, value[:, :, k_start:k_stop])
                row_max = new_max
            seen = row_sum > 0
            out[:, :, q_start:q_stop] = acc / torch.where(seen, row_sum, 1.0)[..., None]
            lse[:, :, q_start:q_stop] = torch.where(seen, row_max + row_sum.log(), float("inf"))
        ctx.save_for_backward(query, key, value, gamma, out, lse)
        ctx.settings = (causal, key_padding_mask, document_ids, scaling, eps, bivector)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, gamma, out, lse = ctx.saved_tensors
        causal, key_padding_mask, document_ids, scaling, eps, bivector = ctx.settings
        batch, heads, q_len, dim = query.shape
        key_heads = key.shape[1]
        plan = _Plan(query, key, gamma, causal, key_padding_mask, document_ids, scaling, eps, bivector)
        grad_out = grad_out.to(query.dtype)
        dq = torch.zeros_like(query)
        dk = torch.zeros_like(key)
        dv = torch.zeros_like(value)
        dgamma = torch.zeros(heads, dtype=query.dtype, device=query.device)
        delta = (grad_out * out).sum(-1)  # sum_j p_ij dP_ij = dO_i . O_i
        with torch.autocast(query.device.type, enabled=False):
            for q_start in range(0, q_len, PANEL):
                q_stop = min(q_start + PANEL, q_len)
                rows = q_stop - q_start
                q_forms = _query_forms(query[:, :, q_start:q_stop] * scaling, plan.full_index, plan.query_sign)
                d_forms = torch.zeros_like(q_forms)
                do = grad_out[:, :, q_start:q_stop]
                row_lse = lse[:, :, q_start:q_stop, None]
                row_delta = delta[:, :, q_start:q_stop, None]
                for k_start, k_stop, mask in plan.visits(q_start, q_stop):
                    k = key[:, :, k_start:k_stop]
                    v = value[:, :, k_start:k_stop]
                    products = _grouped(q_forms, k.transpose(-1, -2))
                    tiles = products.view(batch, heads, plan.forms, rows, -1)
                    score, norm = _scores(tiles, plan.gamma, plan.root_eps)
                    if mask is not None:
                        score.masked_fill_(~mask, float("-inf"))
                    p = score.sub_(row_lse).exp_()  # lse = +inf on empty rows -> 0
                    dv[:, :, k_start:k_stop] += _group_sum(p, do, key_heads)
                    ds = _grouped(do, v.transpose(-1, -2)).sub_(row_delta).mul_(p)  # dL/dS
                    if bivector:
                        dgamma += (ds * norm).sum((0, 2, 3))
                        tiles[:, :, 1:] *= (ds * plan.gamma / norm)[:, :, None]  # dL/d<P>_C = dS gamma <P>_C / norm
                    tiles[:, :, 0] = ds
                    d_forms += _grouped(products, k)
                    dk[:, :, k_start:k_stop] += _group_sum(products, q_forms, key_heads)
                dq[:, :, q_start:q_stop] = _unpermute(d_forms, plan.full_index, plan.sign) * scaling
        return dq, dk, dv, dgamma if bivector else None, None, None, None, None, None, None


def gpa_chunk(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gamma: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    document_ids: torch.Tensor | None,
    scaling: float,
    eps: float,
    bivector: bool,
) -> torch.Tensor:
    """`ops_gpa_base.GPAKernel` with query panels, key blocks, online softmax and a recomputing backward (O(L)
    memory)."""
    dtype = compute_dtype(query)
    return _GPAChunkedFunction.apply(
        query.to(dtype),
        key.to(dtype),
        value.to(dtype),
        gamma.to(dtype),
        causal,
        key_padding_mask,
        document_ids,
        scaling,
        eps,
        bivector,
    )


__all__ = ["gpa_chunk"]
