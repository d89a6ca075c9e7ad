"""Statistics of the evidence suite: Welch's t-test and its interval, the exact permutation test on means and the
exact Mann-Whitney test (each with the smallest p its sample sizes can give), the Bonferroni family correction that
sets both the verdict and the interval's level, a bootstrap over seeds x evaluation examples, and the compact
per-example correctness bitstrings stored in the result rows.

Pure Python + numpy (no scipy at run time); tests/test_ablation_evidence.py checks the numbers against scipy
where it is installed and against hand-computed values.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

ALPHA = 0.05  # family-wise error rate of one claim's comparison family (Bonferroni)
MAX_SPLITS = 2_000_000  # exact tests enumerate every split of the pooled sample; beyond this they refuse


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


def t_critical(df: float, level: float) -> float:
    """The t with P(|T| >= t) = 1 - level for Student's t with `df` degrees of freedom (bisection on
    `t_two_sided_p`, which falls monotonically in t)."""
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > 1.0 - level:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 1.0 - level else (lo, mid)
    return hi


def welch_interval(a: Sequence[float], b: Sequence[float], level: float) -> tuple[float, float]:
    """Welch's interval of mean(a) - mean(b) at `level`: diff ± t_crit(df) * se. It excludes 0 exactly when Welch's
    two-sided p is below 1 - level (the same t, df and se). nan with fewer than 2 values a side or no variance."""
    r = welch(a, b)
    if math.isnan(r["t"]):
        return math.nan, math.nan
    se = math.sqrt(float(np.var(a, ddof=1)) / len(a) + float(np.var(b, ddof=1)) / len(b))
    half = t_critical(r["df"], level) * se
    return r["diff"] - half, r["diff"] + half


def bonferroni(pvalues: Sequence[float]) -> list[float]:
    """Bonferroni-adjusted p-values min(1, m p) over the m non-nan p-values (nan stays nan, not counted). Its
    verdict at alpha is the verdict of the 1 - alpha / m interval (`welch_interval`), so the two never disagree."""
    m = sum(not math.isnan(p) for p in pvalues)
    return [p if math.isnan(p) else min(1.0, m * p) for p in pvalues]


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


def _exact_split_test(pooled: np.ndarray, na: int, deviation: Callable[[np.ndarray], np.ndarray]) -> dict[str, float]:
    """Enumerate every split of `pooled` into its first group's size `na` and the rest; `deviation(groups)` maps
    the [splits, na] index array of the first group to each split's signed deviation from the null's centre.
    p: the share of splits at least as extreme as the observed one (the first split, indices 0 .. na-1); min_p: the
    share at the most extreme value, the smallest p these values can give."""
    n = len(pooled)
    if na == 0 or na == n:
        return {"p": math.nan, "min_p": math.nan, "splits": 0}
    if math.comb(n, na) > MAX_SPLITS:
        raise ValueError(f"exact test: {math.comb(n, na):,} splits of {n} values exceed {MAX_SPLITS:,}.")
    groups = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), na)), dtype=np.int64)
    extreme = np.abs(deviation(groups.reshape(-1, na)))
    slack = 1e-12 * max(1.0, float(extreme.max()))  # the observed split itself must count despite rounding
    return {
        "p": float(np.mean(extreme >= extreme[0] - slack)),
        "min_p": float(np.mean(extreme >= extreme.max() - slack)),
        "splits": len(extreme),
    }


def permutation_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Exact two-sided permutation test of mean(a) - mean(b): every split of the pooled values into groups of
    len(a) and len(b) is enumerated; p is the share whose |mean difference| reaches the observed one. `min_p` is the
    smallest p these values can give (the share of splits at the largest |difference|): with 3 vs 3 seeds 2/20 = 0.1,
    with 4 vs 4 2/70, with 5 vs 5 2/252, so a small study cannot reject whatever the data."""
    pooled = np.asarray([*a, *b], dtype=np.float64)
    na, nb = len(a), len(b)
    total = pooled.sum()

    def mean_gap(groups: np.ndarray) -> np.ndarray:
        sums = pooled[groups].sum(1)
        return sums / na - (total - sums) / max(nb, 1)

    diff = float(np.mean(a)) - float(np.mean(b)) if na and nb else math.nan
    return {**_exact_split_test(pooled, na, mean_gap), "diff": diff}


def midranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1 .. n, tied values sharing the mean of their ranks."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    start = 0
    while start < len(x):
        end = start
        while end + 1 < len(x) and x[order[end + 1]] == x[order[start]]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def mann_whitney_exact(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Exact two-sided Mann-Whitney test: U = R_a - na (na + 1) / 2 from the pooled midranks, against its exact
    distribution over every split of those ranks (conditional on the ties, so exact with ties as well); p is the
    share of splits with |U - na nb / 2| at least the observed one, `min_p` the smallest p these sizes and ties can
    give (2 / C(na + nb, na) without ties: 4 vs 4 seeds 0.029, 5 vs 5 0.0079)."""
    ranks = midranks([*a, *b])
    na, nb = len(a), len(b)

    def u_gap(groups: np.ndarray) -> np.ndarray:
        return ranks[groups].sum(1) - na * (na + 1) / 2.0 - na * nb / 2.0

    u = float(ranks[:na].sum() - na * (na + 1) / 2.0) if na and nb else math.nan
    return {**_exact_split_test(ranks, na, u_gap), "u": u}


def verdict_word(interval: tuple[float, float], higher_better: bool) -> str:
    """better / worse than the baseline exactly when the family-corrected interval of variant - baseline excludes
    0 (its level 1 - alpha / m is the Bonferroni correction's), else within noise."""
    lo, hi = interval
    if math.isnan(lo) or math.isnan(hi):
        return "not tested"
    if lo <= 0.0 <= hi:
        return "within noise"
    return "better" if (lo > 0) == higher_better else "worse"


__all__ = [
    "ALPHA",
    "betainc",
    "bonferroni",
    "bootstrap_diff",
    "decode_bits",
    "encode_bits",
    "mann_whitney_exact",
    "midranks",
    "permutation_test",
    "t_critical",
    "t_two_sided_p",
    "verdict_word",
    "welch",
    "welch_interval",
]
