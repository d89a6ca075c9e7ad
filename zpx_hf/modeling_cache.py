"""KV caches that grow without copying: appending a token writes one row, not the whole cache.

transformers' `DynamicLayer` appends by `torch.cat((cached, new), dim=-2)`: every decoding step reads and
rewrites the whole cache, O(L) memory traffic per token and per layer. On a CPU whose caches the weights
already fill, that copy is the largest single cost of a decoding step at a few hundred tokens (measured:
`benchmarks/bench_step.py`). `GrowingRows` keeps the cached rows as a prefix view of a buffer with spare rows
and writes new rows into the spare ones; the buffer is reallocated (with a quarter more rows) only when full,
so the copy is amortised to a few rows per token.

A view once returned is never written again: rows are only written past the longest view handed out, and a
cache whose view was replaced or shortened by anyone else (beam reordering, batch selection, `crop`, a
prefix written by PEFT) is first copied into a fresh buffer. With gradients recorded or under `torch.compile`
the rows are concatenated exactly as `DynamicLayer` does.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

MIN_SPARE_ROWS = 64


class GrowingRows:
    """One growing tensor [..., rows, width] (rows on dim -2): `append(cached, new)` equals
    `torch.cat((cached, new), dim=-2)` and returns a prefix view of the buffer."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.written = 0  # rows of `buffer` covered by views already returned

    def append(self, cached: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
        if cached is not None and cached.numel() == 0:  # DynamicLayer's lazy initialisation: an empty tensor
            cached = None
        if torch.compiler.is_compiling() or (
            torch.is_grad_enabled() and (new.requires_grad or (cached is not None and cached.requires_grad))
        ):
            self.buffer, self.written = None, 0  # autograd and compiled graphs see the plain concatenation
            return new if cached is None else torch.cat((cached, new), dim=-2)
        if cached is not None and (not _same_layout(cached, new) or cached.shape[:-2] != new.shape[:-2]):
            # mixed dtypes or shapes: `cat` promotes or raises, as DynamicLayer does
            self.buffer, self.written = None, 0
            return torch.cat((cached, new), dim=-2)
        length = 0 if cached is None else cached.shape[-2]
        total = length + new.shape[-2]
        buffer = self.buffer
        if buffer is None or not self._extends(buffer, cached, length, new, total):
            buffer = self._reallocate(cached, length, new, total)
        buffer[..., length:total, :].copy_(new)
        self.written = total
        return buffer[..., :total, :]

    def _extends(
        self, buffer: torch.Tensor, cached: torch.Tensor | None, length: int, new: torch.Tensor, total: int
    ) -> bool:
        """Whether `cached` is the last view returned of `buffer` (rows past it are unused) and `new` fits after it."""
        if total > buffer.shape[-2] or length != self.written:
            return False
        if buffer.is_inference() and not torch.is_inference_mode_enabled():
            return False  # filled under `torch.inference_mode`: not writable outside it
        if not _same_layout(buffer, new) or buffer.shape[:-2] != new.shape[:-2]:
            return False
        if cached is None:
            return True
        return (
            cached.data_ptr() == buffer.data_ptr()
            and cached.stride() == buffer.stride()
            and cached.shape[:-2] == buffer.shape[:-2]
        )

    def _reallocate(self, cached: torch.Tensor | None, length: int, new: torch.Tensor, total: int) -> torch.Tensor:
        capacity = total + max(total // 4, MIN_SPARE_ROWS)
        buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
        if cached is not None and length:
            buffer[..., :length, :].copy_(cached)
        self.buffer = buffer
        return buffer


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, device, rank and width: rows of `b` can be written into `a`'s buffer."""
    return a.dtype == b.dtype and a.device == b.device and a.dim() == b.dim() and a.shape[-1] == b.shape[-1]


class GrowingDynamicLayer(DynamicLayer):
    """`DynamicLayer` whose keys and values grow through `GrowingRows`. Every other method is DynamicLayer's,
    acting on the views (`keys`, `values`) it holds."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.key_rows = GrowingRows()
        self.value_rows = GrowingRows()

    @classmethod
    def from_layer(cls, layer: DynamicLayer) -> GrowingDynamicLayer:
        """A growing layer holding `layer`'s state (keys, values, device, initialisation)."""
        grown = cls()
        grown.__dict__.update(layer.__dict__)
        return grown

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = self.key_rows.append(self.keys, key_states)
        self.values = self.value_rows.append(self.values, value_states)
        return self.keys, self.values


def grow_dynamic_layers(cache: Cache | None) -> None:
    """Make a `DynamicCache`'s plain `DynamicLayer`s (present, and those it creates later) `GrowingDynamicLayer`s;
    other caches and layer types (static, sliding, quantised, offloaded) are left as they are."""
    if not isinstance(cache, DynamicCache) or getattr(cache, "offloading", False) or torch.compiler.is_compiling():
        return
    layers = cache.layers
    for index, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[index] = GrowingDynamicLayer.from_layer(layer)
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = GrowingDynamicLayer


__all__ = ["GrowingRows", "GrowingDynamicLayer", "grow_dynamic_layers"]
