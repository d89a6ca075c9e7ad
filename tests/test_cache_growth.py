"""Decoding-step fast paths: the growing KV cache (`modeling_cache.py`) and the row-major weight copies kept
during `generate` (`modeling_blocks.kept_linear`). Each is checked against what it replaces: `torch.cat` for
the cache (exactly, bit for bit), `F.linear` and the modules' own forwards for the weights (in float64)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_VOCAB, make_tiny_config
from torch import nn
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache, DynamicLayer

from zpx_hf.modeling_blocks import CACHE_FIELD, SwiGLUMLP, keep_derived_weights, kept_linear
from zpx_hf.modeling_cache import GrowingDynamicLayer, GrowingRows, grow_dynamic_layers


def test_growing_rows_equal_concatenation_and_never_rewrite_a_returned_view():
    generator = torch.Generator().manual_seed(0)
    rows = GrowingRows()
    cached, expected, returned = None, None, []
    buffers = set()
    for step in range(300):
        new = torch.randn(2, 3, 1 if step else 17, 5, generator=generator)
        cached = rows.append(cached, new)
        expected = new if expected is None else torch.cat((expected, new), dim=-2)
        assert torch.equal(cached, expected)
        returned.append((cached, cached.clone()))
        buffers.add(rows.buffer.data_ptr())
    assert len(buffers) <= 12  # reallocated by a quarter more rows: O(log L) copies, not one per token
    assert all(torch.equal(view, copy) for view, copy in returned)


def test_growing_rows_copy_a_shortened_or_replaced_cache_before_writing():
    rows = GrowingRows()
    first = rows.append(None, torch.arange(8.0).view(1, 1, 8, 1))
    snapshot = first.clone()
    # crop (a shorter view of the same buffer): the next rows must not land in `first`
    cropped = first[..., :5, :]
    grown = rows.append(cropped, torch.full((1, 1, 2, 1), -1.0))
    assert torch.equal(first, snapshot)
    assert torch.equal(grown, torch.cat((snapshot[..., :5, :], torch.full((1, 1, 2, 1), -1.0)), dim=-2))
    # a replaced tensor of the same length and strides (as beam reordering leaves it)
    replaced = rows.buffer.clone()[..., : grown.shape[-2], :].mul_(2)
    one = torch.ones(1, 1, 1, 1)
    assert torch.equal(rows.append(replaced, one), torch.cat((replaced, one), dim=-2))


def test_growing_rows_follow_cat_for_gradients_dtypes_and_shapes():
    rows = GrowingRows()
    cached = rows.append(None, torch.randn(1, 2, 3, 4))
    new = torch.randn(1, 2, 1, 4, requires_grad=True)
    out = rows.append(cached, new)
    assert out.grad_fn is not None and torch.equal(out, torch.cat((cached, new), dim=-2))
    out.sum().backward()
    assert torch.equal(new.grad, torch.ones_like(new))
    promoted = rows.append(out.detach(), torch.randn(1, 2, 1, 4, dtype=torch.float64))
    assert promoted.dtype == torch.float64  # as torch.cat promotes
    with pytest.raises(RuntimeError):
        rows.append(promoted, torch.randn(2, 2, 1, 4, dtype=torch.float64))  # batch mismatch: cat's error


def test_growing_rows_continue_outside_inference_mode():
    rows = GrowingRows()
    with torch.inference_mode():
        cached = rows.append(None, torch.randn(1, 2, 3, 4))
    new = torch.randn(1, 2, 1, 4)
    with torch.no_grad():  # writing into the inference-mode buffer here would raise
        assert torch.equal(rows.append(cached, new), torch.cat((cached, new), dim=-2))


def test_grow_dynamic_layers_replaces_only_plain_dynamic_layers():
    cache = DynamicCache()
    grow_dynamic_layers(cache)
    key = torch.randn(1, 2, 4, 8)
    cache.update(key, key, 0)
    assert type(cache.layers[0]) is GrowingDynamicLayer
    filled = DynamicCache()
    filled.update(key, key, 0)
    assert type(filled.layers[0]) is DynamicLayer
    grow_dynamic_layers(filled)  # a filled layer keeps its rows
    keys, _ = filled.update(key[..., :1, :], key[..., :1, :], 0)
    assert torch.equal(keys, torch.cat((key, key[..., :1, :]), dim=-2))
    filled.crop(-2)
    assert filled.get_seq_length() == 3


@pytest.mark.parametrize("case", ["zpx", "pct"])
def test_generate_uses_growing_layers_and_matches_recomputation(case):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_tiny_config(case)).eval()
    prompt = torch.randint(3, TINY_VOCAB, (2, 5))
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=70, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True
        )
        cache = out.past_key_values if hasattr(out, "past_key_values") else getattr(out, CACHE_FIELD)
        assert all(type(layer) is GrowingDynamicLayer for layer in cache.layers)
        full = model(input_ids=out.sequences[:, :-1], use_cache=False).logits[:, prompt.shape[1] - 1 :]
    generated = torch.stack(out.logits, dim=1)
    torch.testing.assert_close(generated, full, rtol=0, atol=1e-4 * full.abs().max().item())


def _linears(bias: bool) -> tuple[nn.Linear, ...]:
    torch.manual_seed(0)
    return tuple(nn.Linear(12, width, bias=bias).double() for width in (7, 5))


@pytest.mark.parametrize("bias", [False, True])
def test_kept_linear_equals_the_modules_inside_generate_only(bias):
    linears = _linears(bias)
    x = torch.randn(3, 1, 12, dtype=torch.float64)
    expected = torch.cat([F.linear(x, m.weight, m.bias) for m in linears], dim=-1)
    with torch.no_grad():
        assert kept_linear(x, linears) is None  # outside generate: nothing kept
        with keep_derived_weights():
            torch.testing.assert_close(kept_linear(x, linears), expected, rtol=1e-12, atol=1e-12)
    with keep_derived_weights():
        assert kept_linear(x, linears) is None  # gradients recorded: the modules run
    handle = linears[0].register_forward_hook(lambda *args: None)
    with torch.no_grad(), keep_derived_weights():
        assert kept_linear(x, linears) is None  # a hook must see its input
    handle.remove()


def test_swiglu_mlp_kept_path_equals_its_modules():
    torch.manual_seed(0)
    mlp = SwiGLUMLP(12, 20, bias=True).double()
    x = torch.randn(2, 3, 12, dtype=torch.float64)
    with torch.no_grad():
        expected = mlp(x)
        with keep_derived_weights():
            torch.testing.assert_close(mlp(x), expected, rtol=1e-12, atol=1e-12)
