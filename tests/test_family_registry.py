"""Every registry keyed by family covers every family, and a fourth family added by the steps of
docs/contributing.md ("Adding a family") passes the model contract.

The registries: `zpx_hf.FAMILIES` (Auto classes, remote code), PEFT's defaults (`integration_peft`), zpx-inspect's
`FAMILY_DRAWINGS`, the model-card templates, the shipped tiny run configs, conversion's refusals, the test
configs (`conftest.TINY_CONFIGS`, `FAMILY_CASES`), transformers' common tests (`test_hf_common.py`) and the sections
of docs/families.md.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAMILY_CASES, TINY_CONFIGS
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING,
    MODEL_MAPPING,
)

import zpx_hf
from zpx_hf.conversion_llama import REFUSED_TARGETS
from zpx_hf_train.inspection import FAMILY_DRAWINGS
from zpx_hf_train.package_data import data_folder, shipped_configs

REPOSITORY = Path(__file__).resolve().parents[1]
TOY = REPOSITORY / "tests" / "fixtures" / "toy_family"


def test_every_registry_covers_every_family():
    families = set(zpx_hf.FAMILIES)
    for name, (config_class, model_class, causal_lm_class, classification_class) in zpx_hf.FAMILIES.items():
        assert config_class.model_type == name
        assert type(AutoConfig.for_model(name)) is config_class
        assert MODEL_MAPPING[config_class] is model_class
        assert MODEL_FOR_CAUSAL_LM_MAPPING[config_class] is causal_lm_class
        assert MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[config_class] is classification_class
        assert {cls.config_class for cls in (model_class, causal_lm_class, classification_class)} == {config_class}
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    from zpx_hf.integration_peft import LORA_TARGET_MODULES

    assert set(LORA_TARGET_MODULES) == families
    assert families <= set(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
    assert set(FAMILY_DRAWINGS) == families
    assert {path.stem for path in data_folder("model_cards").glob("*.md")} >= families
    assert {name.removesuffix("-tiny") for name in shipped_configs() if name.endswith("-tiny")} == families
    assert set(REFUSED_TARGETS) == families - {"zpx"}  # the one family a Llama's weights convert into
    assert {case.split("-")[0] for case in TINY_CONFIGS} == families
    assert {case.split("-")[0] for case in FAMILY_CASES} == families and len(FAMILY_CASES) == len(families)
    # transformers' common tests (tests/test_hf_common.py, skipped on import without `make test-hf`): read as text
    common_tests = (REPOSITORY / "tests" / "test_hf_common.py").read_text()
    assert set(re.findall(r'all_model_classes = zpx_hf\.FAMILIES\["(\w+)"\]', common_tests)) == families
    sections = re.findall(r"^## (\w+)", (REPOSITORY / "docs" / "families.md").read_text(), flags=re.MULTILINE)
    prefixes = {classes[0].__name__.removesuffix("Config") for classes in zpx_hf.FAMILIES.values()}
    assert prefixes <= set(sections)


def edit(path: Path, anchor: str, text: str, before: bool = False) -> None:
    """Insert `text` after (or before) `anchor` in `path`; the anchor must be there once (a step the docs name)."""
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path}: the anchor {anchor!r} of a documented step is gone"
    path.write_text(source.replace(anchor, text + anchor if before else anchor + text))


def add_toy_family(root: Path) -> None:
    """The steps of docs/contributing.md "Adding a family", for a copy of the repository at `root`."""
    # 1-2. configuration_<name>.py and modeling_<name>.py, flat in zpx_hf/
    for name in ("configuration_toy.py", "modeling_toy.py"):
        shutil.copy(TOY / name, root / "zpx_hf" / name)
    # 3. zpx_hf.FAMILIES (Auto registration and remote-code export follow)
    init = root / "zpx_hf" / "__init__.py"
    toy_imports = (
        "from .configuration_toy import ToyConfig\n"
        "from .modeling_toy import ToyForCausalLM, ToyForSequenceClassification, ToyModel\n"
    )
    edit(init, "from .modeling_zpx import", toy_imports, before=True)
    toy_entry = '\n    "toy": (ToyConfig, ToyModel, ToyForCausalLM, ToyForSequenceClassification),'
    edit(init, "\n}\n\n\ndef _register", toy_entry, before=True)
    # 4. PEFT defaults: its projections carry Llama's names
    peft = root / "zpx_hf" / "integration_peft.py"
    edit(peft, "LLAMA_NAMED_MODEL_TYPES = (ZPXConfig.model_type,", ' "toy",')
    edit(peft, "LORA_TARGET_MODULES = {\n", '    "toy": family_targets("toy", ["q_proj", "v_proj"]),\n')
    # 5. conversion: why a Llama's weights do not convert into it (the toy would take them; it is a test)
    edit(root / "zpx_hf" / "conversion_llama.py", "REFUSED_TARGETS = {\n", '    "toy": "the toy family is a test",\n')
    # 6. zpx-inspect's drawings
    inspection = root / "zpx_hf_train" / "inspection.py"
    drawings = (
        "def toy_drawings(model: Any, input_ids: torch.Tensor, labels: Sequence[str]) -> list[Drawing]:\n"
        "    with torch.no_grad():\n"
        "        outputs = model(input_ids=input_ids, output_attentions=True, return_dict=True)\n"
        '    maps = map_figure(attention_maps(outputs), labels, "toy attention weights", "weight", 1.0)\n'
        '    return [("toy_attention", "toy softmax weights per layer and head", maps)]\n\n\n'
    )
    edit(inspection, "FAMILY_DRAWINGS: dict", drawings, before=True)
    edit(inspection, '    "versor": versor_drawings,\n', '    "toy": toy_drawings,\n')
    # 7-8. a model-card template and a tiny run config
    card = (root / "model_cards" / "zpx.md").read_text().replace("ZPX", "Toy").replace("zpx", "toy")
    (root / "model_cards" / "toy.md").write_text(card)
    run_config = (root / "configs" / "zpx-tiny.yaml").read_text().replace("model_type: zpx", "model_type: toy")
    run_config = re.sub(r"  (phase_channels|lambda_angle|lambda_sphere|center_loss_weight): .*\n", "", run_config)
    (root / "configs" / "toy-tiny.yaml").write_text(run_config.replace("zpx-tiny", "toy-tiny"))
    # 9. the test configs (the model contract runs on every TINY_CONFIGS case) and transformers' common tests
    conftest = root / "tests" / "conftest.py"
    edit(conftest, "TINY_CONFIGS = {\n", '    "toy": dict(hidden_size=32, intermediate_size=64),\n')
    edit(conftest, 'FAMILY_CASES = ("zpx", "pct", "versor-hybrid"', ', "toy"')
    common_tests = root / "tests" / "test_hf_common.py"
    edit(common_tests, '    "versor-gpa": {},\n', '    "toy": {},\n')
    toy_common_test = (
        "class ToyCommonTest(FamilyTestBase, unittest.TestCase):\n"
        '    case = family = "toy"\n'
        '    all_model_classes = zpx_hf.FAMILIES["toy"][1:]\n\n\n'
    )
    edit(common_tests, "class VersorGPACommonTest", toy_common_test, before=True)
    # 10. its section in docs/families.md (and its formulas in docs/design.md, prose this test does not read)
    families = root / "docs" / "families.md"
    section = "## Toy\n\nPlain softmax attention, declared through the shared classes.\n\n"
    edit(families, "## Packed sequences", section, before=True)


@pytest.mark.slow
def test_a_fourth_family_added_by_the_documented_steps_passes_the_model_contract(tmp_path):
    root = tmp_path / "repository"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("zpx_hf", "zpx_hf_train", "tests", "configs", "model_cards", "docs"):
        shutil.copytree(REPOSITORY / folder, root / folder, ignore=ignore)
    add_toy_family(root)
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    registry = "tests/test_family_registry.py::test_every_registry_covers_every_family"
    options = ["-q", "-x", "-p", "no:cacheprovider", "-k", "toy or registry"]
    command = [sys.executable, "-m", "pytest", *options, "tests/test_model_contract.py", registry]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]  # every selected test ran and passed: none skipped
    assert re.fullmatch(r"\d+ passed, \d+ deselected(, \d+ warnings?)? in .*", summary), result.stdout[-2000:]
    assert int(summary.split()[0]) >= 10  # the registry test and the contract's toy cases
