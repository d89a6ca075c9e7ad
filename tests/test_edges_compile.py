"""Static-cache generation through a `torch.compile(fullgraph=True)` forward: ZPX, PCT, every Versor mixer and a
same-size Llama compile their decoding step once and give the eager tokens. Versor has no static cache: the request
is ignored with Versor's own warning (each call) and its own cache grows, which compiles once with a dynamic length."""

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_config
from helpers_llama import tiny_llama_config
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import zpx_hf  # noqa: F401

NEW_TOKENS = 10


def causal_lm(case: str):
    torch.manual_seed(0)
    if case == "llama":
        return LlamaForCausalLM(tiny_llama_config()).eval()
    return AutoModelForCausalLM.from_config(make_tiny_config(case)).eval()


def prompt() -> torch.Tensor:
    return torch.randint(3, TINY_VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama", "zpx", "pct", "versor-rra", "versor-gpa", "versor-hybrid"])
def test_static_cache_generation_compiles_once_and_matches_eager(case):
    model = causal_lm(case)
    ids = prompt()
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    torch._dynamo.reset()
    # prefill, the decoding step, and at most one more (transformers' last step at the full cache length):
    # a step that recompiled per token would hit this limit and raise (fullgraph=True)
    model.forward = torch.compile(model.forward, fullgraph=True, backend="eager")
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=3, fail_on_recompile_limit_hit=True):
        compiled = model.generate(
            ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, cache_implementation="static"
        )
    assert torch.equal(compiled, expected)
