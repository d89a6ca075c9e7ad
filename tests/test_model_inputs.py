"""Bad model inputs fail early with a `ValueError` that names the argument and the fix, in every family;
beside each, what a same-size `LlamaForCausalLM` does (a traceback, a silent result or an error: ours must
be at least as clear)."""

import pytest
import torch
from conftest import TINY_VOCAB, make_tiny_config
from helpers_llama import tiny_llama_config
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, LlamaForCausalLM

FAMILY_CASES = ["zpx", "pct", "versor-hybrid"]
IDS = torch.randint(3, TINY_VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))


def causal_lm(case, dtype=torch.float32):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_tiny_config(case)).to(dtype).eval()


def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config()).eval()


def width(model):
    return model.get_input_embeddings().weight.shape[-1]


BAD_INPUTS = {
    "labels [1, 16] for [2, 8]": (lambda m: dict(input_ids=IDS, labels=IDS.reshape(1, 16)), r"`labels`.*\(2, 8\)"),
    "labels [16] for [2, 8]": (lambda m: dict(input_ids=IDS, labels=IDS.reshape(16)), r"`labels`.*\(2, 8\)"),
    "labels [2, 7] for [2, 8]": (lambda m: dict(input_ids=IDS, labels=IDS[:, 1:]), r"`labels`.*\(2, 8\)"),
    "float labels": (lambda m: dict(input_ids=IDS, labels=IDS.float()), "`labels`.*integer"),
    "labels with logits_to_keep": (lambda m: dict(input_ids=IDS, labels=IDS, logits_to_keep=1), "`logits_to_keep`"),
    "empty sequence": (lambda m: dict(input_ids=IDS[:, :0]), "`input_ids` is empty.*BOS"),
    "batch 0": (lambda m: dict(input_ids=IDS[:0]), "`input_ids` is empty"),
    "empty inputs_embeds": (lambda m: dict(inputs_embeds=torch.zeros(2, 0, width(m))), "`inputs_embeds` is empty"),
    "position_ids batch 3 for batch 2": (
        lambda m: dict(input_ids=IDS, position_ids=torch.arange(8).expand(3, 8)),
        r"`position_ids` must be \[batch=2",
    ),
    "float position_ids": (
        lambda m: dict(input_ids=IDS, position_ids=torch.arange(8.0)[None]),
        "`position_ids` must be an integer",
    ),
    "float64 inputs_embeds into float32": (
        lambda m: dict(inputs_embeds=torch.randn(2, 8, width(m), dtype=torch.float64)),
        r"`inputs_embeds` are torch.float64.*\.to\(model.dtype\)",
    ),
}


def outcome(model, kwargs):
    try:
        with torch.no_grad():
            model(**kwargs)
    except Exception as error:  # any error: recording what Llama does, whatever it is
        return type(error).__name__
    return "no error"


@pytest.mark.parametrize("name", list(BAD_INPUTS))
@pytest.mark.parametrize("case", FAMILY_CASES)
def test_bad_input_names_the_argument(case, name):
    model = causal_lm(case)
    build, match = BAD_INPUTS[name]
    with pytest.raises(ValueError, match=match), torch.no_grad():
        model(**build(model))


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_at_least_as_clear_as_llama(name, capsys):
    """Llama's outcome is recorded, not asserted (it may change between transformers releases); ours is a
    ValueError naming the argument whatever Llama does."""
    build, match = BAD_INPUTS[name]
    reference = llama()
    with capsys.disabled():
        print(f"\n  Llama, {name}: {outcome(reference, build(reference))}")
    model = causal_lm("zpx")
    with pytest.raises(ValueError, match=match), torch.no_grad():
        model(**build(model))


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_misshaped_labels_would_have_given_a_loss(case):
    """What the check prevents: the same count of targets, reshaped, gives a finite but misaligned loss."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    model = causal_lm(case)
    with torch.no_grad():
        logits = model(input_ids=IDS).logits
        right = ForCausalLMLoss(logits, IDS, vocab_size=TINY_VOCAB)
        wrong = ForCausalLMLoss(logits.reshape(1, 16, -1), IDS.reshape(1, 16), vocab_size=TINY_VOCAB)
        assert torch.isfinite(wrong) and not torch.equal(right, wrong)
        assert torch.equal(model(input_ids=IDS, labels=IDS).loss, right)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_generate_from_an_empty_prompt_names_the_fix(case):
    model = causal_lm(case)
    with pytest.raises(ValueError, match="`input_ids` is empty.*generate"):
        model.generate(IDS[:1, :0], max_new_tokens=2, do_sample=False, pad_token_id=0)
    one_token = torch.full((1, 1), model.config.bos_token_id)
    assert model.generate(one_token, max_new_tokens=2, do_sample=False, pad_token_id=0).shape == (1, 3)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_shared_position_ids_are_accepted(case):
    model = causal_lm(case)
    with torch.no_grad():
        default = model(input_ids=IDS).logits
        for positions in (torch.arange(8), torch.arange(8)[None], torch.arange(8).expand(2, 8)):
            torch.testing.assert_close(model(input_ids=IDS, position_ids=positions).logits, default, rtol=0, atol=0)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_inputs_embeds_dtype_follows_the_model(case):
    model = causal_lm(case, dtype=torch.float64)
    embeds = model.get_input_embeddings()(IDS)
    with torch.no_grad():
        expected = model(input_ids=IDS).logits
        torch.testing.assert_close(model(inputs_embeds=embeds).logits, expected, rtol=0, atol=0)
        with pytest.raises(ValueError, match="`inputs_embeds` are torch.float32"):
            model(inputs_embeds=embeds.float())


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_sequence_classification_labels_one_per_sequence(case):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(make_tiny_config(case, num_labels=3)).eval()
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=IDS, labels=torch.tensor([0, 2])).loss)
        for labels in (torch.tensor([0, 2, 1, 0]), torch.tensor(1), torch.zeros(2, 8, dtype=torch.long)):
            with pytest.raises(ValueError, match=r"`labels` must be \[batch=2\]"):
                model(input_ids=IDS, labels=labels)
