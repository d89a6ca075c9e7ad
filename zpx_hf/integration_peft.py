"""PEFT integration: default LoRA targets per family, a grade-wise LoRA for Versor, prefix-tuning limits.

`import zpx_hf` imports this module when `peft` is installed; importing it registers, in PEFT's
model-type tables:

- Default targets for every PEFT method with per-model-type defaults, so `LoraConfig(task_type="CAUSAL_LM")`,
  `IA3Config(...)`, `OFTConfig(...)`, ... need no `target_modules`: each of PEFT's Llama defaults is
  translated to the family's names (`family_targets`). zpx: Llama's own names. pct: each complex projection
  is its `real` and `imag` `nn.Linear` (e.g. LoRA: `q_proj.real`, `q_proj.imag`, `v_proj.real`, `v_proj.imag`;
  `ComplexLinear` runs its sub-modules once PEFT wraps them, on 3-D inputs as a Llama linear gets).
  versor: LoRA -> `q_proj`, `v_proj` (its `VersorLinear` layers: GPA query/value, RRA value) and LN tuning's
  norms; every other method would wrap a `VersorLinear`, which only LoRA adapts, so it is refused in one
  line naming the method and the reason (by default, by name, or with `all-linear`).
- `target_modules="all-linear"` on versor with LoRA wraps every projection of every layer (`VersorLinear`s
  and RRA's `bivector_proj`; PEFT's own rule would take the `nn.Linear`s only).
- Versor LoRA: `VersorLoraLinear`, a per-grade low-rank update dW[g] = B[g] A[g] of `VersorLinear`
  (weight [6 grades, out, in]). Per grade, the adapted layer stays grade-preserving and commutes
  with rotor sandwiches; adapter dropout drops whole multivector channels, which keeps that in
  training too. It goes through PEFT's custom-module support (`LoraConfig._register_custom_module`),
  and the registration is automatic for models whose `config.model_type` is "versor": PEFT's LoRA
  tuner registers it on the config while it resolves the model's defaults, so `get_peft_model`,
  `PeftModel.from_pretrained(model, path)` and `PeftModel.load_adapter` need nothing extra. For a
  plain `nn.Module` built from `VersorLinear`, use `versor_lora_config(...)`.
- Prefix tuning is refused for versor (at the first forward; PEFT has no earlier per-model hook) with
  an error that says why (RRA layers keep a recurrent rotor state, not keys and values) and what to
  use instead (LoRA or prompt tuning). ZPX and PCT take PEFT's prefix keys as they are (ZPX gives
  content-only keys zero phase features).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftConfig, PeftType
from peft.tuners.lora import LoraLayer, LoraModel
from peft.tuners.tuners_utils import BaseTuner, check_adapters_to_merge, check_target_module_exists
from peft.utils import constants as peft_constants
from torch import nn

from .configuration_pct import PCTConfig
from .configuration_versor import VersorConfig
from .configuration_zpx import ZPXConfig
from .modeling_versor import VersorLinear

# Llama's module names in each family. PEFT's per-model-type defaults (LoRA, IA3, OFT, BOFT, LoHa, LoKr, VeRA,
# AdaLoRA, LN tuning, ...) are written for Llama; each family registers their counterparts (`family_targets`).
PCT_COMPLEX_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")  # no gate_proj (modReLU MLP)
NORMS = ("input_layernorm", "post_attention_layernorm", "norm")
LLAMA = "llama"
# model types whose VersorLinear layers get VersorLoraLinear without any user registration
VERSOR_MODEL_TYPES = (VersorConfig.model_type,)
# model types whose projections and norms carry Llama's names, so PEFT's Llama defaults apply as they are
LLAMA_NAMED_MODEL_TYPES = (ZPXConfig.model_type,)


def family_targets(model_type: str, llama_targets: list[str]) -> list[str] | None:
    """The family's counterpart of a PEFT default written for Llama, or None where it has none.

    zpx keeps Llama's names (its projections and norms are Llama's). pct: each complex projection is its `real` and
    `imag` `nn.Linear`s (`ComplexLinear` hands them 3-D inputs, as a Llama linear gets), names PCT lacks (gate_proj)
    dropped. versor: norms only; its projections are `VersorLinear` (one weight per grade), which only LoRA adapts
    (`VersorLoraLinear`, registered separately), so a default naming a projection is not registered."""
    if model_type in LLAMA_NAMED_MODEL_TYPES:
        return list(llama_targets)
    if model_type == PCTConfig.model_type:
        names = [f"{n}.{part}" for n in llama_targets if n in PCT_COMPLEX_LINEARS for part in ("real", "imag")]
        names += [n for n in llama_targets if n in NORMS]
        return names or None
    if model_type in VERSOR_MODEL_TYPES and all(n in NORMS for n in llama_targets):
        return list(llama_targets)
    return None


VERSOR_LORA_TARGETS = ["q_proj", "v_proj"]  # VersorLinear, through VersorLoraLinear
# LoRA's default targets per family (PEFT's Llama default, q_proj and v_proj, in its names; None: it has none)
LORA_TARGET_MODULES = {
    ZPXConfig.model_type: family_targets(ZPXConfig.model_type, ["q_proj", "v_proj"]),
    PCTConfig.model_type: family_targets(PCTConfig.model_type, ["q_proj", "v_proj"]),
    VersorConfig.model_type: VERSOR_LORA_TARGETS,
}
_INIT_OPTIONS = (True, False, "gaussian")


class MultivectorDropout(nn.Module):
    """Dropout of whole multivectors: x [..., C, 32] keeps or zeroes each channel's 32 coefficients together
    (a per-channel scalar, so it commutes with grade projection and rotor sandwiches)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = F.dropout(x.new_ones(*x.shape[:-1], 1), self.p, self.training)
        return x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}"


class VersorLoraLinear(nn.Module, LoraLayer):
    """LoRA for `VersorLinear`: y = W x + scaling * B(A(x)) with A, B themselves grade-wise (`VersorLinear`s
    of rank r), i.e. dW[g] = scaling * B[g] @ A[g] for each of the 6 grades.

    Follows PEFT's LoRA layer conventions (adapters in `lora_A` / `lora_B`, merge / unmerge / disable,
    mixed-adapter batches); `init_lora_weights` may be True (A uniform, B zero), "gaussian" (A normal
    with std 1/r, B zero) or False (A and B uniform: a nonzero update, for tests)."""

    def __init__(
        self,
        base_layer: nn.Module,
        adapter_name: str,
        config: LoraConfig,
        r: int = 0,
        lora_alpha: float = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        LoraLayer.__init__(self, base_layer, **kwargs)
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, r, lora_alpha=lora_alpha, config=config, **kwargs)

    in_features: int  # of the base VersorLinear (PEFT's layers may have none)
    out_features: int

    def _get_in_out_features(self, module: nn.Module) -> tuple[int, int]:
        if not isinstance(module, VersorLinear):
            raise TypeError(f"VersorLoraLinear adapts a VersorLinear, not {type(module).__name__}.")
        return module.in_channels, module.out_channels

    def _factors(self, adapter: str) -> tuple[VersorLinear, VersorLinear]:
        """(A, B) of `adapter`, the VersorLinears `update_layer` puts into `lora_A` / `lora_B`."""
        return cast(VersorLinear, self.lora_A[adapter]), cast(VersorLinear, self.lora_B[adapter])

    def _base_weight(self) -> nn.Parameter:
        return cast(VersorLinear, self.get_base_layer()).weight

    def update_layer(self, adapter_name: str, r: int, lora_alpha: float, config: LoraConfig, **kwargs: Any) -> None:
        if r <= 0:
            raise ValueError(f"LoRA rank `r` = {r} must be a positive integer.")
        if config.lora_bias:
            raise ValueError(
                "`lora_bias=True` is not available for VersorLinear, which has no bias; set lora_bias=False."
            )
        if config.fan_in_fan_out:
            raise ValueError("`fan_in_fan_out=True` does not apply to VersorLinear; set fan_in_fan_out=False.")
        if config.init_lora_weights not in _INIT_OPTIONS:
            raise ValueError(
                f"`init_lora_weights` = {config.init_lora_weights!r} is not available for VersorLinear; "
                f"use one of {_INIT_OPTIONS}."
            )
        if config.use_dora:
            raise ValueError(
                "DoRA (`use_dora=True`) is not available for VersorLinear: zpx_hf's grade-wise VersorLoraLinear "
                "implements LoRA's update only (no DoRA magnitude vector per grade); set use_dora=False."
            )
        self.resolve_lora_variant(config=config)  # raises for other variants this layer does not implement

        self.r[adapter_name] = r
        self.lora_alpha[adapter_name] = lora_alpha
        dropout = MultivectorDropout(config.lora_dropout) if config.lora_dropout > 0 else nn.Identity()
        self.lora_dropout[adapter_name] = dropout
        self.lora_A[adapter_name] = VersorLinear(self.in_features, r)
        self.lora_B[adapter_name] = VersorLinear(r, self.out_features)
        self.lora_bias[adapter_name] = False
        self.scaling[adapter_name] = lora_alpha / (math.sqrt(r) if config.use_rslora else r)
        self.use_rslora[adapter_name] = config.use_rslora
        self.use_dora[adapter_name] = False
        self._init_adapter(adapter_name, config.init_lora_weights)
        self._move_adapter_to_device_of_base_layer(adapter_name)
        self.set_adapter(self.active_adapters, inference_mode=config.inference_mode)

    @torch.no_grad()
    def _init_adapter(self, adapter_name: str, init: bool | str) -> None:
        a, b = (factor.weight for factor in self._factors(adapter_name))  # [6, r, in], [6, out, r]
        # per grade as nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        if init == "gaussian":
            a.normal_(0.0, 1.0 / self.r[adapter_name])
        else:
            a.uniform_(-(self.in_features**-0.5), self.in_features**-0.5)
        if init is False:
            b.uniform_(-(self.r[adapter_name] ** -0.5), self.r[adapter_name] ** -0.5)
        else:
            b.zero_()

    def get_delta_weight(self, adapter: str) -> torch.Tensor:
        """dW [6, out, in] = scaling * B[g] @ A[g] per grade."""
        a, b = self._factors(adapter)
        return torch.matmul(b.weight, a.weight) * self.scaling[adapter]

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        """Add the active (or the named) adapters' dW to the base weight; `safe_merge` checks it is finite first."""
        for name in check_adapters_to_merge(self, adapter_names):
            if name not in self.lora_A:
                continue
            weight = self._base_weight()
            merged = weight.data + self.get_delta_weight(name).to(weight.dtype)
            if safe_merge and not torch.isfinite(merged).all():
                raise ValueError(f"NaNs detected in the merged weights. The adapter {name} seems to be broken")
            weight.data = merged
            self.merged_adapters.append(name)

    def unmerge(self) -> None:
        """Subtract every merged adapter's dW from the base weight again."""
        while self.merged_adapters:
            name = self.merged_adapters.pop()
            weight = self._base_weight()
            weight.data -= self.get_delta_weight(name).to(weight.dtype)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """x [..., in, 32] -> [..., out, 32]."""
        self._check_forward_args(x, *args, **kwargs)
        adapter_names = kwargs.pop("adapter_names", None)
        if self.disable_adapters:
            if self.merged:
                self.unmerge()
            return self.base_layer(x, *args, **kwargs)
        if adapter_names is not None:
            return self._mixed_batch_forward(x, *args, adapter_names=adapter_names, **kwargs)
        result = self.base_layer(x, *args, **kwargs)
        if self.merged:
            return result
        result_dtype = result.dtype
        for name in self.active_adapters:
            if name not in self.lora_A:
                continue
            lora_A, lora_B = self._factors(name)
            h = self._cast_input_dtype(x, lora_A.weight.dtype)
            result = result + lora_B(lora_A(self.lora_dropout[name](h))) * self.scaling[name]
        return result.to(result_dtype)

    def __repr__(self) -> str:
        return "lora." + super().__repr__()


def versor_lora_config(**kwargs: Any) -> LoraConfig:
    """`LoraConfig(**kwargs)` with `VersorLinear` -> `VersorLoraLinear` registered. Needed only for models
    that are not Versor transformers models (those register it automatically); to reload an adapter of such
    a model, pass `config=versor_lora_config(**LoraConfig.from_pretrained(path).to_dict())` or register on the
    loaded config with the same helper."""
    config = LoraConfig(**kwargs)
    config._register_custom_module({VersorLinear: VersorLoraLinear})
    return config


def _register_versor_lora(peft_config: Any) -> None:
    if isinstance(peft_config, LoraConfig) and VersorLinear not in (peft_config._custom_modules or {}):
        peft_config._register_custom_module({VersorLinear: VersorLoraLinear})


_WRAPPED = "_zpx_hf_versor"  # marks a PEFT method replaced here: registering again leaves it


def _replace_method(owner: type, name: str, wrapper: Callable[..., Any]) -> None:
    """`owner.name = wrapper`, with the original's docstring, marked as wrapped."""
    wrapper.__doc__ = getattr(owner, name).__doc__
    setattr(wrapper, _WRAPPED, True)
    setattr(owner, name, wrapper)


def _wrap_prepare_adapter_config() -> None:
    """LoraModel resolves a config against the model's type here (default targets); register VersorLoraLinear
    on the config at the same point for Versor model types. Idempotent."""
    original = LoraModel._prepare_adapter_config
    if getattr(original, _WRAPPED, False):
        return

    def _prepare_adapter_config(self: LoraModel, peft_config: Any, model_config: dict) -> Any:
        if model_config.get("model_type") in VERSOR_MODEL_TYPES:
            _register_versor_lora(peft_config)
        return original(self, peft_config, model_config)

    _replace_method(LoraModel, "_prepare_adapter_config", _prepare_adapter_config)


def _refuse_prefix_tuning(past_key_values: Any) -> Any:
    raise ValueError(
        "Prefix tuning (peft PrefixTuningConfig) does not apply to Versor models: their VersorCache holds the RRA "
        "layers' recurrent rotor states (no keys or values) and the GPA layers' multivector keys, not the "
        "per-layer key/value prefix PEFT builds. Use LoRA (LoraConfig) or prompt tuning (PromptTuningConfig) instead."
    )


def versor_projection_names(model: nn.Module) -> set[str]:
    """Every projection inside a decoder layer (`VersorLinear` and RRA's `nn.Linear` bivector_proj), by full name:
    what `target_modules="all-linear"` means for Versor (heads and embeddings excluded, as PEFT does)."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        if type(module).__name__ == "VersorDecoderLayer":
            names.update(
                f"{prefix}.{name}" for name, sub in module.named_modules() if isinstance(sub, (nn.Linear, VersorLinear))
            )
    return names


def _is_all_linear(targets: Any) -> bool:
    return isinstance(targets, str) and targets.lower() == "all-linear"


def _check_versor_targets(tuner: Any, peft_config: Any, model: nn.Module) -> None:
    """Versor's projections are `VersorLinear`: LoRA adapts them (`VersorLoraLinear`, and `all-linear` becomes every
    projection); any other method that would reach one, by default or by name, is refused in one line."""
    method = getattr(peft_config.peft_type, "value", str(peft_config.peft_type))
    targets = getattr(peft_config, "target_modules", None)
    if peft_config.peft_type == PeftType.LORA:  # (not AdaLoRA, whose config subclasses LoraConfig)
        if _is_all_linear(targets):
            peft_config.target_modules = versor_projection_names(model)
        return
    reason = (
        f"{method} does not apply to Versor's projections: they are VersorLinear layers (one weight per grade, "
        f"[6, out, in]) and PEFT's {method} layers wrap nn.Linear only. Use LoRA (LoraConfig; zpx_hf adapts "
        "VersorLinear grade-wise), or target RRA's nn.Linear `bivector_proj` by name."
    )
    if _is_all_linear(targets):
        raise ValueError(f"target_modules='all-linear': {reason}")
    if targets is None:
        if getattr(tuner, "target_module_mapping", {}).get(_model_type(model)) is None:
            raise ValueError(f"{method} has no default target_modules for Versor. {reason}")
        return
    hit = [
        name
        for name, module in model.named_modules()
        if isinstance(module, VersorLinear) and check_target_module_exists(peft_config, name)
    ]
    if hit:
        raise ValueError(f"target_modules match {hit[0]}: {reason}")


def _model_type(model: nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "model_type", None)


def _is_versor(model: nn.Module) -> bool:
    return _model_type(model) in VERSOR_MODEL_TYPES


def _wrap_tuner_entry_points() -> None:
    """Check Versor targets where every PEFT tuner that wraps modules starts, before PEFT resolves defaults (its own
    message for an unknown model type does not say why): `BaseTuner.__init__` (`get_peft_model`; some tuners read
    their targets in a pre-injection hook) and `BaseTuner.inject_adapter` (`add_adapter`, `load_adapter`).
    Idempotent."""
    init, inject = BaseTuner.__init__, BaseTuner.inject_adapter
    if getattr(inject, _WRAPPED, False):
        return

    def __init__(self: BaseTuner, model: nn.Module, peft_config: Any, adapter_name: str, *args: Any, **kw: Any) -> None:
        if _is_versor(model):
            config = peft_config if isinstance(peft_config, PeftConfig) else peft_config[adapter_name]
            _check_versor_targets(self, config, model)
        init(self, model, peft_config, adapter_name, *args, **kw)

    def inject_adapter(self: BaseTuner, model: nn.Module, adapter_name: str, *args: Any, **kw: Any) -> Any:
        if _is_versor(model):
            _check_versor_targets(self, self.peft_config[adapter_name], model)
        return inject(self, model, adapter_name, *args, **kw)

    _replace_method(BaseTuner, "__init__", __init__)
    _replace_method(BaseTuner, "inject_adapter", inject_adapter)


def peft_default_mappings() -> dict[str, dict]:
    """PEFT's per-model-type default tables (`TRANSFORMERS_MODELS_TO_*_TARGET_MODULES_MAPPING`, IA3's feed-forward
    modules) that have a Llama entry, by name."""
    return {
        name: mapping
        for name, mapping in vars(peft_constants).items()
        if name.startswith("TRANSFORMERS_MODELS_TO_")
        and name.endswith("_MODULES_MAPPING")
        and isinstance(mapping, dict)
        and isinstance(mapping.get(LLAMA), list)
    }


def register() -> None:
    """Write each family's defaults into PEFT's tables (existing entries are kept, so a user's own choice wins),
    Versor's LoRA layer and refusals. Idempotent."""
    lora_mapping = peft_constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    for model_type in VERSOR_MODEL_TYPES:
        lora_mapping.setdefault(model_type, list(VERSOR_LORA_TARGETS))
        peft_constants.TRANSFORMERS_MODELS_TO_PREFIX_TUNING_POSTPROCESS_MAPPING.setdefault(
            model_type, _refuse_prefix_tuning
        )
    for mapping in peft_default_mappings().values():
        for model_type in LORA_TARGET_MODULES:  # every family
            targets = family_targets(model_type, mapping[LLAMA])
            if targets is not None:
                mapping.setdefault(model_type, targets)
    _wrap_prepare_adapter_config()
    _wrap_tuner_entry_points()


register()

__all__ = [
    "LORA_TARGET_MODULES",
    "MultivectorDropout",
    "VersorLoraLinear",
    "family_targets",
    "register",
    "versor_lora_config",
    "versor_projection_names",
]
