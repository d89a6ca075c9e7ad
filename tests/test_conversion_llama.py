"""`zpx-convert` (zpx_hf/conversion_llama.py, docs/design.md §3.9): a Llama, Mistral or Qwen2 checkpoint built with
transformers' own classes becomes a ZPX checkpoint with the source's logits (float64 within 1e-10, float32 within
rounding, greedy generation identical); whatever the map cannot carry is refused in one line naming it; the
learnable lambdas start at 0, receive a gradient there and move off it in training."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import TINY_VOCAB, assert_close_eps
from helpers_llama import TINY_LLAMA_SIZE, float64_norms, tiny_llama_config
from helpers_remote import run_remote_code
from transformers import (
    AttentionInterface,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from zpx_hf import PCTConfig, PCTForCausalLM, ZPXConfig, ZPXForCausalLM, convert_llama_to_zpx
from zpx_hf.conversion_llama import ConversionError
from zpx_hf.tokenization_bytes import build_byte_tokenizer
from zpx_hf_train.convert import main as convert_main

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py

SIZE = dict(TINY_LLAMA_SIZE, num_key_value_heads=2, rms_norm_eps=1e-5)
SOURCES = {
    "llama": (LlamaForCausalLM, LlamaConfig, {}),
    "llama-tied-biases": (
        LlamaForCausalLM,
        LlamaConfig,
        dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
    ),
    "llama-yarn": (
        LlamaForCausalLM,
        LlamaConfig,
        dict(
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 500.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        ),
    ),
    "llama-multi-query": (LlamaForCausalLM, LlamaConfig, dict(num_key_value_heads=1)),
    "mistral": (MistralForCausalLM, MistralConfig, dict(sliding_window=64, head_dim=8)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, dict(tie_word_embeddings=True)),
}


def save_source(name, folder, dtype=torch.float32, tokenizer=True, **overrides):
    """A tiny source checkpoint of transformers' own class, with trained-looking (non-zero) biases."""
    model_class, config_class, extra = SOURCES[name]
    torch.manual_seed(0)
    model = model_class(config_class(**{**SIZE, **extra, **overrides})).to(dtype)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            if key.endswith("bias"):
                parameter.normal_(std=0.1)
    model.save_pretrained(folder)
    if tokenizer:
        build_byte_tokenizer().save_pretrained(folder)
    return model.eval()


MICRO = Path(__file__).resolve().parents[1] / "configs" / "test-micro.yaml"
PROGRESS_BAR = re.compile(r"\d+/\d+ \[")  # transformers' tqdm bars (loading, writing shards) share stderr
IDS = torch.randint(3, TINY_VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_converted_float64_logits_equal_the_source(name, tmp_path):
    source = float64_norms(save_source(name, tmp_path / "src", torch.float64))
    convert_llama_to_zpx(tmp_path / "src", tmp_path / "zpx")
    model = ZPXForCausalLM.from_pretrained(tmp_path / "zpx").eval()
    assert model.dtype == torch.float64
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            assert (model(input_ids=IDS).logits - source(input_ids=IDS).logits).abs().max() <= 1e-10


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_converted_float32_logits_and_greedy_generation_equal_the_source(name, tmp_path):
    source = save_source(name, tmp_path / "src")
    assert convert_main([str(tmp_path / "src"), str(tmp_path / "zpx")]) == 0
    model = ZPXForCausalLM.from_pretrained(tmp_path / "zpx").eval()
    with torch.no_grad():
        assert_close_eps(model(input_ids=IDS).logits, source(input_ids=IDS).logits, ulps=64)
    settings = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(IDS[:, :6], **settings), source.generate(IDS[:, :6], **settings))


def test_checkpoint_carries_tokenizer_generation_config_card_and_remote_code(tmp_path):
    save_source("qwen2", tmp_path / "src")
    out = convert_llama_to_zpx(tmp_path / "src", tmp_path / "zpx")
    files = {path.name for path in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json", "README.md"} <= files
    assert not any(name.endswith(".bin") for name in files)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.get_vocab() == build_byte_tokenizer().get_vocab()
    source_generation = json.loads((tmp_path / "src" / "generation_config.json").read_text())
    assert json.loads((out / "generation_config.json").read_text()) == source_generation
    card = (out / "README.md").read_text()
    assert "Qwen2ForCausalLM" in card and "folder `src`" in card and "lambda_angle_heads" in card
    assert str(tmp_path) not in card  # a pushed card would publish a local path
    config = json.loads((out / "config.json").read_text())
    assert config["attention_bias"] and config["learnable_lambdas"] and config["lambda_angle"] == 0.0
    # remote code, where zpx_hf cannot be imported: the same logits
    inputs = {"input_ids": IDS}
    remote = run_remote_code(out, "AutoModelForCausalLM", inputs, tmp_path)
    with torch.no_grad():
        ours = ZPXForCausalLM.from_pretrained(out).eval()(input_ids=IDS).logits
    assert torch.equal(remote["output"], ours)


@pytest.mark.parametrize(
    "name,overrides,family,match",
    [
        ("mistral", dict(sliding_window=16), "zpx", "`sliding_window`=16"),
        ("llama", dict(hidden_act="gelu"), "zpx", "`hidden_act`='gelu'"),
        ("llama", dict(unknown_switch=True), "zpx", "`unknown_switch`=True"),
        (
            "llama",
            dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}),
            "zpx",
            "partial_rotary_factor",
        ),
        ("llama", {}, "pct", "PCT's attention"),
        ("llama", {}, "versor", "Versor's mixers"),
    ],
)
def test_what_the_map_cannot_carry_is_refused_in_one_line(name, overrides, family, match, tmp_path, capsys):
    save_source(name, tmp_path / "src", tokenizer=False, **overrides)
    with pytest.raises(ConversionError, match=match.replace("(", r"\(").replace(")", r"\)")):
        convert_llama_to_zpx(tmp_path / "src", tmp_path / "zpx", family=family)
    capsys.readouterr()
    assert convert_main([str(tmp_path / "src"), str(tmp_path / "zpx"), "--family", family]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not PROGRESS_BAR.search(line)]
    assert len(lines) == 1 and match in lines[0] and lines[0].startswith("zpx-convert: conversion error:")
    assert not (tmp_path / "zpx").exists()


def test_other_architectures_and_bad_folders_are_refused(tmp_path, capsys):
    pct = PCTForCausalLM(PCTConfig(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1))
    pct.save_pretrained(tmp_path / "pct")
    with pytest.raises(ConversionError, match="source architecture \\['PCTForCausalLM'\\] is not supported"):
        convert_llama_to_zpx(tmp_path / "pct", tmp_path / "out")
    with pytest.raises(ConversionError, match="no config.json"):
        convert_llama_to_zpx(tmp_path / "missing", tmp_path / "out")
    save_source("llama", tmp_path / "src", tokenizer=False)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    capsys.readouterr()
    assert convert_main([str(tmp_path / "src"), str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "full" / "keep.txt").exists()
    assert convert_main([str(tmp_path / "src")]) == 2  # argparse: one line too
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


ENGINE = "zpx_test_conversion_sdpa"  # a softmax engine of transformers' global registry: its own SDPA
AttentionInterface.register(ENGINE, sdpa_attention_forward)
AttentionMaskInterface.register(ENGINE, sdpa_mask)


def tiny_zpx(**overrides):
    kwargs = dict(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    kwargs.update(num_attention_heads=2, phase_channels=4, lambda_angle=0.75, lambda_sphere=-0.5)
    return ZPXConfig(**{**kwargs, **overrides})


def test_learnable_lambdas_compute_the_fixed_lambdas_model_on_every_path():
    torch.manual_seed(0)
    fixed = ZPXForCausalLM(tiny_zpx()).double().eval()
    learned = ZPXForCausalLM(tiny_zpx(learnable_lambdas=True)).double().eval()
    missing, _ = learned.load_state_dict(fixed.state_dict(), strict=False)
    assert sorted(missing) == sorted(
        f"model.layers.{i}.self_attn.lambda_{k}_heads" for i in (0, 1) for k in ("angle", "sphere")
    )
    with torch.no_grad():
        for layer in learned.model.layers:  # exactly 0.75 and -0.5 in float64
            layer.self_attn.lambda_angle_heads.fill_(0.75)
            layer.self_attn.lambda_sphere_heads.fill_(-0.5)
    for implementation in ("eager", "sdpa"):  # naive; cpu panels and the one-row decode kernel
        fixed.set_attn_implementation(implementation)
        learned.set_attn_implementation(implementation)
        with torch.no_grad():
            assert_close_eps(learned(input_ids=IDS).logits, fixed(input_ids=IDS).logits, ulps=64)
        settings = dict(
            max_new_tokens=12, do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True
        )
        ours, theirs = learned.generate(IDS[:, :5], **settings), fixed.generate(IDS[:, :5], **settings)
        assert torch.equal(ours.sequences, theirs.sequences)
    # per-head values: the term-by-term kernel and the fast forms agree, and a head's lambda changes the output
    with torch.no_grad():
        for layer in learned.model.layers:
            layer.self_attn.lambda_angle_heads.copy_(torch.tensor([0.5, -2.0]))
            layer.self_attn.lambda_sphere_heads.copy_(torch.tensor([1.5, 0.25]))
        learned.set_attn_implementation("eager")
        eager = learned(input_ids=IDS).logits
        for implementation in ("sdpa", ENGINE):  # ZPX's fast forms; a softmax engine on q^ . k^
            learned.set_attn_implementation(implementation)
            assert_close_eps(learned(input_ids=IDS).logits, eager, ulps=64)
        assert (eager - fixed(input_ids=IDS).logits).abs().max() > 1e-3


def test_converted_lambdas_grow_from_zero_and_lower_the_loss(tmp_path):
    save_source("llama", tmp_path / "src")
    model = ZPXForCausalLM.from_pretrained(convert_llama_to_zpx(tmp_path / "src", tmp_path / "zpx"))
    model.train()
    ids = torch.randint(3, TINY_VOCAB, (4, 32), generator=torch.Generator().manual_seed(3))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    attention = model.model.layers[0].self_attn
    # at lambda 0: the lambdas get a gradient, the phase encoder none (its features enter the score times lambda)
    assert attention.lambda_angle_heads.grad.abs().min() > 0 and attention.lambda_sphere_heads.grad.abs().min() > 0
    assert all(p.grad is None or not p.grad.any() for p in attention.phase_encoder.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = [loss.item()]
    for _ in range(6):
        optimizer.step()
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    lambdas = torch.stack([layer.self_attn.lambda_angle_heads for layer in model.model.layers])
    assert lambdas.abs().min() > 1e-3  # every head moved off 0
    assert any(p.grad.abs().max() > 0 for p in attention.phase_encoder.parameters())  # and now the phases learn


def converted_byte_llama(tmp_path):
    """A tiny Llama on the byte tokenizer's vocabulary, converted: what `model.init_from` continues from."""
    from zpx_hf.tokenization_bytes import VOCAB_SIZE

    torch.manual_seed(0)
    LlamaForCausalLM(tiny_llama_config(vocab_size=VOCAB_SIZE, max_position_embeddings=128)).save_pretrained(
        tmp_path / "llama"
    )
    build_byte_tokenizer().save_pretrained(tmp_path / "llama")
    return convert_llama_to_zpx(tmp_path / "llama", tmp_path / "zpx", phase_channels=4)


def init_from_config(tmp_path, model_lines):
    text = MICRO.read_text()
    model_section = text[text.index("model:\n") : text.index("data:\n")]
    text = text.replace(model_section, "model:\n" + "".join(f"  {line}\n" for line in model_lines))
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_zpx_train_continues_from_a_converted_checkpoint(tmp_path):
    from zpx_hf_train.train import load_run_config, run_training
    from zpx_hf_train.trainer import build_model

    out = converted_byte_llama(tmp_path)
    config_path = init_from_config(tmp_path, [f"init_from: {out}"])
    flags = [
        "--output_dir",
        str(tmp_path / "run"),
        "--max_steps",
        "3",
        "--eval_strategy",
        "no",
        "--save_strategy",
        "no",
    ]
    run = load_run_config(config_path, flags + ["--tasks", "mqar"])
    assert run.model_config.learnable_lambdas and run.model_config.hidden_size == 32
    model = build_model(run.model_config, None, run.mappings["model"]["init_from"]).eval()
    ids = torch.randint(3, 260, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(
            model(input_ids=ids).logits, ZPXForCausalLM.from_pretrained(out).eval()(input_ids=ids).logits
        )
    result = run_training(run)
    trained = ZPXForCausalLM.from_pretrained(result["output_dir"])
    assert all(layer.self_attn.lambda_angle_heads.abs().min() > 0 for layer in trained.model.layers)


def test_init_from_problems_are_named_before_training(tmp_path):
    from zpx_hf_train.config import ConfigError
    from zpx_hf_train.train import load_run_config, run_training

    out = converted_byte_llama(tmp_path)
    other = tmp_path / "other"
    save_source("llama", other, tokenizer=False)
    AutoTokenizer.from_pretrained(out).save_pretrained(other)
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text().replace('"<pad>"', '"<PAD>"'))
    convert_llama_to_zpx(other, tmp_path / "other-zpx")
    cases = [
        ([f"init_from: {tmp_path / 'missing'}"], "no config.json"),
        ([f"init_from: {tmp_path / 'llama'}"], "holds a 'llama' checkpoint"),
        ([f"init_from: {tmp_path / 'other-zpx'}"], "another tokenizer"),
        ([f"init_from: {out}", "lambda_angle: .nan"], "lambda_angle"),
    ]
    for lines, match in cases:
        with pytest.raises(ConfigError, match="model") as error:
            load_run_config(init_from_config(tmp_path, lines), ["--output_dir", str(tmp_path / "run")])
        assert match in str(error.value)
    run = load_run_config(
        init_from_config(tmp_path, [f"init_from: {out}", "phase_channels: 8"]),
        ["--output_dir", str(tmp_path / "run2"), "--max_steps", "1"],
    )
    with pytest.raises(ConfigError, match="does not fit the model config"):
        run_training(run)
