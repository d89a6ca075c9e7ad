"""PCT sigmoid attention (SPEC §3, §5): a chunked PyTorch reference and a fused Triton kernel.

After the complex L2 normalisation and rotation (done by the model), a PCT head is real sigmoid
attention on the real head dim D = 2d, with q, k, v laid out [re | im]:

    raw_ij = q_i . k_j                    (= Re sum_m q_im conj(k_jm))
    a_ij   = sigmoid(tau_h raw_ij + b_h)  if key j is visible to query i, else exactly 0
    out_i  = sum_j a_ij v_j               (no row max, no normaliser)

Visibility: key j is visible to query i iff `key_padding_mask[b, j]` (when given) and, when causal,
j <= i + (Lk - Lq) (queries are the last Lq positions, as with a KV cache).

Backward (s = tau raw + b, dP = dO V^T):  ds = dP a (1 - a),  dq = tau ds K,  dk = tau ds^T Q,
dv = a^T dO,  dtau_h = sum ds raw,  db_h = sum ds.

* `pct_attention_reference` - PyTorch, any device/dtype, float32 accumulation. Processes
  (query block x key block) tiles with a hand-written backward that recomputes the gates, so
  neither pass ever holds a B x H x Lq x Lk tensor.
* `pct_attention_triton` - flash-style Triton kernels (forward; dk/dv; dq with the tau/b partial
  sums), float32 accumulation, causal tiles above the diagonal skipped. fp32/fp16/bf16 on CUDA;
  on CPU only under TRITON_INTERPRET=1 (tests).
* `pct_attention` - the one dispatch point: Triton for CUDA tensors when importable, else the
  reference.
"""

from __future__ import annotations

import os

import torch

try:  # optional: the remote-code copy of this file must import without triton
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None
    HAS_TRITON = False

IMPLEMENTATIONS = ("auto", "reference", "triton")


def _triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _per_head(value: torch.Tensor | float, num_heads: int, device: torch.device) -> torch.Tensor:
    """tau or b as a vector [H] of at least float32 precision (a scalar is broadcast to every head)."""
    value = torch.as_tensor(value, device=device)
    value = value.to(torch.promote_types(value.dtype, torch.float32))
    if value.numel() == 1:
        return value.reshape(1).expand(num_heads)
    if value.shape != (num_heads,):
        raise ValueError(f"per-head parameter must have shape [{num_heads}] or be a scalar; got {tuple(value.shape)}.")
    return value


def _check_shapes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_padding_mask) -> None:
    if query.dim() != 4 or key.shape != value.shape or key.dim() != 4:
        raise ValueError(
            "PCT attention expects query [B, H, Lq, D] and key/value [B, H, Lk, D]; got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}."
        )
    if query.shape[:2] != key.shape[:2] or query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query {tuple(query.shape)} and key {tuple(key.shape)} disagree on B, H or D.")
    if query.shape[2] > key.shape[2]:
        raise ValueError(f"more queries ({query.shape[2]}) than keys ({key.shape[2]}).")
    if key_padding_mask is not None and key_padding_mask.shape != (key.shape[0], key.shape[2]):
        raise ValueError(
            f"`key_padding_mask` must be [B={key.shape[0]}, Lk={key.shape[2]}]; got {tuple(key_padding_mask.shape)}."
        )


def _visible(
    q_start: int, q_end: int, k_start: int, k_end: int, offset: int, causal: bool, key_padding_mask, device
) -> torch.Tensor | None:
    """Bool [B|1, 1, M, N] visibility of a tile (None = all visible)."""
    mask = None
    if causal and k_end - 1 > q_start + offset:
        q_pos = torch.arange(q_start, q_end, device=device)[:, None] + offset
        k_pos = torch.arange(k_start, k_end, device=device)[None, :]
        mask = (k_pos <= q_pos)[None, None]
    if key_padding_mask is not None:
        keys = key_padding_mask[:, None, None, k_start:k_end]
        mask = keys if mask is None else mask & keys
    return mask


def _tile_gates(q, k, tau, bias, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """raw = q k^T and a = sigmoid(tau raw + b), masked to exactly 0.

    q [..., M, D], k [..., N, D]; tau, bias broadcast against [..., M, N]; mask [B|1, 1, M, N] or None.
    """
    raw = q @ k.transpose(-1, -2)
    gate = torch.addcmul(bias, raw, tau).sigmoid_()
    if mask is not None:  # batch-major rows: [B|1, rest, M, N] lines up with the mask
        gate.view(mask.shape[0], -1, *gate.shape[-2:]).masked_fill_(~mask, 0.0)
    return raw, gate


def _tiles(l_q: int, l_k: int, causal: bool, block: int):
    """(q_start, q_end, k_start, k_end) for every tile with at least one visible pair."""
    offset = l_k - l_q
    for q_start in range(0, l_q, block):
        q_end = min(q_start + block, l_q)
        k_stop = min(l_k, q_end + offset) if causal else l_k
        for k_start in range(0, k_stop, block):
            yield q_start, q_end, k_start, min(k_start + block, k_stop)


class _PCTAttentionReference(torch.autograd.Function):
    """Tiles over [B*H, L, D] views; the backward recomputes each tile's gates instead of storing them."""

    @staticmethod
    def forward(ctx, query, key, value, tau, bias, key_padding_mask, causal, block):
        batch, heads, l_q, dim = query.shape
        l_k = key.shape[2]
        offset = l_k - l_q
        acc = torch.promote_types(query.dtype, torch.float32)  # float32 accumulation (float64 stays float64)
        q, k, v = (t.to(acc).reshape(batch * heads, -1, dim) for t in (query, key, value))
        tau_bh, bias_bh = (t.to(acc).repeat(batch)[:, None, None] for t in (tau, bias))  # [B*H, 1, 1]
        out = torch.zeros_like(q)
        for qs, qe, ks, ke in _tiles(l_q, l_k, causal, block):
            mask = _visible(qs, qe, ks, ke, offset, causal, key_padding_mask, q.device)
            _, gate = _tile_gates(q[:, qs:qe], k[:, ks:ke], tau_bh, bias_bh, mask)
            out[:, qs:qe].baddbmm_(gate, v[:, ks:ke])
        ctx.save_for_backward(query, key, value, tau, bias, key_padding_mask)
        ctx.causal, ctx.block = causal, block
        return out.view(batch, heads, l_q, dim).to(query.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, tau, bias, key_padding_mask = ctx.saved_tensors
        batch, heads, l_q, dim = query.shape
        l_k = key.shape[2]
        offset = l_k - l_q
        acc = torch.promote_types(query.dtype, torch.float32)
        q, k, v, do = (t.to(acc).reshape(batch * heads, -1, dim) for t in (query, key, value, grad_out))
        tau_bh, bias_bh = (t.to(acc).repeat(batch)[:, None, None] for t in (tau, bias))
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dtau = q.new_zeros(batch * heads)
        dbias = q.new_zeros(batch * heads)
        for qs, qe, ks, ke in _tiles(l_q, l_k, ctx.causal, ctx.block):
            mask = _visible(qs, qe, ks, ke, offset, ctx.causal, key_padding_mask, q.device)
            q_t, k_t, v_t, do_t = q[:, qs:qe], k[:, ks:ke], v[:, ks:ke], do[:, qs:qe]
            raw, gate = _tile_gates(q_t, k_t, tau_bh, bias_bh, mask)
            dv[:, ks:ke].baddbmm_(gate.transpose(1, 2), do_t)
            ds = torch.bmm(do_t, v_t.transpose(1, 2)).mul_(gate)  # dP a
            ds = torch.addcmul(ds, ds, gate, value=-1.0)  # dP a (1 - a); masked pairs: a = 0 -> 0
            dq[:, qs:qe].baddbmm_(ds, k_t)
            dk[:, ks:ke].baddbmm_(ds.transpose(1, 2), q_t)
            dtau += torch.einsum("bmn,bmn->b", ds, raw)
            dbias += ds.sum(dim=(1, 2))
        shape = (batch, heads, -1, dim)
        return (
            dq.mul_(tau_bh).view(shape).to(query.dtype),
            dk.mul_(tau_bh).view(shape).to(key.dtype),
            dv.view(shape).to(value.dtype),
            dtau.view(batch, heads).sum(0).to(tau.dtype),
            dbias.view(batch, heads).sum(0).to(bias.dtype),
            None,
            None,
            None,
        )


def pct_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor | float,
    gate_bias: torch.Tensor | float,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = True,
    block_size: int = 256,
) -> torch.Tensor:
    """Sigmoid attention out_i = sum_j sigmoid(tau q_i.k_j + b) v_j over visible pairs (see module doc).

    query [B, H, Lq, D], key/value [B, H, Lk, D], tau and gate_bias [H] (or scalars),
    key_padding_mask [B, Lk] bool (True = real token). Memory: O(B H block_size^2) beyond the inputs.
    """
    _check_shapes(query, key, value, key_padding_mask)
    heads = query.shape[1]
    tau = _per_head(tau, heads, query.device)
    bias = _per_head(gate_bias, heads, query.device)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(device=query.device, dtype=torch.bool)
    return _PCTAttentionReference.apply(query, key, value, tau, bias, key_padding_mask, causal, block_size)


def pct_attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    tau: torch.Tensor | float,
    gate_bias: torch.Tensor | float,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """The materialised gates a_ij [B, H, Lq, Lk] (for `output_attentions`; O(L^2) memory)."""
    _check_shapes(query, key, key, key_padding_mask)
    heads, l_q, l_k = query.shape[1], query.shape[2], key.shape[2]
    tau = _per_head(tau, heads, query.device)
    bias = _per_head(gate_bias, heads, query.device)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(device=query.device, dtype=torch.bool)
    mask = _visible(0, l_q, 0, l_k, l_k - l_q, causal, key_padding_mask, query.device)
    acc = torch.promote_types(query.dtype, torch.float32)
    return _tile_gates(query.to(acc), key.to(acc), tau.to(acc)[:, None, None], bias.to(acc)[:, None, None], mask)[1]


if HAS_TRITON:

    def _configs() -> list:
        # The interpreter cannot benchmark several configs: one fixed config there.
        if _triton_interpreting() or not torch.cuda.is_available():
            return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=1)]
        return [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in ((64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3), (128, 128, 8, 2), (32, 32, 4, 2))
        ]

    _AUTOTUNE_KEY = ["BLOCK_D", "CAUSAL", "HAS_KPM"]

    # Grids are (B*H, tiles): B*H on axis 0 because CUDA caps grid axes 1 and 2 at 65535.

    @triton.jit
    def _visible_tile(
        offs_m, offs_n, b, kpm_ptr, stride_kpm, l_q, l_k, offset, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr
    ):
        valid = (offs_m[:, None] < l_q) & (offs_n[None, :] < l_k)
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None] + offset)
        if HAS_KPM:
            keep = tl.load(kpm_ptr + b * stride_kpm + offs_n, mask=offs_n < l_k, other=0)
            valid = valid & (keep[None, :] != 0)
        return valid

    @triton.autotune(configs=_configs(), key=_AUTOTUNE_KEY)
    @triton.jit
    def _pct_fwd_kernel(
        Q, K, V, O, TAU, BIAS, KPM,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod, s_kpm,
        H, L_Q, L_K, D, OFFSET,
        CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        pid_bh = tl.program_id(0)
        pid_m = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < D
        q = tl.load(
            Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
            mask=(offs_m[:, None] < L_Q) & d_ok,
            other=0.0,
        )
        tau = tl.load(TAU + h)
        bias = tl.load(BIAS + h)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        hi = L_K
        if CAUSAL:  # tiles right of the diagonal are fully masked: never visited
            hi = tl.minimum(L_K, (pid_m + 1) * BLOCK_M + OFFSET)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kv_mask = (offs_n[:, None] < L_K) & d_ok
            k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=kv_mask, other=0.0)
            v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=kv_mask, other=0.0)
            raw = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            gate = tl.sigmoid(raw * tau + bias)
            valid = _visible_tile(offs_m, offs_n, b, KPM, s_kpm, L_Q, L_K, OFFSET, CAUSAL, HAS_KPM)
            gate = tl.where(valid, gate, 0.0)
            acc += tl.dot(gate.to(v.dtype), v, input_precision=PRECISION)
        tl.store(
            O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
            acc.to(O.dtype.element_ty),
            mask=(offs_m[:, None] < L_Q) & d_ok,
        )

    @triton.autotune(configs=_configs(), key=_AUTOTUNE_KEY)
    @triton.jit
    def _pct_bwd_dkdv_kernel(
        Q, K, V, DO, DK, DV, TAU, BIAS, KPM,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, s_kpm,
        H, L_Q, L_K, D, OFFSET,
        CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        # Q, DO share strides (sq*); K, V, DK, DV share strides (sk*, sv*): the wrapper makes them contiguous.
        pid_bh = tl.program_id(0)
        pid_n = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < D
        kv_mask = (offs_n[:, None] < L_K) & d_ok
        k_ptrs = b * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :] * skd
        v_ptrs = b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :] * svd
        k = tl.load(K + k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(V + v_ptrs, mask=kv_mask, other=0.0)
        tau = tl.load(TAU + h)
        bias = tl.load(BIAS + h)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        lo = 0
        if CAUSAL:  # query tiles above the diagonal see none of these keys
            lo = (tl.maximum(pid_n * BLOCK_N - OFFSET, 0) // BLOCK_M) * BLOCK_M
        for start_m in range(lo, L_Q, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q_ptrs = b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd
            q_mask = (offs_m[:, None] < L_Q) & d_ok
            q = tl.load(Q + q_ptrs, mask=q_mask, other=0.0)
            do = tl.load(DO + q_ptrs, mask=q_mask, other=0.0)
            raw = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            gate = tl.sigmoid(raw * tau + bias)
            valid = _visible_tile(offs_m, offs_n, b, KPM, s_kpm, L_Q, L_K, OFFSET, CAUSAL, HAS_KPM)
            gate = tl.where(valid, gate, 0.0)
            dv += tl.dot(tl.trans(gate.to(do.dtype)), do, input_precision=PRECISION)
            dgate = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = dgate * gate * (1.0 - gate)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        tl.store(DK + k_ptrs, (dk * tau).to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + v_ptrs, dv.to(DV.dtype.element_ty), mask=kv_mask)

    @triton.autotune(configs=_configs(), key=_AUTOTUNE_KEY, reset_to_zero=["DTAU", "DBIAS"])
    @triton.jit
    def _pct_bwd_dq_kernel(
        Q, K, V, DO, DQ, TAU, BIAS, KPM, DTAU, DBIAS,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, s_kpm, s_part,
        H, L_Q, L_K, D, OFFSET,
        CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        # DTAU/DBIAS: per (b h, query tile) partial sums of ds raw and ds, reduced by the wrapper.
        pid_bh = tl.program_id(0)
        pid_m = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < D
        q_ptrs = b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd
        q_mask = (offs_m[:, None] < L_Q) & d_ok
        q = tl.load(Q + q_ptrs, mask=q_mask, other=0.0)
        do = tl.load(DO + q_ptrs, mask=q_mask, other=0.0)
        tau = tl.load(TAU + h)
        bias = tl.load(BIAS + h)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        dtau = tl.zeros([BLOCK_M], dtype=tl.float32)
        dbias = tl.zeros([BLOCK_M], dtype=tl.float32)
        hi = L_K
        if CAUSAL:
            hi = tl.minimum(L_K, (pid_m + 1) * BLOCK_M + OFFSET)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kv_mask = (offs_n[:, None] < L_K) & d_ok
            k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=kv_mask, other=0.0)
            v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=kv_mask, other=0.0)
            raw = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            gate = tl.sigmoid(raw * tau + bias)
            valid = _visible_tile(offs_m, offs_n, b, KPM, s_kpm, L_Q, L_K, OFFSET, CAUSAL, HAS_KPM)
            gate = tl.where(valid, gate, 0.0)
            dgate = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = dgate * gate * (1.0 - gate)
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
            dtau += tl.sum(ds * raw, axis=1)
            dbias += tl.sum(ds, axis=1)
        tl.store(DQ + q_ptrs, (dq * tau).to(DQ.dtype.element_ty), mask=q_mask)
        tl.store(DTAU + pid_bh * s_part + pid_m, tl.sum(dtau, axis=0))
        tl.store(DBIAS + pid_bh * s_part + pid_m, tl.sum(dbias, axis=0))

    _MIN_BLOCK_M = 32  # smallest BLOCK_M among the configs: sizes the partial-sum buffers

    def _launch_meta(query: torch.Tensor, causal: bool, key_padding_mask) -> dict:
        return {
            "CAUSAL": bool(causal),
            "HAS_KPM": key_padding_mask is not None,
            "PRECISION": "ieee" if query.dtype == torch.float32 else "tf32",
            "BLOCK_D": max(16, triton.next_power_of_2(query.shape[-1])),
        }

    class _PCTAttentionTriton(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value, tau, bias, key_padding_mask, causal):
            q, k, v = query.contiguous(), key.contiguous(), value.contiguous()
            batch, heads, l_q, dim = q.shape
            l_k = k.shape[2]
            out = torch.empty_like(q)
            kpm = key_padding_mask if key_padding_mask is not None else q
            s_kpm = key_padding_mask.stride(0) if key_padding_mask is not None else 0
            meta = _launch_meta(q, causal, key_padding_mask)

            def grid(c):
                return (batch * heads, triton.cdiv(l_q, c["BLOCK_M"]))

            _pct_fwd_kernel[grid](
                q, k, v, out, tau, bias, kpm, *q.stride(), *k.stride(), *v.stride(), *out.stride(), s_kpm,
                heads, l_q, l_k, dim, l_k - l_q, **meta,
            )  # fmt: skip
            ctx.save_for_backward(q, k, v, tau, bias, key_padding_mask)
            ctx.causal = causal
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, tau, bias, key_padding_mask = ctx.saved_tensors
            do = grad_out.contiguous()
            batch, heads, l_q, dim = q.shape
            l_k = k.shape[2]
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            kpm = key_padding_mask if key_padding_mask is not None else q
            s_kpm = key_padding_mask.stride(0) if key_padding_mask is not None else 0
            meta = _launch_meta(q, ctx.causal, key_padding_mask)
            common = (*q.stride(), *k.stride(), *v.stride(), s_kpm)
            sizes = (heads, l_q, l_k, dim, l_k - l_q)

            def grid_n(c):
                return (batch * heads, triton.cdiv(l_k, c["BLOCK_N"]))

            _pct_bwd_dkdv_kernel[grid_n](q, k, v, do, dk, dv, tau, bias, kpm, *common, *sizes, **meta)

            n_part = triton.cdiv(l_q, _MIN_BLOCK_M)
            dtau_part = torch.zeros(batch * heads, n_part, device=q.device, dtype=torch.float32)
            dbias_part = torch.zeros_like(dtau_part)

            def grid_m(c):
                return (batch * heads, triton.cdiv(l_q, c["BLOCK_M"]))

            _pct_bwd_dq_kernel[grid_m](
                q, k, v, do, dq, tau, bias, kpm, dtau_part, dbias_part, *common, dtau_part.stride(0), *sizes, **meta
            )
            dtau = dtau_part.view(batch, heads, n_part).sum(dim=(0, 2))
            dbias = dbias_part.view(batch, heads, n_part).sum(dim=(0, 2))
            return dq, dk, dv, dtau, dbias, None, None


def pct_attention_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor | float,
    gate_bias: torch.Tensor | float,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """Same contract as `pct_attention_reference`, computed by the fused Triton kernels."""
    if not HAS_TRITON:
        raise RuntimeError("attention_kernel='triton' needs the `triton` package; install it or use 'reference'.")
    if not query.is_cuda and not _triton_interpreting():
        raise RuntimeError(
            "the PCT Triton kernel runs on CUDA tensors (or on CPU with TRITON_INTERPRET=1 set before import); "
            "use attention_kernel='reference' here."
        )
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"the PCT Triton kernel supports fp32/fp16/bf16 inputs; got {query.dtype}.")
    _check_shapes(query, key, value, key_padding_mask)
    heads = query.shape[1]
    tau = _per_head(tau, heads, query.device).float().contiguous()
    bias = _per_head(gate_bias, heads, query.device).float().contiguous()
    value = value.to(query.dtype)
    key = key.to(query.dtype)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(device=query.device, dtype=torch.int8).contiguous()
    return _PCTAttentionTriton.apply(query, key, value, tau, bias, key_padding_mask, bool(causal))


def pct_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tau: torch.Tensor | float,
    gate_bias: torch.Tensor | float,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = True,
    implementation: str = "auto",
) -> torch.Tensor:
    """PCT sigmoid attention; `implementation` "auto" picks Triton for fp32/fp16/bf16 CUDA tensors (when
    triton is importable), else the chunked PyTorch reference. Shapes and semantics: see
    `pct_attention_reference`."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"`attention_kernel`={implementation!r} is invalid: expected one of {list(IMPLEMENTATIONS)}.")
    if implementation == "auto":
        kernel_dtype = query.dtype in (torch.float32, torch.float16, torch.bfloat16)
        implementation = "triton" if HAS_TRITON and query.is_cuda and kernel_dtype else "reference"
    if implementation == "triton":
        return pct_attention_triton(query, key, value, tau, gate_bias, key_padding_mask, causal)
    return pct_attention_reference(query, key, value, tau, gate_bias, key_padding_mask, causal)


__all__ = [
    "HAS_TRITON",
    "pct_attention",
    "pct_attention_reference",
    "pct_attention_triton",
    "pct_attention_weights",
]
