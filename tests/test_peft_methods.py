"""PEFT methods on every family: LoRA with default targets (Versor's grade-wise LoRA included), prompt tuning,
prefix tuning (ZPX, PCT) and its refusal for Versor. Each working method trains (loss drops), generates, and
saves/reloads to identical outputs; LoRA also merges to the adapted model's logits (float64).

Every other method with per-model-type defaults (OFT, IA3, LoHa, LoKr, DoRA, AdaLoRA, VeRA, BOFT) runs with default
targets on ZPX, PCT and a same-size Llama: identity at init, adapter == merged, reload exact; on Versor it is refused
in one line that names the method and the reason."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import TINY_VOCAB, assert_close_eps, make_tiny_config
from helpers_llama import like_llama, tiny_llama_config

peft = pytest.importorskip("peft")

from peft import PeftModel  # noqa: E402
from peft.utils import constants as peft_constants  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: E402

import zpx_hf  # noqa: E402

# only this module imports integration_peft by name: present now means `import zpx_hf` loaded it
REGISTERED_BY_IMPORT_ZPX_HF = "zpx_hf.integration_peft" in sys.modules

from zpx_hf.clifford_algebra import conformal_algebra, rotor_exp_matrix, sandwich  # noqa: E402
from zpx_hf.integration_peft import VersorLoraLinear, versor_lora_config  # noqa: E402
from zpx_hf.modeling_versor import VersorLinear  # noqa: E402

FAMILY_CASES = ("zpx", "pct", "versor-hybrid")  # hybrid: layer 0 is RRA, layer 1 is GPA
# the modules LoRA's default targets must wrap, written out per tiny config
DEFAULT_LORA_MODULES = {
    "zpx": {f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj")},
    "pct": {
        f"model.layers.{i}.self_attn.{p}.{part}"
        for i in range(2)
        for p in ("q_proj", "v_proj")
        for part in ("real", "imag")
    },
    "versor-hybrid": {"model.layers.0.mixer.v_proj", "model.layers.1.mixer.q_proj", "model.layers.1.mixer.v_proj"},
}


def base_model(case: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    torch.manual_seed(seed)
    if case == "llama":  # the same size as the tiny ZPX / PCT configs
        config = tiny_llama_config()
        return LlamaForCausalLM(config).to(dtype).eval()
    return AutoModelForCausalLM.from_config(make_tiny_config(case)).to(dtype).eval()


def batch(seed: int = 0, shape: tuple[int, int] = (2, 8)) -> torch.Tensor:
    return torch.randint(3, TINY_VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def losses_around_training(model, ids: torch.Tensor, steps: int, lr: float) -> tuple[float, float]:
    """(loss before, loss after) `steps` AdamW steps on one batch, both in eval mode."""
    params = [p for p in model.parameters() if p.requires_grad]
    assert params, "nothing to train"
    with torch.no_grad():
        before = model.eval()(input_ids=ids, labels=ids).loss.item()
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        after = model.eval()(input_ids=ids, labels=ids).loss.item()
    return before, after


def reload_adapter(case: str, base_state: dict, path, dtype: torch.dtype):
    fresh = base_model(case, dtype, seed=123)  # different init: every base weight must come from base_state
    fresh.load_state_dict(base_state)
    return PeftModel.from_pretrained(fresh, path).eval()


def assert_generate_equal(a, b, ids: torch.Tensor, **kwargs) -> None:
    out_a = a.generate(input_ids=ids, max_new_tokens=3, do_sample=False, **kwargs)
    out_b = b.generate(input_ids=ids, max_new_tokens=3, do_sample=False, **kwargs)
    assert out_a.shape == (ids.shape[0], ids.shape[1] + 3)
    assert torch.equal(out_a, out_b)


# ---------------------------------------------------------------------------------------------- defaults


def test_default_targets_are_registered_for_every_family():
    lora = peft_constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    assert lora["zpx"] == lora["llama"] == ["q_proj", "v_proj"]
    assert sorted(lora["pct"]) == ["q_proj.imag", "q_proj.real", "v_proj.imag", "v_proj.real"]
    assert lora["versor"] == ["q_proj", "v_proj"]
    for family, targets in zpx_hf.integration_peft.LORA_TARGET_MODULES.items():  # the table the training stack reads
        assert sorted(lora[family]) == sorted(targets), family
    # methods sharing Llama's q/v default get the zpx/pct defaults; they wrap nn.Linear only, so not versor
    loha = peft_constants.TRANSFORMERS_MODELS_TO_LOHA_TARGET_MODULES_MAPPING
    assert loha["zpx"] == lora["zpx"] and loha["pct"] == lora["pct"] and "versor" not in loha
    # a second registration keeps entries (a user's own choice wins) and does not wrap PEFT twice
    prepare = peft.tuners.lora.LoraModel._prepare_adapter_config
    lora["zpx"] = ["o_proj"]
    try:
        zpx_hf.integration_peft.register()
        assert lora["zpx"] == ["o_proj"]
    finally:
        lora["zpx"] = ["q_proj", "v_proj"]
    assert peft.tuners.lora.LoraModel._prepare_adapter_config is prepare


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_lora_default_targets_wrap_the_documented_modules(case):
    model = peft.get_peft_model(base_model(case), peft.LoraConfig(task_type="CAUSAL_LM"))
    wrapped = {
        name.removeprefix("base_model.model.")
        for name, module in model.named_modules()
        if isinstance(module, peft.tuners.lora.LoraLayer)
    }
    assert wrapped == DEFAULT_LORA_MODULES[case]
    if case.startswith("versor"):
        assert all(isinstance(model.get_submodule(f"base_model.model.{n}"), VersorLoraLinear) for n in wrapped)


def test_loha_default_targets_work_for_zpx_and_pct():
    for case in ("zpx", "pct"):
        model = peft.get_peft_model(base_model(case), peft.LoHaConfig(task_type="CAUSAL_LM"))
        assert model.get_nb_trainable_parameters()[0] > 0
        assert torch.isfinite(model(input_ids=batch()).logits).all()


# ---------------------------------------------------------------------------------------------- LoRA


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_lora_trains_saves_reloads_and_merges(case, tmp_path):
    dtype = torch.float64  # merge vs adapter differ by summation order only: float64 keeps that at ~1e-15
    model = base_model(case, dtype)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = batch()
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits
    peft_model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8))
    before, after = losses_around_training(peft_model, ids, steps=6, lr=2e-2)
    assert after < before - 0.05, (before, after)

    with torch.no_grad():
        adapted = peft_model(input_ids=ids).logits
    assert (adapted - base_logits).abs().max() > 1e-3  # the trained adapter changes the model
    peft_model.save_pretrained(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").is_file()
    reloaded = reload_adapter(case, base_state, tmp_path, dtype)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, adapted)
    assert_generate_equal(peft_model, reloaded, ids[:, :5])

    merged = reloaded.merge_and_unload()
    assert not any(isinstance(m, peft.tuners.lora.LoraLayer) for m in merged.modules())
    with torch.no_grad():
        merged_logits = merged(input_ids=ids).logits
    torch.testing.assert_close(merged_logits, adapted, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------- every method

# PEFT methods whose defaults are per model type, as a user writes them (block sizes that divide the tiny widths)
METHODS = {
    "OFT": lambda: peft.OFTConfig(task_type="CAUSAL_LM", r=0, oft_block_size=4),
    "IA3": lambda: peft.IA3Config(task_type="CAUSAL_LM"),
    "LOHA": lambda: peft.LoHaConfig(task_type="CAUSAL_LM", r=4),
    "LOKR": lambda: peft.LoKrConfig(task_type="CAUSAL_LM", r=4),
    "DORA": lambda: peft.LoraConfig(task_type="CAUSAL_LM", r=4, use_dora=True),
    "ADALORA": lambda: peft.AdaLoraConfig(task_type="CAUSAL_LM", init_r=4, target_r=2, total_step=10),
    "VERA": lambda: peft.VeraConfig(task_type="CAUSAL_LM", r=4),
    "BOFT": lambda: peft.BOFTConfig(task_type="CAUSAL_LM", boft_block_size=4),
}
METHOD_FAMILIES = ("llama", "zpx", "pct")
FLOAT64_TOLERANCE = 1e-10  # logits of order 1: summation-order differences are ~1e-15


def adapted_module_names(model) -> set[str]:
    return {
        name.removeprefix("base_model.model.")
        for name, module in model.named_modules()
        if isinstance(module, peft.tuners.tuners_utils.BaseTunerLayer)
    }


@torch.no_grad()
def perturb_adapters(peft_model) -> None:
    """Move every trainable adapter weight off its identity init (a trained adapter, without the training time).
    AdaLoRA's `ranknum` (a rank-count constant PEFT 0.21 leaves trainable and does not save) is left alone."""
    generator = torch.Generator().manual_seed(7)
    for name, parameter in peft_model.named_parameters():
        if parameter.requires_grad and "ranknum" not in name:
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.add_(0.1 * noise)


def test_every_peft_default_table_with_a_llama_entry_has_the_families():
    tables = zpx_hf.integration_peft.peft_default_mappings()
    assert {
        "TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING",
        "TRANSFORMERS_MODELS_TO_OFT_TARGET_MODULES_MAPPING",
    } <= set(tables)
    for name, table in tables.items():
        llama = table["llama"]
        assert table["zpx"] == llama, name
        pct = [f"{n}.{part}" for n in llama if n != "gate_proj" and n.endswith("_proj") for part in ("real", "imag")]
        assert sorted(table["pct"]) == sorted(pct + [n for n in llama if not n.endswith("_proj")]), name
        if name != "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING":  # LoRA: VersorLoraLinear's q/v
            assert ("versor" in table) == all(n.endswith("norm") for n in llama), name


@pytest.mark.parametrize("case", METHOD_FAMILIES)
@pytest.mark.parametrize("method", METHODS)
def test_method_with_default_targets_is_identity_merges_and_reloads(method, case, tmp_path):
    model = base_model(case, torch.float64)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = batch()
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits
    peft_model = peft.get_peft_model(model, METHODS[method]())
    wrapped = adapted_module_names(peft_model)
    # the family's counterpart of Llama's default: PCT adapts both parts of each complex projection
    llama_like = {n.removesuffix(".real").removesuffix(".imag") for n in wrapped}
    assert wrapped and all(n.endswith((".real", ".imag")) for n in wrapped) == (case == "pct")
    assert len(wrapped) == len(llama_like) * (2 if case == "pct" else 1)
    with torch.no_grad():
        initial = peft_model(input_ids=ids).logits
    torch.testing.assert_close(initial, base_logits, rtol=0, atol=FLOAT64_TOLERANCE)  # identity at init

    perturb_adapters(peft_model)
    with torch.no_grad():
        adapted = peft_model(input_ids=ids).logits
    assert (adapted - base_logits).abs().max() > 1e-3, "the perturbed adapter does not change the model"

    peft_model.save_pretrained(tmp_path)
    reloaded = reload_adapter(case, base_state, tmp_path, torch.float64)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, adapted)
    merged = reloaded.merge_and_unload()
    assert not any(isinstance(m, peft.tuners.tuners_utils.BaseTunerLayer) for m in merged.modules())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted, rtol=0, atol=FLOAT64_TOLERANCE)


@pytest.mark.parametrize("method", METHODS)
def test_versor_refuses_other_methods_in_one_line(method):
    with pytest.raises(ValueError, match="VersorLinear") as error:
        peft.get_peft_model(base_model("versor-hybrid"), METHODS[method]())
    message = str(error.value)
    assert "\n" not in message
    assert ("DoRA" if method == "DORA" else method) in message and "VersorLinear" in message


def test_versor_refuses_other_methods_on_named_projections_and_all_linear():
    for targets, match in ((["q_proj"], "match model.layers.1.mixer.q_proj"), ("all-linear", "all-linear")):
        with pytest.raises(ValueError, match=match):
            peft.get_peft_model(
                base_model("versor-hybrid"), peft.IA3Config(target_modules=targets, feedforward_modules=[])
            )
    # an nn.Linear named explicitly is PEFT's usual case
    model = peft.get_peft_model(
        base_model("versor-hybrid"), peft.IA3Config(target_modules=["bivector_proj"], feedforward_modules=[])
    )
    assert adapted_module_names(model) == {"model.layers.0.mixer.bivector_proj"}


def test_all_linear_lora_on_versor_wraps_every_projection():
    model = base_model("versor-hybrid", torch.float64)
    projections = {  # every VersorLinear and nn.Linear inside the decoder layers, written out
        f"model.layers.{i}.{name}"
        for i, mixer in ((0, ("v_proj", "o_proj", "bivector_proj")), (1, ("q_proj", "k_proj", "v_proj", "o_proj")))
        for name in [f"mixer.{p}" for p in mixer] + [f"mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
    }
    ids = batch()
    peft_model = peft.get_peft_model(model, peft.LoraConfig(target_modules="all-linear", init_lora_weights=False))
    assert adapted_module_names(peft_model) == projections
    with torch.no_grad():  # the gate's scalar part now runs through the adapted gate_proj: merged must agree
        adapted = peft_model(input_ids=ids).logits
        merged = peft_model.merge_and_unload()(input_ids=ids).logits
    torch.testing.assert_close(merged, adapted, rtol=0, atol=FLOAT64_TOLERANCE)


def test_complex_linear_hands_its_parts_the_input_rank_of_a_linear():
    model = base_model("pct", torch.float64)
    peft_model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", init_lora_weights=False)).eval()
    ranks = []
    layer = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    hooks = [
        part.register_forward_pre_hook(lambda m, args: ranks.append(args[0].shape)) for part in (layer.real, layer.imag)
    ]
    ids = batch()
    with torch.no_grad():
        adapted = peft_model(input_ids=ids).logits
        mixed = peft_model(input_ids=ids, adapter_names=["default", "__base__"]).logits  # indexes the batch
        with peft_model.disable_adapter():
            base_logits = peft_model(input_ids=ids).logits
    for hook in hooks:
        hook.remove()
    assert ranks and all(shape[:2] == ids.shape and len(shape) == 3 for shape in ranks)
    assert (adapted - base_logits).abs().max() > 1e-3
    torch.testing.assert_close(mixed[0], adapted[0], rtol=0, atol=FLOAT64_TOLERANCE)
    torch.testing.assert_close(mixed[1], base_logits[1], rtol=0, atol=FLOAT64_TOLERANCE)


# ---------------------------------------------------------------------------------------------- Versor LoRA layer


def adapted_versor_linear(dropout: float = 0.0) -> VersorLoraLinear:
    torch.manual_seed(3)
    base = VersorLinear(5, 4).double()
    torch.nn.init.normal_(base.weight)
    config = peft.LoraConfig(r=2, lora_alpha=3, init_lora_weights=False, lora_dropout=dropout)
    return VersorLoraLinear(base, "default", config=config, r=2, lora_alpha=3).double()


def test_versor_lora_is_a_gradewise_low_rank_update():
    layer = adapted_versor_linear().eval()
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert a.shape == (6, 2, 5) and b.shape == (6, 4, 2)
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    # reference: y[n, o, A] = sum_i (W + 3/2 B A)[grade(A), o, i] x[n, i, A], blade by blade
    grades = conformal_algebra().grades
    weight = layer.base_layer.weight + 1.5 * torch.stack([b[g] @ a[g] for g in range(6)])
    expected = torch.stack([x[:, :, blade] @ weight[grades[blade]].T for blade in range(32)], dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
        assert (layer(x) - layer.base_layer(x)).abs().max() > 1e-2  # the adapter is not zero


@pytest.mark.parametrize("training", [False, True])
def test_versor_lora_commutes_with_rotor_sandwiches(training):
    # a rotor of rotations and boosts acts on every channel; a grade-wise update (and channel dropout) commutes
    layer = adapted_versor_linear(dropout=0.5).train(training)
    rotor = rotor_exp_matrix(torch.randn(10, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    with torch.no_grad():
        if training:  # dropout is active: two calls drop different channels
            assert not torch.equal(layer(x), layer(x))
        torch.manual_seed(5)
        rotated_first = layer(sandwich(rotor, x))
        torch.manual_seed(5)  # the same dropout mask for both orders
        rotated_after = sandwich(rotor, layer(x))
    torch.testing.assert_close(rotated_first, rotated_after, rtol=1e-10, atol=1e-10)


def test_versor_lora_disable_and_mixed_adapter_batches():
    model = base_model("versor-hybrid", torch.float64)  # the mixed batch sums in another order: float64
    ids = batch()
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits
    peft_model = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False)).eval()
    with torch.no_grad():
        adapted = peft_model(input_ids=ids).logits
        mixed = peft_model(input_ids=ids, adapter_names=["default", "__base__"]).logits
        with peft_model.disable_adapter():
            disabled = peft_model(input_ids=ids).logits
    assert (adapted - base_logits).abs().max() > 1e-3
    assert_close_eps(disabled, base_logits, ulps=64)
    torch.testing.assert_close(mixed[0], adapted[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mixed[1], base_logits[1], rtol=1e-12, atol=1e-12)


def test_versor_lora_refuses_options_it_cannot_honour():
    base = VersorLinear(3, 3)
    for kwargs, match in [
        (dict(lora_bias=True), "lora_bias"),
        (dict(init_lora_weights="pissa"), "init_lora_weights"),
        (dict(use_dora=True), "DoRA .*use_dora=True.* not available for VersorLinear"),
    ]:
        with pytest.raises(ValueError, match=match):
            VersorLoraLinear(base, "default", config=peft.LoraConfig(r=2, **kwargs), r=2, lora_alpha=2)


def test_versor_lora_refuses_a_base_that_is_not_a_versor_linear():
    """A VersorLoraLinear registered for another layer type (`_register_custom_module`) says what it adapts."""
    with pytest.raises(TypeError, match="VersorLoraLinear adapts a VersorLinear, not Linear"):
        VersorLoraLinear(torch.nn.Linear(3, 3), "default", config=peft.LoraConfig(r=2), r=2, lora_alpha=2)


def test_versor_lora_config_adapts_plain_modules(tmp_path):
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = VersorLinear(4, 4)
            torch.nn.init.normal_(self.proj.weight)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x)

    torch.manual_seed(6)
    net = Net()
    state = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(2, 4, 32)
    with pytest.raises(ValueError, match="not supported"):  # a plain LoraConfig does not know VersorLinear
        peft.get_peft_model(Net(), peft.LoraConfig(target_modules=["proj"]))
    adapted = peft.get_peft_model(net, versor_lora_config(target_modules=["proj"], init_lora_weights=False))
    with torch.no_grad():
        expected = adapted(x)
    adapted.save_pretrained(tmp_path)
    fresh = Net()
    fresh.load_state_dict(state)
    config = versor_lora_config(**peft.LoraConfig.from_pretrained(tmp_path).to_dict())
    with torch.no_grad():
        assert torch.equal(PeftModel.from_pretrained(fresh, tmp_path, config=config)(x), expected)


# ---------------------------------------------------------------------------------------------- prompt / prefix


PROMPT_METHODS = [("prompt", case) for case in FAMILY_CASES] + [("prefix", "zpx"), ("prefix", "pct")]


def prompt_config(method: str):
    cls = peft.PromptTuningConfig if method == "prompt" else peft.PrefixTuningConfig
    return cls(task_type="CAUSAL_LM", num_virtual_tokens=4)


@pytest.mark.parametrize("method,case", PROMPT_METHODS)
def test_prompt_and_prefix_tuning_train_generate_and_reload(method, case, tmp_path):
    model = base_model(case)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = batch(1)
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits
    peft_model = peft.get_peft_model(model, prompt_config(method))
    with torch.no_grad():
        adapted = peft_model(input_ids=ids).logits
    # the virtual tokens precede the input (prompt tuning returns their logits too): they must reach the outputs
    assert (adapted[:, -ids.shape[1] :] - base_logits).abs().max() > 1e-4
    before, after = losses_around_training(peft_model, ids, steps=6, lr=0.3)
    assert after < before - 0.02, (before, after)

    peft_model.save_pretrained(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").is_file()
    reloaded = reload_adapter(case, base_state, tmp_path, torch.float32)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, peft_model(input_ids=ids).logits)
    # generate beside a same-size Llama under the same method: where it works for Llama it must for us; where it
    # breaks for Llama too (PEFT's prompt / prefix generate has broken across transformers releases) it is an xfail
    # naming the versions
    llama = peft.get_peft_model(base_model("llama"), prompt_config(method))
    prompt = ids[:, :5]
    like_llama(
        lambda: generate_masked(llama, prompt),
        lambda: assert_generate_equal(peft_model, reloaded, prompt, attention_mask=torch.ones_like(prompt)),
        f"PEFT {type(prompt_config(method)).__name__} generate",
    )


def generate_masked(model, ids: torch.Tensor) -> torch.Tensor:
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)


def test_versor_refuses_prefix_tuning_by_name():
    peft_model = peft.get_peft_model(base_model("versor-hybrid"), prompt_config("prefix"))
    ids = batch()
    with pytest.raises(ValueError, match="Prefix tuning .* does not apply to Versor"):
        peft_model(input_ids=ids, labels=ids)
    with pytest.raises(ValueError, match="Prefix tuning .* does not apply to Versor"):
        peft_model.generate(input_ids=ids, max_new_tokens=2)


# ---------------------------------------------------------------------------------------------- import guard


def test_import_zpx_hf_registers_the_peft_integration():
    assert REGISTERED_BY_IMPORT_ZPX_HF


def test_zpx_hf_imports_without_peft():
    # peft made unimportable: the package imports, registers its Auto classes and waits for a peft import
    code = (
        "import sys; sys.modules['peft'] = None\n"
        "import zpx_hf, transformers\n"
        "assert 'zpx_hf.integration_peft' not in sys.modules\n"
        "assert transformers.AutoConfig.for_model('versor').model_type == 'versor'\n"
    )
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
