"""The model package stands alone: HF remote code copies `zpx_hf/*.py` flat, so no model module may import
the training stack (`zpx_hf_train`), and the training stack lives under the project's own name."""

import ast
import importlib
import importlib.resources
import json
import os
import re
import subprocess
import sys
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


# ----------------------------------------------------------------------------------------- optional packages

OPTIONAL_PACKAGES = ("peft", "torchao", "vllm", "trl", "lm_eval", "bitsandbytes")
LOADED = f"import json, sys; print(json.dumps(sorted(m for m in {OPTIONAL_PACKAGES!r} if m in sys.modules)))"


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def _without_log_stamps(stderr: str) -> list[str]:
    """torch's logging lines carry a time and a pid (`W1204 16:04:18.965000 19366 ...`): drop them."""
    return [re.sub(r"^([WIEF])\d{4} [\d:.]+ \d+ ", r"\1 ", line) for line in stderr.splitlines()]


def test_import_loads_no_optional_package_and_prints_nothing_of_its_own():
    # The baseline is a bare transformers model import: transformers.modeling_utils itself imports torchao where it
    # is installed (its quantizers; 5.17 and 5.25), with torchao's own warnings. zpx_hf must add nothing to that.
    baseline = _run_python(f"import transformers.modeling_utils; {LOADED}")
    ours = _run_python(
        f"import zpx_hf; {LOADED}\n"
        "assert 'zpx_hf.integration_peft' not in sys.modules\n"
        "import importlib.util, sys\n"
        "if importlib.util.find_spec('peft'):  # PEFT's tables get the families' defaults once peft is imported\n"
        "    sys.stderr.flush(); sys.stderr.write('--- peft ---\\n')\n"
        "    from peft.utils import constants\n"
        "    mapping = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING\n"
        "    print(json.dumps([mapping.get('versor'), mapping.get('pct')]))\n"
    )
    assert baseline.returncode == 0 and ours.returncode == 0, ours.stderr[-2000:]
    loaded = json.loads(ours.stdout.splitlines()[0])
    assert "peft" not in loaded and set(loaded) <= set(json.loads(baseline.stdout)), (loaded, baseline.stdout)
    before_peft = ours.stderr.split("--- peft ---\n")[0]
    assert _without_log_stamps(before_peft) == _without_log_stamps(baseline.stderr)
    if "--- peft ---" in ours.stderr:
        assert json.loads(ours.stdout.splitlines()[1]) == [
            ["q_proj", "v_proj"],
            ["q_proj.real", "q_proj.imag", "v_proj.real", "v_proj.imag"],
        ]


def test_after_import_runs_once_the_package_is_imported(tmp_path, monkeypatch):
    from zpx_hf.integration_imports import after_import

    package = tmp_path / "zpx_after_import_probe"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 7\n")
    (package / "data.txt").write_text("kept")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []
    after_import("zpx_after_import_probe", lambda: calls.append(sys.modules["zpx_after_import_probe"].VALUE))
    assert calls == [] and "zpx_after_import_probe" not in sys.modules
    try:
        module = importlib.import_module("zpx_after_import_probe")
        assert calls == [7] and module.VALUE == 7
        assert (importlib.resources.files(module) / "data.txt").read_text() == "kept"  # the real loader's reader
        assert not [f for f in sys.meta_path if getattr(f, "name", None) == "zpx_after_import_probe"]
        importlib.reload(module)
        after_import("zpx_after_import_probe", lambda: calls.append("now"))  # already imported: at once
        assert calls == [7, "now"]
    finally:
        sys.modules.pop("zpx_after_import_probe", None)
