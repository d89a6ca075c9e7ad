"""transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`) against every family.

The tests are not copied here: they ship in the source distribution of the installed transformers,
which `make test-hf` fetches into `.hf-tests/` (git-ignored); without it this module is skipped and
`make test` stays offline. Each family gets a small tester shaped like transformers' own model tests
(a `model_tester` that builds a tiny config and inputs, a `ConfigTester`, `all_model_classes`).

The common tests choose what to check from transformers' model-name tables (which class is a base
model, a causal LM, a sequence classifier); our classes are added to those tables by a fixture of this
module, for its duration only, never by the package.

The sdist omits three sibling modules that `test_modeling_common.py` and `test_configuration_common.py`
import (`generation/test_utils.py`, `exporters/test_export.py`, `utils/test_configuration_utils.py`).
Their names get stand-ins below: the generation and export mixins are empty (their tests are not run;
`tests/test_model_contract.py` covers generate, caches, continuation, beam search and assisted decoding),
and `config_common_kwargs` is our own table of `PretrainedConfig` fields set to non-default values.
Every skipped common test is listed in `SKIPS` with its reason.
"""

from __future__ import annotations

import importlib
import sys
import types
import unittest
from pathlib import Path
from unittest import mock

import pytest
import transformers

HF_TESTS = Path(__file__).resolve().parents[1] / ".hf-tests" / f"transformers-{transformers.__version__}" / "tests"
if not (HF_TESTS / "__init__.py").exists() or not (HF_TESTS / "test_modeling_common.py").exists():
    pytest.skip(
        f"transformers' common tests are not fetched ({HF_TESTS} is missing): run `make test-hf`.",
        allow_module_level=True,
    )
pytest.importorskip("parameterized", reason="transformers' common tests need `parameterized`: run `make test-hf`.")

import torch  # noqa: E402
from conftest import make_tiny_config  # noqa: E402
from transformers.models.auto import modeling_auto  # noqa: E402

import zpx_hf  # noqa: E402

PACKAGE = "hf_sdist_tests"


def _stand_in(name: str, **attributes: object) -> None:
    module = types.ModuleType(f"{PACKAGE}.{name}")
    module.__dict__.update(attributes)
    sys.modules[module.__name__] = module


def _load_sdist_tests() -> tuple[types.ModuleType, types.ModuleType]:
    """Import the sdist's `test_modeling_common` and `test_configuration_common` as package `hf_sdist_tests`
    (our own `tests/` is not a package, so the names cannot clash)."""
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(HF_TESTS)]
        sys.modules[PACKAGE] = package
        for parent in ("generation", "exporters", "utils"):
            _stand_in(parent, __path__=[])
        _stand_in("generation.test_utils", GenerationTesterMixin=type("GenerationTesterMixin", (), {}))
        _stand_in("exporters.test_export", ExportTesterMixin=type("ExportTesterMixin", (), {}))
        _stand_in("utils.test_configuration_utils", config_common_kwargs=CONFIG_COMMON_KWARGS)
    return (
        importlib.import_module(f"{PACKAGE}.test_modeling_common"),
        importlib.import_module(f"{PACKAGE}.test_configuration_common"),
    )


# `PretrainedConfig` fields every config must accept and keep, each at a non-default value.
CONFIG_COMMON_KWARGS = {
    "architectures": ["ForCausalLM"],
    "output_hidden_states": True,
    "return_dict": False,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "id2label": {0: "label"},
    "label2id": {"label": 0},
    "problem_type": "regression",
    "bos_token_id": 6,
    "pad_token_id": 7,
    "eos_token_id": 8,
}

common, config_common = _load_sdist_tests()
ModelTesterMixin = common.ModelTesterMixin
ConfigTester = config_common.ConfigTester

# Common tests that do not apply to a family, with the reason (the README lists them).
NOT_SHIPPED = (
    "GenerationTesterMixin is not in the sdist (tests/generation/ is not shipped); "
    "generate is covered by tests/test_model_contract.py"
)
SKIPS: dict[str, dict[str, str]] = {
    "all": {
        "test_generation_tester_mixin_inheritance": NOT_SHIPPED,
    },
    "zpx": {},
    "pct": {},
    "versor": {
        test: "RRA layers have no attention matrix: the hybrid's RRA layer (layer 0) returns None in `attentions`; "
        "VersorGPACommonTest runs this test with GPA in every layer"
        for test in ("test_attention_outputs", "test_retain_grad_hidden_states_attentions")
    },
    "versor-gpa": {},
}
# The tests VersorGPACommonTest runs: those the hybrid skips for its RRA layer (the rest is the hybrid's).
GPA_ONLY_TESTS = tuple(SKIPS["versor"])


@pytest.fixture(scope="module", autouse=True)
def our_classes_in_transformers_tables():
    """Name our classes in the tables the common tests read, for this module only."""
    tables = (
        (modeling_auto.MODEL_MAPPING_NAMES, "Model"),
        (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "ForCausalLM"),
        (modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, "ForSequenceClassification"),
    )
    prefixes = {family: classes[0].__name__.removesuffix("Config") for family, classes in zpx_hf.FAMILIES.items()}
    patches = [
        mock.patch.dict(table, {family: prefix + suffix for family, prefix in prefixes.items()})
        for table, suffix in tables
    ]
    for patch in patches:
        patch.start()
    yield
    for patch in reversed(patches):
        patch.stop()


class FamilyModelTester:
    """Tiny config and inputs for one family case (`conftest.make_tiny_config`), in the shape transformers'
    model testers have (`prepare_config_and_inputs_for_common`, sizes as attributes)."""

    def __init__(self, parent: unittest.TestCase, case: str, batch_size: int = 2, seq_length: int = 7) -> None:
        self.parent = parent
        self.case = case
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = True
        config = self.get_config()
        self.vocab_size = config.vocab_size
        self.hidden_size = config.hidden_size
        self.num_hidden_layers = config.num_hidden_layers
        self.num_attention_heads = config.num_attention_heads
        self.num_labels = 3

    def get_config(self):
        return make_tiny_config(self.case, num_labels=3)

    def prepare_config_and_inputs_for_common(self):
        config = self.get_config()
        input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = common.random_attention_mask([self.batch_size, self.seq_length])
        return config, {"input_ids": input_ids, "attention_mask": attention_mask}


class FamilyTestBase(ModelTesterMixin):
    """One family's common tests; subclasses set `case`, `family` and `all_model_classes`."""

    case: str
    family: str

    def setUp(self) -> None:
        reason = SKIPS["all"].get(self._testMethodName) or SKIPS[self.family].get(self._testMethodName)
        if reason:
            self.skipTest(reason)
        torch.manual_seed(0)
        self.model_tester = FamilyModelTester(self, self.case)
        config = self.model_tester.get_config()
        self.config_tester = ConfigTester(
            self,
            config_class=type(config),
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads,
        )

    def test_config(self) -> None:
        self.config_tester.run_common_tests()


class ZPXCommonTest(FamilyTestBase, unittest.TestCase):
    case = family = "zpx"
    all_model_classes = zpx_hf.FAMILIES["zpx"][1:]


class PCTCommonTest(FamilyTestBase, unittest.TestCase):
    case = family = "pct"
    all_model_classes = zpx_hf.FAMILIES["pct"][1:]


class VersorCommonTest(FamilyTestBase, unittest.TestCase):
    """The hybrid mixer: RRA in layer 0, GPA in layer 1, so both mixers meet every common test."""

    case = "versor-hybrid"
    family = "versor"
    all_model_classes = zpx_hf.FAMILIES["versor"][1:]


class VersorGPACommonTest(FamilyTestBase, unittest.TestCase):
    """GPA in every layer, for the attention-weight tests only (`GPA_ONLY_TESTS`)."""

    case = family = "versor-gpa"
    all_model_classes = zpx_hf.FAMILIES["versor"][1:]


# unittest collects callable `test_*` attributes only: VersorGPACommonTest keeps just GPA_ONLY_TESTS.
for _name in dir(VersorGPACommonTest):
    if _name.startswith("test_") and _name not in GPA_ONLY_TESTS:
        setattr(VersorGPACommonTest, _name, None)
