"""Byte (or token) n-gram language models: the references held-out bits per byte is read against.

Interpolated Witten-Bell smoothing (Witten & Bell 1991; Chen & Goodman 1998, eq. 14), a proper distribution at
every order with no tuned constant:

    P_0(w)     = 1 / alphabet
    P_k(w | h) = (c(h w) + T(h) P_(k-1)(w | h')) / (c(h) + T(h))      h: the k-1 symbols before w, h' = h minus its
                                                                       first symbol; P_k = P_(k-1) where c(h) = 0

with c(h w) the count of the k-gram in the training stream, c(h) = sum_w c(h w) and T(h) the number of distinct
symbols seen after h. A position with fewer than k-1 symbols before it uses the orders that fit. Counting and
scoring are vectorised (numpy): each k-gram is packed into one uint64 key, counted with `np.unique`, looked up with
`np.searchsorted`; a 10 MB stream fits a 5-gram in seconds.
"""

from __future__ import annotations

import numpy as np


class NgramModel:
    """An interpolated Witten-Bell n-gram model over symbols 0 .. alphabet-1 (bytes by default)."""

    def __init__(self, order: int, alphabet: int = 256) -> None:
        self.bits_per_symbol = max(1, (alphabet - 1).bit_length())
        if order < 1 or order * self.bits_per_symbol > 64:
            raise ValueError(f"order {order} must be >= 1 and fit {order} x {self.bits_per_symbol} bits in 64.")
        self.order, self.alphabet = order, alphabet
        self.tables: list[tuple[np.ndarray, ...]] = []

    def _keys(self, data: np.ndarray, positions: np.ndarray, k: int) -> np.ndarray:
        """uint64 key of the k-gram ending at each position (data[t-k+1 .. t], oldest symbol highest)."""
        keys = np.zeros(len(positions), dtype=np.uint64)
        for j in range(k):
            keys = (keys << np.uint64(self.bits_per_symbol)) | data[positions - (k - 1) + j].astype(np.uint64)
        return keys

    def fit(self, data: np.ndarray) -> NgramModel:
        """Count every k-gram (k = 1 .. order) of the training stream `data`."""
        data = self._check(data)
        self.tables = []
        shift = np.uint64(self.bits_per_symbol)
        for k in range(1, self.order + 1):
            grams, counts = np.unique(self._keys(data, np.arange(k - 1, len(data)), k), return_counts=True)
            # grams are sorted, so the k-grams of one context (key >> bits) are contiguous
            contexts, first, types = np.unique(grams >> shift, return_index=True, return_counts=True)
            totals = np.add.reduceat(counts, first) if len(counts) else counts
            self.tables.append((grams, counts, contexts, totals, types))
        return self

    def bits(self, data: np.ndarray, targets: np.ndarray | None = None) -> np.ndarray:
        """-log2 P(data[t] | the symbols before t) for each target position t (default: every position)."""
        if not self.tables:
            raise RuntimeError("NgramModel.bits: call fit() first.")
        data = self._check(data)
        targets = np.arange(len(data)) if targets is None else np.asarray(targets, dtype=np.int64)
        p = np.full(len(targets), 1.0 / self.alphabet)
        shift = np.uint64(self.bits_per_symbol)
        for k, (grams, counts, contexts, totals, types) in enumerate(self.tables, start=1):
            fits = targets >= k - 1
            keys = self._keys(data, targets[fits], k)
            c_hw = _lookup(grams, counts, keys)
            c_h = _lookup(contexts, totals, keys >> shift)
            t_h = _lookup(contexts, types, keys >> shift)
            lower = p[fits]
            seen = c_h > 0
            lower[seen] = (c_hw[seen] + t_h[seen] * lower[seen]) / (c_h[seen] + t_h[seen])
            p[fits] = lower
        return -np.log2(p)

    def _check(self, data: np.ndarray) -> np.ndarray:
        data = np.asarray(data)
        if data.ndim != 1 or not np.issubdtype(data.dtype, np.integer):
            raise ValueError("NgramModel: data must be a 1-D integer array of symbols.")
        if len(data) and (int(data.min()) < 0 or int(data.max()) >= self.alphabet):
            raise ValueError(f"NgramModel: symbols must lie in 0 .. {self.alphabet - 1}.")
        return data


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values[keys == query] for each query, 0 where a query is not among the sorted keys."""
    if len(keys) == 0:
        return np.zeros(len(query), dtype=np.float64)
    index = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    return np.where(keys[index] == query, values[index], 0).astype(np.float64)


__all__ = ["NgramModel"]
