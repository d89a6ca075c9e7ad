"""Statistics of the evidence suite: Welch's t-test, the exact permutation test, the Holm correction, a bootstrap
over seeds x evaluation examples, and the compact per-example correctness bitstrings stored in the result rows.

Pure Python + numpy (no scipy at run time); tests/test_ablation_evidence.py checks the numbers against scipy
where it is installed and against hand-computed values.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

ALPHA = 0.05  # family-wise error rate of a table (Holm)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz, Numerical Recipes 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for numerator in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def welch(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Welch's unequal-variance t-test of mean(a) - mean(b): t, Welch-Satterthwaite df, two-sided p.

    Both samples need >= 2 values (else p is nan). With zero variance in both, p is 1 for equal means and 0
    otherwise (the values are deterministic)."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        return {"t": math.nan, "df": math.nan, "p": math.nan, "diff": math.nan}
    ma, mb = float(np.mean(a)), float(np.mean(b))
    va, vb = float(np.var(a, ddof=1)) / na, float(np.var(b, ddof=1)) / nb
    if va + vb == 0.0:
        return {"t": math.nan, "df": math.nan, "p": 1.0 if ma == mb else 0.0, "diff": ma - mb}
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    return {"t": t, "df": df, "p": t_two_sided_p(t, df), "diff": ma - mb}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1); nan stays nan and is not counted."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m = len(order)
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def encode_bits(hits: Sequence[bool] | np.ndarray) -> str:
    """Per-answer correctness as a hex string (numpy.packbits, big-endian bit order); length kept separately."""
    return np.packbits(np.asarray(hits, dtype=bool)).tobytes().hex()


def decode_bits(text: str, count: int) -> np.ndarray:
    """Inverse of `encode_bits`: the first `count` bits as a bool array."""
    return np.unpackbits(np.frombuffer(bytes.fromhex(text), dtype=np.uint8))[:count].astype(bool)


def bootstrap_diff(
    a: Sequence[np.ndarray], b: Sequence[np.ndarray], samples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of mean(a) - mean(b) resampling seeds and evaluation examples.

    `a`, `b`: one [examples, answers per example] array per seed (0/1 or per-example errors). Every seed of a
    variant is evaluated on the same examples, so one resample of example indices is shared by both sides
    (paired), and seeds are resampled within each side independently."""
    rng = np.random.default_rng(seed)
    sa, sb = np.stack([np.asarray(x, float) for x in a]), np.stack([np.asarray(x, float) for x in b])
    if sa.shape[1:] != sb.shape[1:]:
        raise ValueError(f"bootstrap_diff: evaluation shapes differ ({sa.shape[1:]} vs {sb.shape[1:]}).")
    # per (seed, example) means; the answers of an example stay together (they share one context)
    ea, eb = sa.reshape(len(sa), sa.shape[1], -1).mean(-1), sb.reshape(len(sb), sb.shape[1], -1).mean(-1)
    examples = ea.shape[1]
    diffs = np.empty(samples)
    for k in range(samples):
        idx = rng.integers(0, examples, examples)
        seeds_a, seeds_b = rng.integers(0, len(ea), len(ea)), rng.integers(0, len(eb), len(eb))
        diffs[k] = ea[seeds_a][:, idx].mean() - eb[seeds_b][:, idx].mean()
    tail = (1.0 - level) / 2.0
    return float(np.quantile(diffs, tail)), float(np.quantile(diffs, 1.0 - tail))


def permutation_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Exact two-sided permutation test of mean(a) - mean(b): every split of the pooled values into groups of
    len(a) and len(b) is enumerated; p is the share whose |mean difference| reaches the observed one. `min_p` is the
    smallest p these values can give (the share of splits at the largest |difference|): with 3 vs 3 seeds 2/20 = 0.1,
    with 5 vs 5 2/252, so a small study cannot reject whatever the data."""
    pooled = np.asarray([*a, *b], dtype=np.float64)
    na, n = len(a), len(a) + len(b)
    if na == 0 or na == n:
        return {"p": math.nan, "min_p": math.nan, "diff": math.nan, "splits": 0}
    total = pooled.sum()
    diffs = []
    for group in itertools.combinations(range(n), na):
        sa = pooled[list(group)].sum()
        diffs.append(sa / na - (total - sa) / (n - na))
    diffs_abs = np.abs(np.asarray(diffs))
    observed = abs(float(np.mean(a)) - float(np.mean(b)))
    slack = 1e-12 * max(1.0, float(np.abs(pooled).max()))  # the observed split itself must count despite rounding
    return {
        "p": float(np.mean(diffs_abs >= observed - slack)),
        "min_p": float(np.mean(diffs_abs >= diffs_abs.max() - slack)),
        "diff": float(np.mean(a)) - float(np.mean(b)),
        "splits": len(diffs),
    }


def verdict_word(diff: float, p_adjusted: float, higher_better: bool, alpha: float = ALPHA) -> str:
    """better / worse than the baseline when the Holm-adjusted p is below alpha, else within noise."""
    if math.isnan(p_adjusted):
        return "not tested"
    if p_adjusted >= alpha:
        return "within noise"
    return "better" if (diff > 0) == higher_better else "worse"


__all__ = [
    "ALPHA",
    "betainc",
    "bootstrap_diff",
    "decode_bits",
    "encode_bits",
    "holm",
    "permutation_test",
    "t_two_sided_p",
    "verdict_word",
    "welch",
]
