"""The training stack's modules import one another without a cycle, counting imports inside functions too, so
no module needs a function-local import to dodge one (the user-input error, `ConfigError`, lives in
`zpx_hf_train/errors.py`, below every module that raises it). Read from the source with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "zpx_hf_train"


def sibling_imports(source: str) -> set[str]:
    """The zpx_hf_train modules a file imports (`from .x import`, `from . import x`, `zpx_hf_train.x`), anywhere."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:
                found.update([module.split(".")[0]] if module else [alias.name for alias in node.names])
            elif module.startswith("zpx_hf_train."):
                found.add(module.split(".")[1])
    return found


def import_cycles(sources: dict[str, str]) -> list[list[str]]:
    """Every cycle of the import graph among `sources` (module name -> source), each as a path back to its start."""
    graph = {name: sibling_imports(source) & set(sources) for name, source in sources.items()}
    cycles = []

    def walk(path: list[str]) -> None:
        for target in sorted(graph[path[-1]]):
            if target in path:
                cycles.append(path[path.index(target) :] + [target])
            else:
                walk(path + [target])

    for name in sorted(graph):
        walk([name])
    return cycles


def test_training_stack_imports_have_no_cycle():
    sources = {path.stem: path.read_text() for path in PACKAGE.glob("*.py")}
    assert {"config", "distributed", "errors"} <= set(sources)
    assert import_cycles(sources) == []


def test_a_planted_cycle_is_found():
    sources = {path.stem: path.read_text() for path in PACKAGE.glob("*.py")}
    # the circle this layout removed: distributed raising config's ConfigError while config calls distributed
    sources["distributed"] += "\n\ndef planted():\n    from .config import ConfigError\n"
    assert ["config", "distributed", "config"] in import_cycles(sources)
