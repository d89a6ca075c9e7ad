"""Geometric product attention through flash-style Triton kernels (CUDA; the interpreter on CPU in tests).

The function of `ops_gpa_naive.gpa_naive` (kernel "triton"). Per tile the 11 dot products are taken
against sign-permuted loads (`_score_tile`, one loop for every kernel), combined into the score and fed to
an online softmax; only the per-row log-sum-exp is stored, so memory is O(L). The backward has one kernel
for dk, dv, dgamma (per key block) and one for dq (per query block), both through `_score_tile` and
`_score_grad`. Causal masking (query i at absolute position i + Lk - Lq), key padding and documents
(packed rows) are applied in-kernel; a query row with no visible key outputs zeros. Dots take fp32
operands as "tf32x3" on CUDA ("ieee" in the interpreter) and bf16/fp16 operands as they are; the bivector
norm, the softmax statistics and every accumulator are fp32. Grouped keys (Hkv < H): query head h reads
key-value head h // group in the pointer arithmetic, and the dk/dv kernel runs per key-value head, looping over
its group's query heads (dK, dV accumulated in the kernel; dgamma stored per query head), never a repeated copy.
"""

from __future__ import annotations

import torch

from .ops_common import HAS_TRITON, document_tables, tl, triton
from .ops_gpa_base import form_tables

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # inputs the fused kernels take (fp32 statistics)

if HAS_TRITON:
    from .ops_common import key_tile_range, query_tile_range  # defined only where triton imports

    @triton.jit
    def _load_form(base, rows, row_mask, cols, col_mask, dim, form, FORM_INDEX, FORM_SIGN, dtype: tl.constexpr):
        # X^(m)[r, ch*32 + A] = sign[m, A] * X[r, ch*32 + index[m, A]]
        blade = cols % 32
        permuted = cols - blade + tl.load(FORM_INDEX + form * 32 + blade)
        sign = tl.load(FORM_SIGN + form * 32 + blade)
        x = tl.load(
            base + rows[:, None] * dim + permuted[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0
        )
        return (x * sign[None, :]).to(dtype)

    @triton.jit
    def _dot(a, b, PRECISION: tl.constexpr):
        # fp32 operands: "ieee" (interpreter) or "tf32x3" (CUDA: tensor cores at ~fp32 accuracy; the plain
        # FMA path needs more shared memory than a GPU has for these tiles); fp16/bf16: the default
        if PRECISION == "default":
            return tl.dot(a, b)
        else:
            return tl.dot(a, b, input_precision=PRECISION)

    @triton.jit
    def _visible(offs_m, offs_n, n_mask, q_offset, k_len, KEY_VALID, DOCS, batch,
                 IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, HAS_DOCS: tl.constexpr):  # fmt: skip
        # query i (absolute position i + q_offset) sees key j: causal, not padding, one document
        valid = n_mask[None, :] & (offs_m[:, None] >= 0)
        if IS_CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None] + q_offset)
        if HAS_PADDING:
            key_ok = tl.load(KEY_VALID + batch * k_len + offs_n, mask=n_mask, other=0) != 0
            valid = valid & key_ok[None, :]
        if HAS_DOCS:
            q_pos = offs_m + q_offset
            q_doc = tl.load(DOCS + batch * k_len + q_pos, mask=q_pos < k_len, other=-1)
            k_doc = tl.load(DOCS + batch * k_len + offs_n, mask=n_mask, other=-2)
            valid = valid & (q_doc[:, None] == k_doc[None, :])
        return valid

    @triton.jit
    def _form_dot(fixed, moving, PERMUTE_KEYS: tl.constexpr, PRECISION: tl.constexpr):
        # [M, N] products: fixed = queries, moving = key forms (PERMUTE_KEYS) or fixed = keys, moving = query forms
        if PERMUTE_KEYS:
            return _dot(fixed, tl.trans(moving), PRECISION)
        else:
            return _dot(moving, tl.trans(fixed), PRECISION)

    @triton.jit
    def _form_grad(weight, moving, dtype: tl.constexpr, PERMUTE_KEYS: tl.constexpr, PRECISION: tl.constexpr):
        # d/d(fixed) of sum weight * _form_dot(fixed, moving): weight [M, N] x moving
        if PERMUTE_KEYS:
            return _dot(weight.to(dtype), moving, PRECISION)
        else:
            return _dot(tl.trans(weight.to(dtype)), moving, PRECISION)

    @triton.jit
    def _score_tile(fixed, base, rows, row_mask, offs_d, d_mask, dim, gamma, eps, FORM_INDEX, FORM_SIGN,
                    dtype: tl.constexpr, PERMUTE_KEYS: tl.constexpr, BIVECTOR: tl.constexpr,
                    PRECISION: tl.constexpr):  # fmt: skip
        # (score before scaling, norm) [M, N]: <P>_0 + gamma sqrt(sum_C <P>_C^2 + eps), with the 11 forms of the
        # rows at `base` (keys under PERMUTE_KEYS, queries otherwise) against the `fixed` tile
        moving = _load_form(base, rows, row_mask, offs_d, d_mask, dim, 0, FORM_INDEX, FORM_SIGN, dtype)
        score = _form_dot(fixed, moving, PERMUTE_KEYS, PRECISION)
        norm = tl.zeros_like(score)
        if BIVECTOR:
            square = tl.zeros_like(score)
            for form in range(1, 11):
                moving = _load_form(base, rows, row_mask, offs_d, d_mask, dim, form, FORM_INDEX, FORM_SIGN, dtype)
                coefficient = _form_dot(fixed, moving, PERMUTE_KEYS, PRECISION)
                square += coefficient * coefficient
            norm = tl.sqrt(square + eps)
            score = score + gamma * norm
        return score, norm

    @triton.jit
    def _score_grad(ds, norm, fixed, base, rows, row_mask, offs_d, d_mask, dim, gamma, FORM_INDEX, FORM_SIGN,
                    dtype: tl.constexpr, PERMUTE_KEYS: tl.constexpr, BIVECTOR: tl.constexpr,
                    PRECISION: tl.constexpr):  # fmt: skip
        # dL/d(fixed) from dL/d score `ds` [M, N]: d<P>_0 = ds, d<P>_C = ds gamma <P>_C / norm
        moving = _load_form(base, rows, row_mask, offs_d, d_mask, dim, 0, FORM_INDEX, FORM_SIGN, dtype)
        grad = _form_grad(ds, moving, dtype, PERMUTE_KEYS, PRECISION)
        if BIVECTOR:
            ds_norm = ds * gamma / norm
            for form in range(1, 11):
                moving = _load_form(base, rows, row_mask, offs_d, d_mask, dim, form, FORM_INDEX, FORM_SIGN, dtype)
                coefficient = _form_dot(fixed, moving, PERMUTE_KEYS, PRECISION)
                grad += _form_grad(ds_norm * coefficient, moving, dtype, PERMUTE_KEYS, PRECISION)
        return grad

    @triton.jit
    def _gpa_fwd_kernel(
        Q, K, V, GAMMA, FORM_INDEX, FORM_SIGN, O, LSE, KEY_VALID, DOCS, DOC_FIRST, DOC_END,
        num_heads, group, q_len, k_len, dim, q_offset, scale, eps,
        IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, HAS_DOCS: tl.constexpr, BIVECTOR: tl.constexpr,
        PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        gamma = tl.load(GAMMA + bh % num_heads).to(tl.float32)
        batch = bh // num_heads
        kv = bh // group  # (batch, key-value head h // group) of query head h, row-major
        q_base = Q + bh * q_len * dim
        k_base = K + kv * k_len * dim
        v_base = V + kv * k_len * dim
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < q_len
        d_mask = offs_d < dim
        q = tl.load(q_base + offs_m[:, None] * dim + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        dtype = q.dtype

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo, hi = key_tile_range(pid_m, q_len, k_len, q_offset, batch * k_len, DOC_FIRST, DOC_END,
                                IS_CAUSAL, HAS_DOCS, BLOCK_M, BLOCK_N)  # fmt: skip
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            n_mask = offs_n < k_len
            s, _ = _score_tile(q, k_base, offs_n, n_mask, offs_d, d_mask, dim, gamma, eps, FORM_INDEX, FORM_SIGN,
                               dtype, True, BIVECTOR, PRECISION)  # fmt: skip
            s = s * scale
            valid = _visible(offs_m, offs_n, n_mask, q_offset, k_len, KEY_VALID, DOCS, batch,
                             IS_CAUSAL, HAS_PADDING, HAS_DOCS)  # fmt: skip
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key so far
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                v_base + offs_n[:, None] * dim + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0
            )
            acc = acc * alpha[:, None] + _dot(p.to(dtype), v, PRECISION)
            m_i = m_new
        empty = l_i == 0.0  # no visible key: output 0, lse = +inf (every p of the row is 0 in the backward)
        l_i = tl.where(empty, 1.0, l_i)
        out = acc / l_i[:, None]
        tl.store(
            O + bh * q_len * dim + offs_m[:, None] * dim + offs_d[None, :],
            out.to(dtype),
            mask=m_mask[:, None] & d_mask[None, :],
        )
        tl.store(LSE + bh * q_len + offs_m, tl.where(empty, float("inf"), m_i + tl.log(l_i)), mask=m_mask)

    @triton.jit
    def _gpa_bwd_dkdv_kernel(
        Q, K, V, GAMMA, FORM_INDEX, QUERY_SIGN, DO, LSE, DELTA, DK, DV, DGAMMA, KEY_VALID, DOCS, DOC_FIRST, DOC_END,
        num_heads, group, q_len, k_len, dim, q_offset, scale, eps, num_key_blocks,
        IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, HAS_DOCS: tl.constexpr, BIVECTOR: tl.constexpr,
        PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        # s_m = Q'^(m) . K with Q'^(m)[B] = sign_m[B ^ C_m] Q[B ^ C_m], so dK = sum_m ds_m^T Q'^(m).
        # One program per (batch, key-value head kv, key tile): its group's query heads kv * group + g in turn, dK and
        # dV summed over them here.
        pid_n = tl.program_id(0)
        kv = tl.program_id(1)
        batch = kv // (num_heads // group)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        n_mask = offs_n < k_len
        d_mask = offs_d < dim
        kv_offsets = kv * k_len * dim + offs_n[:, None] * dim + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0)
        dtype = k.dtype
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        lo, hi = query_tile_range(pid_n, q_len, k_len, q_offset, batch * k_len, DOC_FIRST, DOC_END,
                                  IS_CAUSAL, HAS_DOCS, BLOCK_M, BLOCK_N)  # fmt: skip
        for g in range(group):
            bh = kv * group + g  # (batch, query head), row-major
            gamma = tl.load(GAMMA + bh % num_heads).to(tl.float32)
            q_base = Q + bh * q_len * dim
            do_base = DO + bh * q_len * dim
            dgamma = tl.zeros([BLOCK_N], tl.float32)
            for start_m in range(lo, hi, BLOCK_M):
                offs_m = start_m + tl.arange(0, BLOCK_M)
                m_mask = offs_m < q_len
                s, norm = _score_tile(k, q_base, offs_m, m_mask, offs_d, d_mask, dim, gamma, eps, FORM_INDEX,
                                      QUERY_SIGN, dtype, False, BIVECTOR, PRECISION)  # fmt: skip
                s = s * scale
                valid = m_mask[:, None] & _visible(offs_m, offs_n, n_mask, q_offset, k_len, KEY_VALID, DOCS, batch,
                                                   IS_CAUSAL, HAS_PADDING, HAS_DOCS)  # fmt: skip
                lse = tl.load(LSE + bh * q_len + offs_m, mask=m_mask, other=0.0)
                p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
                do = tl.load(
                    do_base + offs_m[:, None] * dim + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0
                )
                delta = tl.load(DELTA + bh * q_len + offs_m, mask=m_mask, other=0.0)
                dv += _dot(tl.trans(p.to(dtype)), do, PRECISION)
                dp = _dot(do, tl.trans(v), PRECISION)
                ds = p * (dp - delta[:, None]) * scale  # dL/d(score before scaling)
                if BIVECTOR:
                    dgamma += tl.sum(ds * norm, 0)
                dk += _score_grad(ds, norm, k, q_base, offs_m, m_mask, offs_d, d_mask, dim, gamma, FORM_INDEX,
                                  QUERY_SIGN, dtype, False, BIVECTOR, PRECISION)  # fmt: skip
            tl.store(DGAMMA + bh * num_key_blocks + pid_n, tl.sum(dgamma, 0))
        tl.store(DK + kv_offsets, dk.to(dtype), mask=kv_mask)
        tl.store(DV + kv_offsets, dv.to(dtype), mask=kv_mask)

    @triton.jit
    def _gpa_bwd_dq_kernel(
        Q, K, V, GAMMA, FORM_INDEX, FORM_SIGN, DO, LSE, DELTA, DQ, KEY_VALID, DOCS, DOC_FIRST, DOC_END,
        num_heads, group, q_len, k_len, dim, q_offset, scale, eps,
        IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, HAS_DOCS: tl.constexpr, BIVECTOR: tl.constexpr,
        PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        # dQ = sum_j ds0_ij K^(0)_j + sum_m ds_m_ij K^(m)_j
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        gamma = tl.load(GAMMA + bh % num_heads).to(tl.float32)
        batch = bh // num_heads
        kv = bh // group  # (batch, key-value head h // group) of query head h, row-major
        k_base = K + kv * k_len * dim
        v_base = V + kv * k_len * dim
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < q_len
        d_mask = offs_d < dim
        q_offsets = bh * q_len * dim + offs_m[:, None] * dim + offs_d[None, :]
        q_mask = m_mask[:, None] & d_mask[None, :]
        q = tl.load(Q + q_offsets, mask=q_mask, other=0.0)
        do = tl.load(DO + q_offsets, mask=q_mask, other=0.0)
        dtype = q.dtype
        lse = tl.load(LSE + bh * q_len + offs_m, mask=m_mask, other=0.0)
        delta = tl.load(DELTA + bh * q_len + offs_m, mask=m_mask, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo, hi = key_tile_range(pid_m, q_len, k_len, q_offset, batch * k_len, DOC_FIRST, DOC_END,
                                IS_CAUSAL, HAS_DOCS, BLOCK_M, BLOCK_N)  # fmt: skip
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            n_mask = offs_n < k_len
            s, norm = _score_tile(q, k_base, offs_n, n_mask, offs_d, d_mask, dim, gamma, eps, FORM_INDEX, FORM_SIGN,
                                  dtype, True, BIVECTOR, PRECISION)  # fmt: skip
            s = s * scale
            valid = _visible(offs_m, offs_n, n_mask, q_offset, k_len, KEY_VALID, DOCS, batch,
                             IS_CAUSAL, HAS_PADDING, HAS_DOCS)  # fmt: skip
            p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
            v = tl.load(
                v_base + offs_n[:, None] * dim + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0
            )
            dp = _dot(do, tl.trans(v), PRECISION)
            ds = p * (dp - delta[:, None]) * scale
            dq += _score_grad(ds, norm, q, k_base, offs_n, n_mask, offs_d, d_mask, dim, gamma, FORM_INDEX, FORM_SIGN,
                              dtype, True, BIVECTOR, PRECISION)  # fmt: skip
        tl.store(DQ + q_offsets, dq.to(dtype), mask=q_mask)


def _precision(x: torch.Tensor) -> str:
    if x.dtype != torch.float32:
        return "default"
    return "tf32x3" if x.is_cuda else "ieee"


def _block_sizes(dim: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, num_warps): one fixed config per head size (no autotuning); the sm_90
    compile test checks the largest kernel's shared memory against the H100/H200 limit."""
    block_d = max(32, triton.next_power_of_2(dim))
    if device.type != "cuda":
        return 16, 16, block_d, 4
    if block_d <= 64:
        return 64, 32, block_d, 4
    if block_d <= 256:
        return 32, 32, block_d, 4
    return 16, 16, block_d, 4


class _GPATritonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, gamma, causal, key_valid, documents, scaling, eps, bivector):
        batch, heads, q_len, dim = query.shape
        k_len = key.shape[2]
        q, k, v = query.contiguous(), key.contiguous(), value.contiguous()
        gamma32 = gamma.detach().float().contiguous()
        index, sign, _ = form_tables(q.device)
        index = index.to(torch.int32).contiguous()
        out = torch.empty_like(q)
        lse = torch.empty(batch * heads, q_len, device=q.device, dtype=torch.float32)
        block_m, block_n, block_d, warps = _block_sizes(dim, q.device)
        flags = (causal, key_valid is not None, documents is not None)
        # a flag that is off still takes a pointer
        valid = key_valid if key_valid is not None else torch.zeros(1, dtype=torch.int8, device=q.device)
        docs = documents if documents is not None else torch.zeros(3, 1, dtype=torch.int32, device=q.device)
        grid = (triton.cdiv(q_len, block_m), batch * heads)
        _gpa_fwd_kernel[grid](
            q, k, v, gamma32, index, sign, out, lse, valid, docs[0], docs[1], docs[2],
            heads, heads // k.shape[1], q_len, k_len, dim, k_len - q_len, scaling, eps,
            IS_CAUSAL=flags[0], HAS_PADDING=flags[1], HAS_DOCS=flags[2], BIVECTOR=bivector, PRECISION=_precision(q),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=warps,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, gamma, out, lse, valid, docs)
        ctx.settings = (flags, scaling, eps, bivector)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, gamma, out, lse, valid, docs = ctx.saved_tensors
        flags, scaling, eps, bivector = ctx.settings
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        grad_out = grad_out.contiguous()
        delta = (grad_out.float() * out.float()).sum(-1).reshape(batch * heads, q_len).contiguous()
        gamma32 = gamma.detach().float().contiguous()
        index, sign, query_sign = form_tables(q.device)
        index = index.to(torch.int32).contiguous()
        block_m, block_n, block_d, warps = _block_sizes(dim, q.device)
        num_key_blocks = triton.cdiv(k_len, block_n)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dgamma = torch.zeros(batch * heads, num_key_blocks, device=q.device, dtype=torch.float32)
        common = dict(
            IS_CAUSAL=flags[0],
            HAS_PADDING=flags[1],
            HAS_DOCS=flags[2],
            BIVECTOR=bivector,
            PRECISION=_precision(q),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            num_warps=warps,
        )
        group = heads // k.shape[1]
        # one program per key-value head and key block: dK, dV summed over its query heads in the kernel
        _gpa_bwd_dkdv_kernel[(num_key_blocks, batch * k.shape[1])](
            q, k, v, gamma32, index, query_sign, grad_out, lse, delta, dk, dv, dgamma,
            valid, docs[0], docs[1], docs[2],
            heads, group, q_len, k_len, dim, k_len - q_len, scaling, eps, num_key_blocks, **common,
        )  # fmt: skip
        _gpa_bwd_dq_kernel[(triton.cdiv(q_len, block_m), batch * heads)](
            q, k, v, gamma32, index, sign, grad_out, lse, delta, dq, valid, docs[0], docs[1], docs[2],
            heads, group, q_len, k_len, dim, k_len - q_len, scaling, eps, **common,
        )  # fmt: skip
        grad_gamma = dgamma.view(batch, heads, num_key_blocks).sum((0, 2)).to(gamma.dtype) if bivector else None
        return dq, dk, dv, grad_gamma, None, None, None, None, None, None


def gpa_triton(
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
    """`ops_gpa_base.GPAKernel` through the fused Triton kernels; output in the query's dtype (fp32, fp16 or bf16)."""
    key_valid = None
    if key_padding_mask is not None and not bool(key_padding_mask.all()):
        key_valid = key_padding_mask.to(device=query.device, dtype=torch.bool).to(torch.int8).contiguous()
    documents = None if document_ids is None else document_tables(document_ids)  # [3, B, Lk]: ids, first, end
    return _GPATritonFunction.apply(query, key, value, gamma, causal, key_valid, documents, scaling, eps, bivector)


__all__ = ["KERNEL_DTYPES", "gpa_triton"]
