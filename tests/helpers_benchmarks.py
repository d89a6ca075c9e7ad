"""Load `benchmarks/<name>.py` scripts as modules (they import each other by bare name, as when run from there)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """`benchmarks/<name>.py`, registered under `name` (kept if that module is already loaded from there)."""
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", "").startswith(str(BENCH)):
        return loaded
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
