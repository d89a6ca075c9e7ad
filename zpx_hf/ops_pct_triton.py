"""PCT sigmoid attention as fused Triton kernels (kernel `triton`; flash-style, forward and backward), same
function as `ops_pct_naive.pct_attention_naive`, packed rows included (a pair counts only inside one document).

Three kernels, float32 accumulation; tiles above the causal diagonal and, in packed rows, tiles holding only
other documents' tokens (`ops_common.key_tile_range` / `query_tile_range`) are never visited:
forward (out = a V per query tile); dk/dv per key tile; dq per query tile with the per-tile partial
sums of dtau = sum ds raw and db = sum ds (reduced by the wrapper). With dP = dO V^T and
ds = dP a (1 - a): dq = tau ds K, dk = tau ds^T Q, dv = a^T dO. fp32/fp16/bf16 on CUDA; on CPU only
under TRITON_INTERPRET=1 (set before import; tests). Grouped keys (Hkv < H): query head h reads key-value head
h // GROUP in the pointer arithmetic (never a repeated copy); the dk/dv kernel runs per key-value head and
accumulates over its group's query heads in the kernel (dk += tau_h ds_h^T Q_h, dv += a_h^T dO_h).
`triton` is optional: without it this module imports and `HAS_TRITON` is False. Inputs come checked from the
entry (`ops_pct.pct_attention`).
"""

from __future__ import annotations

import torch

from .ops_common import HAS_TRITON, document_tables, tl, triton, triton_interpreting

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


if HAS_TRITON:
    from .ops_common import key_tile_range, query_tile_range  # defined only where triton imports

    def _configs() -> list:
        # The interpreter cannot benchmark several configs: one fixed config there.
        if triton_interpreting() or not torch.cuda.is_available():
            return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=1)]
        return [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in ((64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3), (128, 128, 8, 2), (32, 32, 4, 2))
        ]

    _AUTOTUNE_KEY = ["BLOCK_D", "CAUSAL", "HAS_KPM", "HAS_DOC"]

    # Grids are (B*H, tiles): B*H on axis 0 because CUDA caps grid axes 1 and 2 at 65535.

    @triton.jit
    def _visible_tile(
        offs_m, offs_n, b, kpm_ptr, stride_kpm, doc_ptr, stride_doc, l_q, l_k, offset,
        CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr,
    ):  # fmt: skip
        valid = (offs_m[:, None] < l_q) & (offs_n[None, :] < l_k)
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None] + offset)
        if HAS_KPM:
            keep = tl.load(kpm_ptr + b * stride_kpm + offs_n, mask=offs_n < l_k, other=0)
            valid = valid & (keep[None, :] != 0)
        if HAS_DOC:  # packed rows: query (position offset + m) and key in one document
            doc_q = tl.load(doc_ptr + b * stride_doc + offs_m + offset, mask=offs_m < l_q, other=-1)
            doc_k = tl.load(doc_ptr + b * stride_doc + offs_n, mask=offs_n < l_k, other=-2)
            valid = valid & (doc_q[:, None] == doc_k[None, :])
        return valid

    @triton.autotune(configs=_configs(), key=_AUTOTUNE_KEY)
    @triton.jit
    def _pct_fwd_kernel(
        Q, K, V, O, TAU, BIAS, KPM, DOC, DOC_FIRST, DOC_END,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod, s_kpm, s_doc,
        H, GROUP, L_Q, L_K, D, OFFSET,
        CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        pid_bh = tl.program_id(0)
        pid_m = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        kh = h // GROUP  # the key-value head query head h reads
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
        # key tiles right of the diagonal (causal) or of other documents only (packed): never visited
        lo, hi = key_tile_range(pid_m, L_Q, L_K, OFFSET, b * s_doc, DOC_FIRST, DOC_END, CAUSAL, HAS_DOC,
                                BLOCK_M, BLOCK_N)  # fmt: skip
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kv_mask = (offs_n[:, None] < L_K) & d_ok
            k = tl.load(K + b * skb + kh * skh + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=kv_mask, other=0.0)
            v = tl.load(V + b * svb + kh * svh + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=kv_mask, other=0.0)
            raw = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            gate = tl.sigmoid(raw * tau + bias)
            valid = _visible_tile(offs_m, offs_n, b, KPM, s_kpm, DOC, s_doc, L_Q, L_K, OFFSET, CAUSAL, HAS_KPM, HAS_DOC)
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
        Q, K, V, DO, DK, DV, TAU, BIAS, KPM, DOC, DOC_FIRST, DOC_END,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, s_kpm, s_doc,
        H, GROUP, L_Q, L_K, D, OFFSET,
        CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        # Q, DO share strides (sq*); K, V, DK, DV share strides (sk*, sv*): the wrapper makes them contiguous.
        # One program per (batch, key-value head kh, key tile): its group's query heads kh * GROUP + g in turn.
        pid_bh = tl.program_id(0)
        pid_n = tl.program_id(1)
        b = pid_bh // (H // GROUP)
        kh = pid_bh % (H // GROUP)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < D
        kv_mask = (offs_n[:, None] < L_K) & d_ok
        k_ptrs = b * skb + kh * skh + offs_n[:, None] * skn + offs_d[None, :] * skd
        v_ptrs = b * svb + kh * svh + offs_n[:, None] * svn + offs_d[None, :] * svd
        k = tl.load(K + k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(V + v_ptrs, mask=kv_mask, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        # query tiles above the diagonal (causal) or of other documents only (packed) see none of these keys
        lo, hi = query_tile_range(pid_n, L_Q, L_K, OFFSET, b * s_doc, DOC_FIRST, DOC_END, CAUSAL, HAS_DOC,
                                  BLOCK_M, BLOCK_N)  # fmt: skip
        for g in range(GROUP):
            h = kh * GROUP + g
            tau = tl.load(TAU + h)
            bias = tl.load(BIAS + h)
            dk_h = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)  # ds_h^T Q_h, scaled by this head's tau
            for start_m in range(lo, hi, BLOCK_M):
                offs_m = start_m + tl.arange(0, BLOCK_M)
                q_ptrs = b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd
                q_mask = (offs_m[:, None] < L_Q) & d_ok
                q = tl.load(Q + q_ptrs, mask=q_mask, other=0.0)
                do = tl.load(DO + q_ptrs, mask=q_mask, other=0.0)
                raw = tl.dot(q, tl.trans(k), input_precision=PRECISION)
                gate = tl.sigmoid(raw * tau + bias)
                valid = _visible_tile(offs_m, offs_n, b, KPM, s_kpm, DOC, s_doc, L_Q, L_K, OFFSET, CAUSAL, HAS_KPM,
                                      HAS_DOC)  # fmt: skip
                gate = tl.where(valid, gate, 0.0)
                dv += tl.dot(tl.trans(gate.to(do.dtype)), do, input_precision=PRECISION)
                dgate = tl.dot(do, tl.trans(v), input_precision=PRECISION)
                ds = dgate * gate * (1.0 - gate)
                dk_h += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
            dk += dk_h * tau
        tl.store(DK + k_ptrs, dk.to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + v_ptrs, dv.to(DV.dtype.element_ty), mask=kv_mask)

    @triton.autotune(configs=_configs(), key=_AUTOTUNE_KEY, reset_to_zero=["DTAU", "DBIAS"])
    @triton.jit
    def _pct_bwd_dq_kernel(
        Q, K, V, DO, DQ, TAU, BIAS, KPM, DOC, DOC_FIRST, DOC_END, DTAU, DBIAS,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, s_kpm, s_doc, s_part,
        H, GROUP, L_Q, L_K, D, OFFSET,
        CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        # DTAU/DBIAS: per (b h, query tile) partial sums of ds raw and ds, reduced by the wrapper.
        pid_bh = tl.program_id(0)
        pid_m = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        kh = h // GROUP  # the key-value head query head h reads
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
        lo, hi = key_tile_range(pid_m, L_Q, L_K, OFFSET, b * s_doc, DOC_FIRST, DOC_END, CAUSAL, HAS_DOC,
                                BLOCK_M, BLOCK_N)  # fmt: skip
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            kv_mask = (offs_n[:, None] < L_K) & d_ok
            k = tl.load(K + b * skb + kh * skh + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=kv_mask, other=0.0)
            v = tl.load(V + b * svb + kh * svh + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=kv_mask, other=0.0)
            raw = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            gate = tl.sigmoid(raw * tau + bias)
            valid = _visible_tile(offs_m, offs_n, b, KPM, s_kpm, DOC, s_doc, L_Q, L_K, OFFSET, CAUSAL, HAS_KPM, HAS_DOC)
            gate = tl.where(valid, gate, 0.0)
            dgate = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = dgate * gate * (1.0 - gate)
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
            dtau += tl.sum(ds * raw, axis=1)
            dbias += tl.sum(ds, axis=1)
        tl.store(DQ + q_ptrs, (dq * tau).to(DQ.dtype.element_ty), mask=q_mask)
        tl.store(DTAU + pid_bh * s_part + pid_m, tl.sum(dtau, axis=0))
        tl.store(DBIAS + pid_bh * s_part + pid_m, tl.sum(dbias, axis=0))

    def _row_pointers(q: torch.Tensor, key_padding_mask, documents) -> tuple:
        """(mask, its row stride, document ids, first and end of each token's document, their row stride) from
        `documents` [3, B, Lk] (`ops_common.document_tables`); an absent input is a dummy pointer, stride 0."""
        kpm = key_padding_mask if key_padding_mask is not None else q
        s_kpm = key_padding_mask.stride(0) if key_padding_mask is not None else 0
        if documents is None:
            return kpm, s_kpm, q, q, q, 0
        return kpm, s_kpm, documents[0], documents[1], documents[2], documents.stride(1)

    _MIN_BLOCK_M = 32  # smallest BLOCK_M among the configs: sizes the partial-sum buffers

    def _launch_meta(query: torch.Tensor, causal: bool, key_padding_mask, documents) -> dict:
        return {
            "CAUSAL": bool(causal),
            "HAS_KPM": key_padding_mask is not None,
            "HAS_DOC": documents is not None,
            "PRECISION": "ieee" if query.dtype == torch.float32 else "tf32",
            "BLOCK_D": max(16, triton.next_power_of_2(query.shape[-1])),
        }

    class _PCTAttentionTriton(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value, tau, bias, key_padding_mask, documents, causal):
            q, k, v = query.contiguous(), key.contiguous(), value.contiguous()
            batch, heads, l_q, dim = q.shape
            l_k = k.shape[2]
            out = torch.empty_like(q)
            kpm, s_kpm, doc, doc_first, doc_end, s_doc = _row_pointers(q, key_padding_mask, documents)
            meta = _launch_meta(q, causal, key_padding_mask, documents)

            def grid(c):
                return (batch * heads, triton.cdiv(l_q, c["BLOCK_M"]))

            _pct_fwd_kernel[grid](
                q, k, v, out, tau, bias, kpm, doc, doc_first, doc_end,
                *q.stride(), *k.stride(), *v.stride(), *out.stride(), s_kpm, s_doc,
                heads, heads // k.shape[1], l_q, l_k, dim, l_k - l_q, **meta,
            )  # fmt: skip
            ctx.save_for_backward(q, k, v, tau, bias, key_padding_mask, documents)
            ctx.causal = causal
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, tau, bias, key_padding_mask, documents = ctx.saved_tensors
            do = grad_out.contiguous()
            batch, heads, l_q, dim = q.shape
            l_k = k.shape[2]
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            kpm, s_kpm, doc, doc_first, doc_end, s_doc = _row_pointers(q, key_padding_mask, documents)
            meta = _launch_meta(q, ctx.causal, key_padding_mask, documents)
            common = (*q.stride(), *k.stride(), *v.stride(), s_kpm, s_doc)
            key_heads = k.shape[1]
            sizes = (heads, heads // key_heads, l_q, l_k, dim, l_k - l_q)

            def grid_n(c):  # one program per key-value head and key tile: dk, dv summed over its group in-kernel
                return (batch * key_heads, triton.cdiv(l_k, c["BLOCK_N"]))

            _pct_bwd_dkdv_kernel[grid_n](
                q, k, v, do, dk, dv, tau, bias, kpm, doc, doc_first, doc_end, *common, *sizes, **meta
            )  # fmt: skip

            n_part = triton.cdiv(l_q, _MIN_BLOCK_M)
            dtau_part = torch.zeros(batch * heads, n_part, device=q.device, dtype=torch.float32)
            dbias_part = torch.zeros_like(dtau_part)

            def grid_m(c):
                return (batch * heads, triton.cdiv(l_q, c["BLOCK_M"]))

            _pct_bwd_dq_kernel[grid_m](
                q,
                k,
                v,
                do,
                dq,
                tau,
                bias,
                kpm,
                doc,
                doc_first,
                doc_end,
                dtau_part,
                dbias_part,
                *common,
                dtau_part.stride(0),
                *sizes,
                **meta,
            )
            dtau = dtau_part.view(batch, heads, n_part).sum(dim=(0, 2))
            dbias = dbias_part.view(batch, heads, n_part).sum(dim=(0, 2))
            return dq, dk, dv, dtau, dbias, None, None, None


def pct_attention_triton(
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
    """PCT sigmoid attention by the fused Triton kernels (module doc); CUDA tensors, fp32/fp16/bf16."""
    tau = tau.float().contiguous()
    bias = bias.float().contiguous()
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(torch.int8).contiguous()
    documents = None if document_ids is None else document_tables(document_ids)  # [3, B, Lk]: ids, first, end
    return _PCTAttentionTriton.apply(
        query, key.to(query.dtype), value.to(query.dtype), tau, bias, key_padding_mask, documents, bool(causal)
    )


__all__ = ["HAS_TRITON", "KERNEL_DTYPES", "pct_attention_triton"]
