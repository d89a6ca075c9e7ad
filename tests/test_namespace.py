"""The model package stands alone: HF remote code copies `zpx_hf/*.py` flat, so no model module may import
the training stack (`zpx_hf_train`), and the training stack lives under the project's own name."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_FILES = sorted((ROOT / "zpx_hf").glob("*.py"))


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.name)
def test_model_modules_never_import_the_training_stack(path):
    top = {name.split(".")[0] for name in _imported_modules(path)}
    assert not top & {"zpx_hf_train", "training", "benchmarks"}, f"{path.name} imports {top}"


def test_model_package_is_flat_and_holds_no_training_modules():
    assert not [p for p in (ROOT / "zpx_hf").rglob("*.py") if p.parent.name != "zpx_hf"]
    names = {p.stem for p in MODEL_FILES}
    assert not names & {"data_tasks", "data_geometry", "metrics", "evaluation"}
    assert not (ROOT / "training").exists()


def test_console_commands_point_into_the_project_namespace():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts and all(target.startswith("zpx_hf_train.") for target in scripts.values()), scripts
