"""Geometric product attention (GPA, SPEC §4): reference op, Triton flash kernel, SDPA scalar path.

Query, key and value of one head are `c` Cl(4,1) multivectors, flattened to `[B, H, L, D]` with
`D = 32 c` and column `ch * 32 + blade mask`. With P_ij = sum_ch Q_i,ch ~K_j,ch:

    S_ij = ( <P_ij>_0 + gamma_h * sqrt(sum_C <P_ij>_C^2 + eps) ) / sqrt(D),   C over the 10 bivectors
    out_i = sum_j softmax_j(S_ij) V_j

Each coefficient <P>_C is a bilinear form with a signed permutation,
<P>_C = sum_A Q_A sign_C[A] K_{A xor C} (`CliffordAlgebra.bilinear_forms`), so a score needs 1 + 10
dot products over D. The paths:

* `gpa_reference` - the formula materialised: [B, H, Lq, Lk, 11] products. Readable, any mask, returns
  the attention weights. O(L^2) memory.
* `gpa_triton` - flash-style Triton kernels (forward; backward for dq, dk, dv, dgamma). Per tile the 11
  dot products are taken against sign-permuted key loads, combined, and fed to an online softmax;
  only the per-row log-sum-exp is stored, so memory is O(L). Causal masking and
  key padding are applied in-kernel (no dense mask).
* `gpa_scalar_sdpa` - gamma = 0 (scalar part only): <P>_0 = Q . (sign_0 * K), plain SDPA.

`geometric_product_attention` is the one dispatch function.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F

from .clifford_algebra import BIVECTOR_MASKS, NUM_BLADES, conformal_algebra

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # remote-code copies and CPU-only installs run the reference
    triton = None
    tl = None
    HAS_TRITON = False

NUM_FORMS = 1 + len(BIVECTOR_MASKS)  # scalar + 10 bivector coefficients


@cache
def _form_tables_cpu() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """index[m, A] = A xor C_m, sign[m, A] (key side), and sign[m, A xor C_m] (query side)."""
    index, sign = conformal_algebra().bilinear_forms(torch.tensor((0,) + BIVECTOR_MASKS, device="cpu"))
    query_sign = torch.gather(sign, 1, index)
    return index, sign.float(), query_sign.float()


def form_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    index, sign, query_sign = _form_tables_cpu()
    return index.to(device), sign.to(device), query_sign.to(device)


def _check_shapes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    if query.shape[-1] % NUM_BLADES != 0:
        raise ValueError(f"GPA head dim must be a multiple of 32 (multivector channels); got {query.shape[-1]}.")
    if key.shape != value.shape or query.shape[:2] != key.shape[:2] or query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"GPA expects query [B, H, Lq, D] and key/value [B, H, Lk, D]; got {tuple(query.shape)}, "
            f"{tuple(key.shape)}, {tuple(value.shape)}."
        )


def gpa_score_products(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """[B, H, Lq, Lk, 11]: <P_ij>_0 and the 10 bivector coefficients of P_ij = sum_ch Q_i ~K_j."""
    index, sign, _ = form_tables(query.device)
    batch, heads, k_len, dim = key.shape
    channels = dim // NUM_BLADES
    k = key.reshape(batch, heads, k_len, channels, NUM_BLADES)
    k_forms = k[..., index] * sign.to(key.dtype)  # [B, H, Lk, c, 11, 32]
    q = query.reshape(*query.shape[:3], channels, NUM_BLADES)
    return torch.einsum("bhicx,bhjcmx->bhijm", q, k_forms)


def gpa_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gamma: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scaling: float | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPA as written. `attention_mask`: bool [B, 1|H, Lq, Lk] (True = attend). Returns (out, weights)."""
    _check_shapes(query, key, value)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32
    products = gpa_score_products(query.to(compute), key.to(compute))
    scalar, bivector = products[..., 0], products[..., 1:]
    norm = torch.sqrt(bivector.pow(2).sum(-1) + eps)
    scores = (scalar + gamma.to(compute).view(1, -1, 1, 1) * norm) * scaling
    q_len, k_len = query.shape[2], key.shape[2]
    if is_causal:
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
        scores = scores.masked_fill(~causal, float("-inf"))
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights.to(value.dtype), value)
    return out, weights


def gpa_scalar_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scaling: float | None = None,
) -> torch.Tensor:
    """gamma = 0: S = <Q ~K>_0 / sqrt(D) = Q . (sign_0 * K) / sqrt(D) through SDPA."""
    _check_shapes(query, key, value)
    _, sign, _ = form_tables(query.device)
    channels = key.shape[-1] // NUM_BLADES
    signed_key = key * sign[0].to(key.dtype).repeat(channels)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    return F.scaled_dot_product_attention(
        query, signed_key, value, attn_mask=attention_mask, is_causal=is_causal, scale=scaling
    )


# --------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------

if HAS_TRITON:

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
    def _visible(offs_m, offs_n, n_mask, q_offset, k_len, KEY_VALID, batch, first_valid,
                 IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr):  # fmt: skip
        # query i (absolute position i + q_offset) sees key j: causal, not padding; a row with no such key
        # sees every key (build_attention_mask's rule, so softmax never meets an empty row)
        valid = n_mask[None, :] & (offs_m[:, None] >= 0)
        if IS_CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None] + q_offset)
        if HAS_PADDING:
            key_ok = tl.load(KEY_VALID + batch * k_len + offs_n, mask=n_mask, other=0) != 0
            if IS_CAUSAL:
                empty = offs_m + q_offset < first_valid
            else:
                empty = (offs_m * 0 + k_len - 1) < first_valid
            valid = (valid & key_ok[None, :]) | (empty[:, None] & n_mask[None, :])
        return valid

    @triton.jit
    def _gpa_fwd_kernel(
        Q, K, V, GAMMA, FORM_INDEX, FORM_SIGN, O, LSE, KEY_VALID, FIRST_VALID,
        num_heads, q_len, k_len, dim, q_offset, scale, eps,
        IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        gamma = tl.load(GAMMA + bh % num_heads).to(tl.float32)
        batch = bh // num_heads
        first_valid = 0
        if HAS_PADDING:
            first_valid = tl.load(FIRST_VALID + batch)
        q_base = Q + bh * q_len * dim
        k_base = K + bh * k_len * dim
        v_base = V + bh * k_len * dim
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < q_len
        d_mask = offs_d < dim
        q = tl.load(q_base + offs_m[:, None] * dim + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        dtype = q.dtype

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        hi = k_len
        if IS_CAUSAL:
            hi = tl.minimum(k_len, q_offset + (pid_m + 1) * BLOCK_M)
            if HAS_PADDING:  # rows opened to every key
                hi = tl.where(pid_m * BLOCK_M + q_offset < first_valid, k_len, hi)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            n_mask = offs_n < k_len
            k0 = _load_form(k_base, offs_n, n_mask, offs_d, d_mask, dim, 0, FORM_INDEX, FORM_SIGN, dtype)
            scalar = _dot(q, tl.trans(k0), PRECISION)
            square = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for form in range(1, 11):
                km = _load_form(k_base, offs_n, n_mask, offs_d, d_mask, dim, form, FORM_INDEX, FORM_SIGN, dtype)
                coefficient = _dot(q, tl.trans(km), PRECISION)
                square += coefficient * coefficient
            s = (scalar + gamma * tl.sqrt(square + eps)) * scale
            valid = _visible(offs_m, offs_n, n_mask, q_offset, k_len, KEY_VALID, batch, first_valid,
                             IS_CAUSAL, HAS_PADDING)  # fmt: skip
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with no visible key for a row
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                v_base + offs_n[:, None] * dim + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0
            )
            acc = acc * alpha[:, None] + _dot(p.to(dtype), v, PRECISION)
            m_i = m_new
        l_i = tl.where(l_i == 0.0, 1.0, l_i)  # rows past q_len only (every real row sees a key)
        out = acc / l_i[:, None]
        tl.store(
            O + bh * q_len * dim + offs_m[:, None] * dim + offs_d[None, :],
            out.to(dtype),
            mask=m_mask[:, None] & d_mask[None, :],
        )  # noqa: E501
        tl.store(LSE + bh * q_len + offs_m, m_i + tl.log(l_i), mask=m_mask)

    @triton.jit
    def _gpa_bwd_dkdv_kernel(
        Q, K, V, GAMMA, FORM_INDEX, FORM_SIGN, QUERY_SIGN, DO, LSE, DELTA, DK, DV, DGAMMA, KEY_VALID, FIRST_VALID,
        num_heads, q_len, k_len, dim, q_offset, scale, eps, num_key_blocks,
        IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        # s_m = Q'^(m) . K with Q'^(m)[B] = sign_m[B ^ C_m] Q[B ^ C_m], so dK = sum_m ds_m^T Q'^(m).
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
        gamma = tl.load(GAMMA + bh % num_heads).to(tl.float32)
        batch = bh // num_heads
        first_valid = 0
        if HAS_PADDING:
            first_valid = tl.load(FIRST_VALID + batch)
        q_base = Q + bh * q_len * dim
        do_base = DO + bh * q_len * dim
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        n_mask = offs_n < k_len
        d_mask = offs_d < dim
        kv_offsets = bh * k_len * dim + offs_n[:, None] * dim + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0)
        dtype = k.dtype
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dgamma = tl.zeros([BLOCK_N], tl.float32)
        lo = 0
        if IS_CAUSAL:
            lo = tl.maximum(pid_n * BLOCK_N - q_offset, 0) // BLOCK_M * BLOCK_M
            if HAS_PADDING:  # rows opened to every key
                lo = tl.where(first_valid > q_offset, 0, lo)
        for start_m in range(lo, q_len, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            m_mask = offs_m < q_len
            scalar = _dot(
                _load_form(q_base, offs_m, m_mask, offs_d, d_mask, dim, 0, FORM_INDEX, QUERY_SIGN, dtype),
                tl.trans(k),
                PRECISION,
            )
            square = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for form in range(1, 11):
                qm = _load_form(q_base, offs_m, m_mask, offs_d, d_mask, dim, form, FORM_INDEX, QUERY_SIGN, dtype)
                coefficient = _dot(qm, tl.trans(k), PRECISION)
                square += coefficient * coefficient
            norm = tl.sqrt(square + eps)
            s = (scalar + gamma * norm) * scale
            valid = m_mask[:, None] & _visible(offs_m, offs_n, n_mask, q_offset, k_len, KEY_VALID, batch, first_valid,
                                               IS_CAUSAL, HAS_PADDING)  # fmt: skip
            lse = tl.load(LSE + bh * q_len + offs_m, mask=m_mask, other=0.0)
            p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
            do = tl.load(
                do_base + offs_m[:, None] * dim + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0
            )  # noqa: E501
            delta = tl.load(DELTA + bh * q_len + offs_m, mask=m_mask, other=0.0)
            dv += _dot(tl.trans(p.to(dtype)), do, PRECISION)
            dp = _dot(do, tl.trans(v), PRECISION)
            ds = p * (dp - delta[:, None]) * scale  # dL/d(score before scaling)
            dgamma += tl.sum(ds * norm, 0)
            q0 = _load_form(q_base, offs_m, m_mask, offs_d, d_mask, dim, 0, FORM_INDEX, QUERY_SIGN, dtype)
            dk += _dot(tl.trans(ds.to(dtype)), q0, PRECISION)
            ds_norm = ds * gamma / norm
            for form in range(1, 11):
                qm = _load_form(q_base, offs_m, m_mask, offs_d, d_mask, dim, form, FORM_INDEX, QUERY_SIGN, dtype)
                coefficient = _dot(qm, tl.trans(k), PRECISION)
                dk += _dot(tl.trans((ds_norm * coefficient).to(dtype)), qm, PRECISION)
        tl.store(DK + kv_offsets, dk.to(dtype), mask=kv_mask)
        tl.store(DV + kv_offsets, dv.to(dtype), mask=kv_mask)
        tl.store(DGAMMA + bh * num_key_blocks + pid_n, tl.sum(dgamma, 0))

    @triton.jit
    def _gpa_bwd_dq_kernel(
        Q, K, V, GAMMA, FORM_INDEX, FORM_SIGN, DO, LSE, DELTA, DQ, KEY_VALID, FIRST_VALID,
        num_heads, q_len, k_len, dim, q_offset, scale, eps,
        IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        # dQ = sum_j ds0_ij K^(0)_j + sum_m ds_m_ij K^(m)_j
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        gamma = tl.load(GAMMA + bh % num_heads).to(tl.float32)
        batch = bh // num_heads
        first_valid = 0
        if HAS_PADDING:
            first_valid = tl.load(FIRST_VALID + batch)
        k_base = K + bh * k_len * dim
        v_base = V + bh * k_len * dim
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
        hi = k_len
        if IS_CAUSAL:
            hi = tl.minimum(k_len, q_offset + (pid_m + 1) * BLOCK_M)
            if HAS_PADDING:  # rows opened to every key
                hi = tl.where(pid_m * BLOCK_M + q_offset < first_valid, k_len, hi)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            n_mask = offs_n < k_len
            k0 = _load_form(k_base, offs_n, n_mask, offs_d, d_mask, dim, 0, FORM_INDEX, FORM_SIGN, dtype)
            scalar = _dot(q, tl.trans(k0), PRECISION)
            square = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for form in range(1, 11):
                km = _load_form(k_base, offs_n, n_mask, offs_d, d_mask, dim, form, FORM_INDEX, FORM_SIGN, dtype)
                coefficient = _dot(q, tl.trans(km), PRECISION)
                square += coefficient * coefficient
            norm = tl.sqrt(square + eps)
            s = (scalar + gamma * norm) * scale
            valid = _visible(offs_m, offs_n, n_mask, q_offset, k_len, KEY_VALID, batch, first_valid,
                             IS_CAUSAL, HAS_PADDING)  # fmt: skip
            p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
            v = tl.load(
                v_base + offs_n[:, None] * dim + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0
            )
            dp = _dot(do, tl.trans(v), PRECISION)
            ds = p * (dp - delta[:, None]) * scale
            dq += _dot(ds.to(dtype), k0, PRECISION)
            ds_norm = ds * gamma / norm
            for form in range(1, 11):
                km = _load_form(k_base, offs_n, n_mask, offs_d, d_mask, dim, form, FORM_INDEX, FORM_SIGN, dtype)
                coefficient = _dot(q, tl.trans(km), PRECISION)
                dq += _dot((ds_norm * coefficient).to(dtype), km, PRECISION)
        tl.store(DQ + q_offsets, dq.to(dtype), mask=q_mask)


def _precision(x: torch.Tensor) -> str:
    if x.dtype != torch.float32:
        return "default"
    return "tf32x3" if x.is_cuda else "ieee"


def _block_sizes(dim: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, num_warps): one fixed config per head size (no autotuning).

    Compiled for sm_90 (Triton 3.9, fp32/tf32x3 and bf16/fp16) the largest kernel needs <= 197 KiB of shared
    memory with these tiles (limit 227 KiB)."""
    block_d = max(32, triton.next_power_of_2(dim))
    if device.type != "cuda":
        return 16, 16, block_d, 4
    if block_d <= 64:
        return 64, 32, block_d, 4
    if block_d <= 256:
        return 32, 32, block_d, 4
    return 16, 16, block_d, 4


def _padding_tables(
    key_padding_mask: torch.Tensor | None, batch: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 key validity [B, Lk] and the first valid key per sequence (Lk if none), for the kernels."""
    if key_padding_mask is None:
        empty = torch.zeros(batch, 1, dtype=torch.int8, device=device)
        return empty, torch.zeros(batch, dtype=torch.int32, device=device)
    valid = key_padding_mask.to(device=device, dtype=torch.bool)
    length = valid.shape[1]
    first = torch.where(valid.any(-1), valid.int().argmax(-1), torch.full_like(valid[:, 0], length, dtype=torch.long))
    return valid.to(torch.int8).contiguous(), first.to(torch.int32).contiguous()


class _GPATritonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, gamma, is_causal, scaling, eps, key_padding_mask):  # type: ignore[override]
        batch, heads, q_len, dim = query.shape
        k_len = key.shape[2]
        q = query.contiguous()
        k = key.contiguous()
        v = value.contiguous()
        gamma32 = gamma.detach().float().contiguous()
        index, sign, query_sign = form_tables(q.device)
        index = index.to(torch.int32).contiguous()
        out = torch.empty_like(q)
        lse = torch.empty(batch * heads, q_len, device=q.device, dtype=torch.float32)
        block_m, block_n, block_d, warps = _block_sizes(dim, q.device)
        key_valid, first_valid = _padding_tables(key_padding_mask, batch, q.device)
        grid = (triton.cdiv(q_len, block_m), batch * heads)
        _gpa_fwd_kernel[grid](
            q, k, v, gamma32, index, sign, out, lse, key_valid, first_valid,
            heads, q_len, k_len, dim, k_len - q_len, scaling, eps,
            IS_CAUSAL=is_causal, HAS_PADDING=key_padding_mask is not None, PRECISION=_precision(q),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=warps,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, gamma, out, lse, key_valid, first_valid)
        ctx.has_padding = key_padding_mask is not None
        ctx.settings = (is_causal, scaling, eps)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, gamma, out, lse, key_valid, first_valid = ctx.saved_tensors
        is_causal, scaling, eps = ctx.settings
        batch, heads, q_len, dim = q.shape
        k_len = k.shape[2]
        grad_out = grad_out.contiguous()
        delta = (grad_out.float() * out.float()).sum(-1).reshape(batch * heads, q_len).contiguous()
        gamma32 = gamma.detach().float().contiguous()
        index, sign, query_sign = form_tables(q.device)
        index = index.to(torch.int32).contiguous()
        block_m, block_n, block_d, warps = _block_sizes(dim, q.device)
        num_key_blocks = triton.cdiv(k_len, block_n)
        dq = torch.empty_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        dgamma = torch.zeros(batch * heads, num_key_blocks, device=q.device, dtype=torch.float32)
        common = dict(
            IS_CAUSAL=is_causal,
            HAS_PADDING=ctx.has_padding,
            PRECISION=_precision(q),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
        )
        _gpa_bwd_dkdv_kernel[(num_key_blocks, batch * heads)](
            q, k, v, gamma32, index, sign, query_sign, grad_out, lse, delta, dk, dv, dgamma, key_valid, first_valid,
            heads, q_len, k_len, dim, k_len - q_len, scaling, eps, num_key_blocks,
            BLOCK_D=block_d, num_warps=warps, **common,
        )  # fmt: skip
        _gpa_bwd_dq_kernel[(triton.cdiv(q_len, block_m), batch * heads)](
            q, k, v, gamma32, index, sign, grad_out, lse, delta, dq, key_valid, first_valid,
            heads, q_len, k_len, dim, k_len - q_len, scaling, eps,
            BLOCK_D=block_d, num_warps=warps, **common,
        )  # fmt: skip
        grad_gamma = dgamma.view(batch, heads, num_key_blocks).sum((0, 2)).to(gamma.dtype)
        return dq, dk, dv, grad_gamma.view_as(gamma), None, None, None, None


def gpa_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gamma: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scaling: float | None = None,
    eps: float = 1e-6,
    key_padding_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None]:
    """GPA through the fused Triton kernels (the signature of `gpa_reference`; weights are not formed).

    Masking is `is_causal` (query i at absolute position i + Lk - Lq) and an optional `key_padding_mask`
    [B, Lk] (True = real token) instead of a dense `attention_mask`; a query row that sees no key then
    attends to every key, exactly as `build_attention_mask` makes the reference do."""
    if not HAS_TRITON:
        raise RuntimeError("gpa_triton needs `triton`; install it or use the reference (gpa_kernel='reference').")
    if attention_mask is not None:
        raise ValueError("gpa_triton takes is_causal and key_padding_mask; pass attention_mask=None.")
    _check_shapes(query, key, value)
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (key.shape[0], key.shape[2]):
        raise ValueError(f"key_padding_mask must be [B, Lk] = {(key.shape[0], key.shape[2])}.")
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    out = _GPATritonFunction.apply(query, key, value, gamma, bool(is_causal), scaling, float(eps), key_padding_mask)
    return out, None


GPA_KERNELS = ("auto", "reference", "triton")


def geometric_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    gamma: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scaling: float | None = None,
    eps: float = 1e-6,
    kernel: str = "auto",
    scalar_only: bool = False,
    output_weights: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dispatch: `scalar_only` -> SDPA; `kernel="auto"` -> Triton for CUDA tensors when Triton is importable,
    else the reference; `"reference"` forces the reference, `"triton"` the kernel; attention weights
    (`output_weights`) need the reference.

    The reference takes the dense boolean `attention_mask` [B, 1, Lq, Lk] and `is_causal`. The kernel takes
    causality and 2-D key padding instead: pass `causal` (and `key_padding_mask`, [B, Lk]) when
    `attention_mask` was built by `build_attention_mask(key_padding_mask, ..., causal)`; any other dense
    mask takes the reference."""
    if kernel not in GPA_KERNELS:
        raise ValueError(f"GPA kernel {kernel!r} is unknown; use one of {list(GPA_KERNELS)}.")
    if output_weights or kernel == "reference":
        return gpa_reference(query, key, value, gamma, attention_mask, is_causal, scaling, eps)
    if scalar_only:
        return gpa_scalar_sdpa(query, key, value, attention_mask, is_causal, scaling), None
    if kernel == "triton" or (HAS_TRITON and query.is_cuda):
        if attention_mask is None:
            return gpa_triton(query, key, value, gamma, None, is_causal, scaling, eps)
        if causal is not None:
            padding = None if key_padding_mask is None or bool(key_padding_mask.all()) else key_padding_mask
            return gpa_triton(query, key, value, gamma, None, causal, scaling, eps, key_padding_mask=padding)
    return gpa_reference(query, key, value, gamma, attention_mask, is_causal, scaling, eps)


__all__ = [
    "GPA_KERNELS",
    "HAS_TRITON",
    "geometric_product_attention",
    "gpa_reference",
    "gpa_scalar_sdpa",
    "gpa_score_products",
    "gpa_triton",
]
