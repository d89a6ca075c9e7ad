"""Packed sequences through the models (flash-linear-attention's model-test shape): a packed batch equals each
document run alone (logits and every parameter gradient; float64), documents from `position_ids` or
`cu_seq_lens`; `DataCollatorWithFlattening` and `trl.SFTTrainer(packing=True)` give the loss of the unpacked
documents; cached token-by-token decoding with random left padding equals one uncached forward.

Reference: transformers' `LlamaForCausalLM` of the same size keeps documents apart under sdpa/eager too when
positions restart and no attention mask is given (its masks read packed sequences from `position_ids`), so
the collator test checks it alongside ours.
"""

import pytest
import torch
from conftest import TINY_VOCAB, assert_close_eps, make_tiny_config
from helpers_llama import tiny_llama_config
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening

from zpx_hf import ops_pct_panel, ops_zpx_panel

FAMILIES = ["zpx", "pct"]
DOCUMENTS = [7, 12, 1, 5]


def causal_lm(family, implementation, dtype=torch.float64, seed=0, **overrides):
    torch.manual_seed(seed)
    if family == "llama":
        config = tiny_llama_config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    else:
        config = make_tiny_config(family, **overrides)
    return AutoModelForCausalLM.from_config(config, attn_implementation=implementation).to(dtype).eval()


def documents(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, TINY_VOCAB, (n,), generator=g) for n in DOCUMENTS]


def packed_inputs(docs):
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
    cu = torch.tensor([0] + [len(d) for d in docs]).cumsum(0).to(torch.int32)
    return ids, positions, cu


def gradients(model, loss):
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for n, p in model.named_parameters() if p.requires_grad], allow_unused=True)
    return {n: g for n, g in zip(names, grads) if g is not None}


@pytest.mark.parametrize("source", ["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_row_equals_each_document_alone(family, implementation, source, monkeypatch):
    """Logits and every gradient, float64; ZPX with its centre loss (summed per document); several panels."""
    monkeypatch.setattr(ops_pct_panel, "PANEL_ROWS", 4)
    monkeypatch.setattr(ops_zpx_panel, "MASK_ELEMENTS", 8 * 25)
    overrides = {"center_loss_weight": 0.3} if family == "zpx" else {}
    model = causal_lm(family, implementation, **overrides)
    docs = documents()
    ids, positions, cu = packed_inputs(docs)
    kwargs = {"position_ids": positions} if source == "position_ids" else {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu}
    out = model(input_ids=ids, use_cache=False, **kwargs)
    weights = torch.randn(out.logits.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss = (out.logits * weights).sum()
    separate_logits, separate_loss, center = [], 0.0, []
    start = 0
    for doc in docs:
        alone = model(input_ids=doc[None], use_cache=False)
        separate_logits.append(alone.logits)
        separate_loss = separate_loss + (alone.logits * weights[:, start : start + len(doc)]).sum()
        if family == "zpx":
            center.append(alone.center_loss)
        start += len(doc)
    torch.testing.assert_close(out.logits, torch.cat(separate_logits, dim=1), rtol=1e-10, atol=1e-10)
    if family == "zpx":  # per document: the mean of each document's own centre loss
        expected_center = torch.stack(center).mean()
        torch.testing.assert_close(out.center_loss, expected_center, rtol=1e-10, atol=1e-12)
        loss, separate_loss = loss + out.center_loss, separate_loss + expected_center
    packed_grads, separate_grads = gradients(model, loss), gradients(model, separate_loss)
    assert packed_grads.keys() == separate_grads.keys() and len(packed_grads) > 8
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, separate_grads[name], rtol=1e-9, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_row_fp32_within_eps_bound(family):
    model = causal_lm(family, "sdpa", dtype=torch.float32)
    docs = documents(seed=2)
    ids, positions, _ = packed_inputs(docs)
    packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    separate = torch.cat([model(input_ids=d[None], use_cache=False).logits for d in docs], dim=1)
    scale = separate.abs().max().clamp(min=1.0)
    assert (packed - separate).abs().max() <= 256 * torch.finfo(torch.float32).eps * scale


def unpacked_loss(model, docs):
    """HF's causal-LM loss over the documents as one right-padded batch (labels -100 on padding)."""
    length = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, doc in enumerate(docs):
        ids[row, : len(doc)], mask[row, : len(doc)] = doc, 1
    labels = ids.masked_fill(mask == 0, -100)
    return model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss


@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("family", FAMILIES + ["llama"])
def test_data_collator_with_flattening_gives_the_unpacked_loss(family, flash_kwargs):
    model = causal_lm(family, "sdpa")
    docs = [d for d in documents(seed=3) if len(d) > 1]
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs, return_tensors="pt")
    batch = collator([{"input_ids": d.tolist()} for d in docs])
    assert "attention_mask" not in batch
    packed = model(**batch, use_cache=False).loss
    # float64 models, but transformers' causal-LM loss upcasts logits with `.float()`: the loss is float32
    assert packed.dtype == torch.float32
    assert_close_eps(packed, unpacked_loss(model, docs), ulps=8)


@pytest.mark.parametrize("family", FAMILIES + ["versor-rra", "versor-gpa", "versor-hybrid"])
def test_sft_trainer_packing_gives_the_unpacked_loss(family, tmp_path):
    """TRL's BFD packing (padding-free rows, restarting position_ids, cu_seq_lens) trains on the same loss."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    from zpx_hf.tokenization_bytes import build_byte_tokenizer

    model = causal_lm(family, "sdpa", dtype=torch.float32)
    tokenizer = build_byte_tokenizer()
    docs = [d for d in documents(seed=4) if len(d) > 1]
    dataset = Dataset.from_dict({"input_ids": [d.tolist() for d in docs]})
    losses = {}
    for packing in (True, False):
        args = trl.SFTConfig(
            output_dir=str(tmp_path / str(packing)), packing=packing, max_length=64, per_device_train_batch_size=8,
            report_to=[], use_cpu=True, dataset_num_proc=None, eos_token=None,
        )  # fmt: skip
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        batch = next(iter(trainer.get_train_dataloader()))
        if packing:
            assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch
        with torch.no_grad():
            losses[packing] = model(**batch, use_cache=False).loss  # seq_idx, cu_seq_lens included
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decoding_with_random_left_padding_equals_one_forward(family, implementation):
    model = causal_lm(family, implementation)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, TINY_VOCAB, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate(torch.randint(0, 6, (3,), generator=g).tolist()):
        mask[row, :pad] = 0
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        out = model(input_ids=ids[:, :1], attention_mask=mask[:, :1], use_cache=True)
        steps = [out.logits]
        cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
        for t in range(1, ids.shape[1]):
            out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], past_key_values=cache)
            cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
            steps.append(out.logits)
    real = mask.bool()
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], rtol=1e-9, atol=1e-9)


def test_packed_rows_with_a_cache_of_past_tokens_fail_clearly():
    model = causal_lm("zpx", "sdpa")
    ids, positions, _ = packed_inputs(documents())
    out = model(input_ids=ids[:, :3], use_cache=True)
    cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
    with pytest.raises(ValueError, match="cannot continue a cache"):
        model(input_ids=ids[:, 3:], position_ids=positions[:, 3:], past_key_values=cache)
