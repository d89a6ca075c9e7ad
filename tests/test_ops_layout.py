"""The ops layer flows one way (docs/design.md §6.1): modeling -> an op's entry `ops_<op>.py` -> its kernels
`ops_<op>_<kernel>.py` -> its base `ops_<op>_base.py` -> `ops_common.py` / `clifford_algebra.py`.

The import graph is read from the source with `ast` (nothing is imported for it), every import counted: module
level or inside a function, relative (`from .x import`, `from . import x`) or absolute (`zpx_hf.x`). The kernel
signature test imports the entries and compares each kernel with its op's Protocol."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from zpx_hf.ops_common import KERNEL_NAMES

PACKAGE = Path(__file__).resolve().parent.parent / "zpx_hf"
OPS = ("zpx", "pct", "gpa", "rra")
SHARED = {"ops_common", "clifford_algebra"}


def package_imports(source: str) -> set[str]:
    """The zpx_hf modules a file's source imports (by module name, e.g. "ops_gpa_base")."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 and not module:  # from . import a, b
                found.update(alias.name for alias in node.names)
            elif node.level == 1:
                found.add(module.split(".")[0])
            elif module == "zpx_hf":  # from zpx_hf import a
                found.update(alias.name for alias in node.names)
            elif module.startswith("zpx_hf."):
                found.add(module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names if alias.name.startswith("zpx_hf."))
    return found


def role(module: str) -> tuple[str, str | None]:
    """("entry" | "base" | "kernel" | "other", op): what a zpx_hf module is in the ops layout."""
    for op in OPS:
        if module == f"ops_{op}":
            return "entry", op
        if module == f"ops_{op}_base":
            return "base", op
        if module.startswith(f"ops_{op}_"):
            return "kernel", op
    return "other", None


def layout_violations(sources: dict[str, str]) -> list[str]:
    """Every import that breaks the one-way flow, as "importer -> imported: why" (empty when the layout holds)."""
    problems = []
    for module, source in sorted(sources.items()):
        kind, op = role(module)
        if kind == "kernel" and module.removeprefix(f"ops_{op}_") not in KERNEL_NAMES:
            problems.append(f"{module}: a kernel file is named ops_<op>_<kernel>, the kernel one of KERNEL_NAMES")
        for imported in sorted(package_imports(source)):
            imported_kind, imported_op = role(imported)
            if kind == "kernel":
                if imported not in SHARED | {f"ops_{op}_base"}:
                    problems.append(
                        f"{module} -> {imported}: a kernel imports only its base, ops_common and the algebra"
                    )
            elif kind == "base" and imported not in SHARED:
                problems.append(f"{module} -> {imported}: a base imports only ops_common and the algebra")
            elif kind == "entry" and (imported.startswith("modeling") or (imported_op not in (None, op))):
                problems.append(f"{module} -> {imported}: an entry imports its own op's files and shared modules")
            elif kind == "other":
                if imported_kind in ("base", "kernel"):
                    problems.append(f"{module} -> {imported}: outside an op, only its entry is imported")
                if imported_kind == "entry" and not module.startswith("modeling"):
                    problems.append(f"{module} -> {imported}: only modeling files import an op's entry")
                if module in SHARED and imported_kind != "other":
                    problems.append(f"{module} -> {imported}: shared modules import no op")
    return problems


def package_sources() -> dict[str, str]:
    return {path.stem: path.read_text() for path in PACKAGE.glob("*.py")}


def test_the_package_has_every_op_file_kind():
    sources = package_sources()
    for op in OPS:
        assert {f"ops_{op}", f"ops_{op}_base", f"ops_{op}_naive"} <= set(sources), op
    assert not [name for name in sources if name.startswith("ops_") and name.endswith("_cpu")]  # named by algorithm


def test_ops_import_graph_flows_downward():
    assert layout_violations(package_sources()) == []


PLANTED = {
    # the circles this layout replaced, and the imports it forbids
    "ops_gpa_chunk": "from .ops_gpa import NUM_FORMS\n",  # a kernel importing its entry
    "ops_rra_triton": "from .ops_rra_scan import matmul_soa\n",  # a kernel importing another kernel
    "ops_pct_panel": "def f():\n    from .modeling_pct import PCTAttention\n",  # a kernel importing modeling code
    "ops_zpx_decode": "import zpx_hf.ops_zpx\n",  # absolute import of the entry
    "ops_gpa_base": "from .ops_gpa_naive import score_parts\n",  # a base importing a kernel
    "ops_rra_base": "from . import ops_rra\n",  # a base importing its entry
    "ops_pct": "from .modeling_pct import PCTAttention\n",  # an entry importing modeling code
    "integration_vllm": "from .ops_zpx_panel import zpx_attention_panel\n",  # reaching past the entry
    "configuration_zpx": "from .ops_zpx import zpx_attention\n",  # a non-modeling file importing an entry
}


@pytest.mark.parametrize("module", list(PLANTED))
def test_each_planted_violation_is_found(module):
    sources = package_sources()
    sources[module] += PLANTED[module]
    problems = layout_violations(sources)
    assert len(problems) == 1 and problems[0].startswith(module), problems


def test_a_kernel_file_outside_the_vocabulary_is_found():
    sources = package_sources()
    sources["ops_zpx_cpu"] = "from .ops_zpx_base import augment_query\n"
    assert layout_violations(sources) == [
        "ops_zpx_cpu: a kernel file is named ops_<op>_<kernel>, the kernel one of KERNEL_NAMES"
    ]


def protocol_parameters(protocol: type) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in list(inspect.signature(protocol.__call__).parameters.values())[1:]]


KERNEL_TABLES = {  # op: (entry, its table from kernel name to function, the Protocol in its base)
    "zpx": ("_IMPLEMENTATIONS", "ZPXKernel"),
    "pct": ("_IMPLEMENTATIONS", "PCTKernel"),
    "gpa": ("_KERNEL_FUNCTIONS", "GPAKernel"),
    "rra": ("_KERNEL_FUNCTIONS", "RRAKernel"),
}


@pytest.mark.parametrize("op", OPS)
def test_every_kernel_has_its_ops_signature(op):
    """Each kernel of `*_KERNELS` takes its Protocol's parameters, by the same names and kinds, without defaults
    (the entry passes every argument); each lives in `ops_<op>_<kernel>.py`."""
    entry = importlib.import_module(f"zpx_hf.ops_{op}")
    table_name, protocol_name = KERNEL_TABLES[op]
    table = getattr(entry, table_name)
    kernels = getattr(entry, f"{op.upper()}_KERNELS")
    assert set(table) == set(kernels)
    want = protocol_parameters(getattr(importlib.import_module(f"zpx_hf.ops_{op}_base"), protocol_name))
    for name, fn in table.items():
        parameters = list(inspect.signature(fn).parameters.values())
        assert [(p.name, p.kind) for p in parameters] == want, (op, name)
        assert all(p.default is inspect.Parameter.empty for p in parameters), (op, name)
        assert fn.__module__ == f"zpx_hf.ops_{op}_{name}", (op, name, fn.__module__)
