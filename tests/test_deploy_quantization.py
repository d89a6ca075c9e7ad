"""torchao int8 quantisation of every family and Versor mixer, against a same-size Llama under the same scheme.

Both entry points users run: `quantize_` on a loaded model and `from_pretrained(quantization_config=
TorchAoConfig(...))`. Each checks that every projection layer is quantised (counted), that forward and
`generate` run, and that the logits stay within a bound of the fp32 model of the order of Llama's error.
"""

import copy
import re

import pytest
import torch
from conftest import TINY_CONFIGS, TINY_VOCAB, make_tiny_config
from torch import nn

torchao = pytest.importorskip("torchao")
from torchao.quantization import (  # noqa: E402
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    quantize_,
)
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, TorchAoConfig  # noqa: E402

import zpx_hf  # noqa: E402, F401
from zpx_hf.integration_torchao import is_projection, projection_config  # noqa: E402
from zpx_hf.modeling_blocks import plain_tensor  # noqa: E402

CASES = tuple(TINY_CONFIGS)
SCHEMES = {"int8-weight-only": Int8WeightOnlyConfig, "int8-dynamic-activation": Int8DynamicActivationInt8WeightConfig}


def family_model(case: str) -> nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_tiny_config(case)).eval()


def llama_like(case: str) -> LlamaForCausalLM:
    """A Llama with the family's width, depth, heads and vocabulary."""
    sizes = TINY_CONFIGS[case]
    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def projections(model: nn.Module) -> set[str]:
    return {name for name, module in model.named_modules() if is_projection(module) and name}


def quantized(model: nn.Module) -> set[str]:
    return {name for name, module in model.named_modules() if not plain_tensor(getattr(module, "weight", None))}


def relative_error(model: nn.Module, reference: torch.Tensor, ids: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()
    return float((logits - reference).norm() / reference.norm())


def check_quantized(model: nn.Module, fp32: nn.Module, expected: set[str]) -> float:
    """Every expected layer quantised; forward and generate run; the logits' relative error."""
    assert quantized(model) == expected
    ids = torch.randint(3, TINY_VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = fp32(ids).logits
    error = relative_error(model, reference, ids)
    generated = model.generate(ids[:, :5], max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert generated.shape == (2, 11)
    return error


def quantize_with(model: nn.Module, scheme: str) -> nn.Module:
    quantize_(model, SCHEMES[scheme](), filter_fn=is_projection)
    return model


@pytest.mark.parametrize("scheme", tuple(SCHEMES))
@pytest.mark.parametrize("case", CASES)
def test_quantize_every_projection_like_llama(case, scheme):
    fp32 = family_model(case)
    model = quantize_with(copy.deepcopy(fp32), scheme)
    error = check_quantized(model, fp32, projections(fp32))
    llama32 = llama_like(case)
    llama = quantize_with(copy.deepcopy(llama32), scheme)
    llama_error = check_quantized(llama, llama32, projections(llama32))
    # int8 rounding of every weight: an error of the order of 1e-2 for both, and of Llama's order for ours
    assert 0 < error < max(10 * llama_error, 1e-2), (error, llama_error)


@pytest.mark.parametrize("case", ("zpx", "pct"))
def test_default_quantize_filter_reaches_every_linear(case):
    """ZPX and PCT project with nn.Linear only: torchao's default call quantises every one of them."""
    fp32 = family_model(case)
    model = copy.deepcopy(fp32)
    quantize_(model, Int8WeightOnlyConfig())
    check_quantized(model, fp32, projections(fp32))


VERSOR_CASES = tuple(case for case in CASES if case.startswith("versor"))
UNREACHED = r"none of its \d+ VersorLinear projections.*filter_fn=zpx_hf.integration_torchao.is_projection"


def unreached_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "VersorLinear projections" in str(w.message)]


@pytest.mark.parametrize("case", VERSOR_CASES)
def test_default_quantize_on_versor_warns_naming_the_filter(case, recwarn):
    """torchao's default filter reaches every projection of a same-size Llama, and none of Versor's VersorLinears:
    the first forward after it says so, naming `is_projection` (or `projection_config`); the documented recipe is
    silent."""
    llama = llama_like(case)
    quantize_(llama, Int8WeightOnlyConfig())
    assert quantized(llama) == projections(llama)
    fp32 = family_model(case)
    ids = torch.randint(3, TINY_VOCAB, (1, 6))
    fp32(ids)
    model = copy.deepcopy(fp32)
    quantize_(model, Int8WeightOnlyConfig())
    assert not quantized(model) & {n for n, m in model.named_modules() if type(m).__name__ == "VersorLinear"}
    model(ids)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)  # said once per quantisation, not per forward
    said = unreached_warnings(recwarn)
    assert len(said) == 1 and re.search(UNREACHED, said[0]), said
    recwarn.clear()
    fp32(ids)
    quantize_with(copy.deepcopy(fp32), "int8-weight-only")(ids)
    assert unreached_warnings(recwarn) == []


@pytest.mark.parametrize("case", ("versor-gpa",))
def test_torchao_config_without_projection_config_warns_on_versor(case, tmp_path, recwarn):
    # GPA-only: TorchAoConfig leaves the tied-position lm_head in float and finds no nn.Linear else: nothing changes
    fp32 = family_model(case)
    fp32.save_pretrained(tmp_path)
    ids = torch.randint(3, TINY_VOCAB, (1, 6))
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))
    assert quantized(plain) == set()
    with pytest.warns(UserWarning, match=UNREACHED + r".*projection_config"):
        plain(ids)
    recwarn.clear()
    config = TorchAoConfig(projection_config(Int8WeightOnlyConfig()))
    AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=config)(ids)
    assert unreached_warnings(recwarn) == []


@pytest.mark.parametrize("scheme", tuple(SCHEMES))
@pytest.mark.parametrize("case", CASES)
def test_from_pretrained_torchao_config(case, scheme, tmp_path):
    fp32 = family_model(case)
    fp32.save_pretrained(tmp_path / case)
    quant_type = SCHEMES[scheme]()
    if case.startswith("versor"):  # VersorLinear is not an nn.Linear: name the projections
        quant_type = projection_config(quant_type)
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / case, quantization_config=TorchAoConfig(quant_type), device_map="cpu"
    ).eval()
    # the tied lm_head stays in float, as transformers leaves Llama's
    error = check_quantized(model, fp32, projections(fp32) - {"lm_head"})

    llama32 = llama_like(case)
    llama32.save_pretrained(tmp_path / "llama")
    llama = LlamaForCausalLM.from_pretrained(
        tmp_path / "llama", quantization_config=TorchAoConfig(SCHEMES[scheme]()), device_map="cpu"
    ).eval()
    llama_error = check_quantized(llama, llama32, projections(llama32) - {"lm_head"})
    assert 0 < error < max(10 * llama_error, 1e-2), (error, llama_error)


def test_quantized_versor_linear_is_the_per_grade_map():
    """A quantised VersorLinear computes sum_i W_q[grade(A), o, i] x[i, A] with the dequantised weight."""
    from zpx_hf.modeling_versor import VersorLinear

    layer = VersorLinear(6, 5)
    nn.init.normal_(layer.weight)
    x = torch.randn(3, 4, 6, 32)
    reference = layer(x)
    quantize_(layer, Int8WeightOnlyConfig(), filter_fn=is_projection)
    dequantized = layer.weight.dequantize()
    from zpx_hf.clifford_algebra import conformal_algebra

    grades = conformal_algebra().table("grades", x.device)
    expected = torch.einsum("goi,...ig->...og", dequantized[grades].float(), x)  # [32, out, in] by blade
    out = layer(x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert 0 < (out - reference).abs().max() < 0.05 * reference.abs().max()
