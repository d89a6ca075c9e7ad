"""Run code right after an optional package is imported, without importing it ourselves.

`import zpx_hf` must stay cheap and quiet: importing `peft` (and through it `torchao`, where installed) costs
seconds and prints torchao's library warnings. Yet PEFT's tables must hold each family's defaults before
PEFT resolves them. `after_import("peft", register)` runs `register` at once when `peft` is already
imported, else just after the first `import peft` finishes (a `sys.meta_path` finder that wraps peft's own
loader; it removes itself once it has fired).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _LoaderThenCallback(importlib.abc.Loader):
    """The package's own loader; once the module has executed, the callback runs."""

    def __init__(self, loader: Any, callback: Callable[[], object]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._callback()

    def __getattr__(self, name: str) -> Any:  # resource readers, get_source, ...: the real loader's
        return getattr(self._loader, name)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str) -> None:
        self.name = name
        self.callbacks: list[Callable[[], object]] = []
        self._resolving = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self._resolving:
            return None
        self._resolving = True  # let the other finders find the real package
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._resolving = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoaderThenCallback(spec.loader, self._fire)
        return spec

    def _fire(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for callback in self.callbacks:
            callback()


def after_import(name: str, callback: Callable[[], object]) -> None:
    """Call `callback()` once top-level package `name` is imported: now if it is, else after its import."""
    if name in sys.modules:  # imported (or blocked: `sys.modules[name] = None` makes importing it fail)
        if sys.modules[name] is not None:
            callback()
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _AfterImportFinder) and f.name == name), None)
    if finder is None:
        finder = _AfterImportFinder(name)
        sys.meta_path.insert(0, finder)
    finder.callbacks.append(callback)


__all__ = ["after_import"]
