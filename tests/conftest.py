"""Test setup shared by every test module.

Triton kernels run on the CPU through the interpreter; TRITON_INTERPRET must be set before
any kernel is defined, so it is set here, before the tests import `zpx_hf`. On a CUDA
machine the real compiler is used instead.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# One tiny configuration per family (and per Versor mixer), shared by every model test.
TINY_CONFIGS = {
    "zpx": dict(hidden_size=32, intermediate_size=64, phase_channels=4),
    "pct": dict(hidden_size=32, intermediate_size=64),
    "versor-rra": dict(mixer="rra", hidden_size=128, intermediate_size=128, initializer_range=0.2),
    "versor-gpa": dict(mixer="gpa", hidden_size=128, intermediate_size=128, initializer_range=0.2),
    "versor-hybrid": dict(mixer="hybrid", hidden_size=128, intermediate_size=128, initializer_range=0.2),
}
TINY_VOCAB = 61
# One case per family, for tests that need every family once (Versor: its hybrid of both mixers).
FAMILY_CASES = ("zpx", "pct", "versor-hybrid")


def make_tiny_config(case: str, **overrides):
    """The tiny config of a family case ("zpx", "pct", "versor-rra", ...), with `overrides` applied."""
    import zpx_hf

    family = case.split("-")[0]
    kwargs = dict(vocab_size=TINY_VOCAB, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64)
    kwargs.update(TINY_CONFIGS[case])
    kwargs.update(overrides)
    return zpx_hf.FAMILIES[family][0](**kwargs)


@pytest.fixture
def tiny_config():
    """Factory fixture: `tiny_config("pct", tau="learnable")`."""
    return make_tiny_config


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread for a module (`pytestmark = pytest.mark.usefixtures("single_thread")`): micro models
    lose more to a second thread than they gain, and collapse on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_close_eps(actual: torch.Tensor, expected: torch.Tensor, ulps: float = 64, dtype: torch.dtype | None = None):
    """|actual - expected| <= ulps * eps(dtype) * max|expected|, elementwise.

    For comparing two different algorithms (or summation orders) of one formula: their results differ by
    rounding, which scales with the dtype's machine epsilon and the size of the values, and varies with the BLAS
    build and the CPU. `dtype` defaults to the lower precision of the two tensors; `ulps` is the number of
    roundings the bound allows, relative to the largest expected magnitude.
    """
    if dtype is None:
        dtype = actual.dtype if torch.finfo(actual.dtype).eps >= torch.finfo(expected.dtype).eps else expected.dtype
    expected = expected.to(actual.dtype)
    scale = expected.abs().max().item() if expected.numel() else 0.0
    tolerance = ulps * torch.finfo(dtype).eps * scale
    torch.testing.assert_close(actual, expected, rtol=0, atol=tolerance)


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    """A `helpers_hub.LocalHub` on 127.0.0.1 for this test, huggingface_hub pointed at it (online, its token
    stored in a temporary HF_HOME); offline mode and the real HF_HOME are back after the test."""
    from helpers_hub import LocalHub, client_pointed_at

    hub = LocalHub().start()
    try:
        with client_pointed_at(hub, tmp_path / "hf_home", monkeypatch):
            yield hub
    finally:
        hub.stop()
