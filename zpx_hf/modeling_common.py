"""The decoder backbone and heads shared by every family (ZPX, PCT, Versor).

A family declares its pieces as class attributes and this file builds and runs them: the embedding, decoder
layer and final-norm classes of its backbone (`GeometricModel`), the mixer, MLP and norm classes of its layer
(`GeometricDecoderLayer`), the op its mixer calls (`attention_op`) and why softmax engines cannot compute it
(`GeometricPreTrainedModel.softmax_engine_refusal`). Shared here: the pre-norm decoder block, the backbone
forward (inputs, cache, positions, padding, packed documents found once, the layer loop, recorded outputs), the
causal-LM and sequence-classification heads with transformers' own losses, and the one table from
`attn_implementation` to kernel (`ATTENTION_KERNELS`, through the model-local `ALL_ATTENTION_FUNCTIONS`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as hf_init  # init helpers that keep the weights `from_pretrained` loaded
from transformers.loss.loss_utils import ForCausalLMLoss, ForSequenceClassificationLoss
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    SequenceClassifierOutputWithPast,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as GLOBAL_ATTENTION_FUNCTIONS
from transformers.modeling_utils import AttentionInterface

from .modeling_blocks import (
    CACHE_FIELD,
    RMSNorm,
    check_inputs,
    default_position_ids,
    keep_derived_weights,
    kept_linear,
    module_from_config,
    pool_last_token,
    pop_cache_kwarg,
)
from .modeling_cache import grow_dynamic_layers
from .ops_common import document_ids_from_cu_seq_lens, document_ids_from_position_ids, document_positions
from .rotary_srpe import build_rotary

if TYPE_CHECKING:
    from transformers import GenerationMixin

    from .configuration_common import GeometricConfig

# Keyword arguments of padding-free collators (flash-attention's varlen form, TRL's `seq_idx`); the backbone
# reads documents from `cu_seq_lens_*` and drops the rest (every mixer takes `document_ids` instead).
PACKING_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")

# The one table from `attn_implementation` to the kernel a family's op entry runs, for every mixer: "eager" is the
# readable reference ("naive", which materialises the weights, so it also serves `output_attentions=True`), "sdpa"
# the fast path ("auto": Triton on CUDA, the memory-lean PyTorch kernels elsewhere, a decoding step for one token).
ATTENTION_KERNELS = {"eager": "naive", "sdpa": "auto"}
ATTENTION_IMPLEMENTATIONS = tuple(ATTENTION_KERNELS)


class FamilyMixer(Protocol):
    """A mixer whose op runs through `ALL_ATTENTION_FUNCTIONS`: `attention_op(q, k, v, key_padding_mask, *,
    kernel, ...)` returns (output, weights or None); kernel "naive" materialises the weights."""

    def attention_op(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        *,
        kernel: str,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


def family_attention_forward(
    module: FamilyMixer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    kernel: str,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A family's own implementation in transformers' attention-function signature: its mixer's op
    (`module.attention_op`) on q, k, v and the padding mask [B, Lk] bool (or None) with `kernel`; the mixer's
    other keywords (scaling, documents, ...) pass through. Returns (output, weights or None)."""
    return module.attention_op(query, key, value, attention_mask, kernel=kernel, **kwargs)


# Model-local registry (transformers' AttentionInterface, as Llama's modeling file reads the global one): "eager"
# is the default handed to `get_interface`, "sdpa" overrides the global SDPA; every other name (flash, flex,
# paged, a serving engine's) reads the global registry, reached only by mixers that hand engines their inputs.
eager_attention_forward = functools.partial(family_attention_forward, kernel=ATTENTION_KERNELS["eager"])
ALL_ATTENTION_FUNCTIONS = AttentionInterface()
ALL_ATTENTION_FUNCTIONS["sdpa"] = functools.partial(family_attention_forward, kernel=ATTENTION_KERNELS["sdpa"])


def softmax_engine_refusal(model: GeometricPreTrainedModel, implementation: str | None) -> str | None:
    """The one-line refusal of `implementation` for a model whose family says why no softmax engine computes it
    (`softmax_engine_refusal`); None when it is allowed."""
    reason = type(model).softmax_engine_refusal
    if reason is None or implementation is None or implementation in ATTENTION_IMPLEMENTATIONS:
        return None
    # only names that are softmax engines (registered globally, flash / flex / paged, or a hub kernel "org/name");
    # any other name gets transformers' own "not supported" message
    engine = implementation.split("|")[-1]
    if not (engine in GLOBAL_ATTENTION_FUNCTIONS or engine.startswith(("flash_attention", "flex_attention", "paged"))
            or "/" in engine):  # fmt: skip
        return None
    return (
        f"`attn_implementation`={implementation!r} is refused for {model.config.model_type}: {reason}, "
        "so a softmax attention kernel (flash_attention_*, flex_attention, paged attention, vLLM) computes another "
        "function; use 'eager' or 'sdpa'."
    )


def attention_implementation(config: Any, output_attentions: bool = False, engines: bool = False) -> str:
    """The implementation a mixer runs: the config's, or `"eager"` when attention weights are asked for (both
    compute the same function; only the reference materialises the weights). A softmax engine's name
    (transformers' global AttentionInterface: flash, flex, paged, or one a serving engine registers) only for a
    mixer that hands engines its inputs (`engines`, ZPX's), and not with `output_attentions`."""
    implementation = config._attn_implementation or "sdpa"
    engine = engines and not output_attentions and implementation not in ATTENTION_KERNELS
    if engine and implementation in GLOBAL_ATTENTION_FUNCTIONS:
        return implementation
    if implementation not in ATTENTION_KERNELS:
        raise ValueError(
            f"`attn_implementation`={implementation!r} is not available for {config.model_type}: use 'eager' "
            "(the readable reference) or 'sdpa' (the fast path: Triton on CUDA, the memory-lean PyTorch path on CPU)."
        )
    return "eager" if output_attentions else implementation


def resolve_forward_flags(
    model: GeometricPreTrainedModel,
    output_attentions: bool | None,
    output_hidden_states: bool | None,
    return_dict: bool | None,
    use_cache: bool | None,
) -> tuple[bool, bool, bool, bool]:
    """(output_attentions, output_hidden_states, return_dict, use_cache) with config defaults filled in. No
    cache for a bidirectional encoder or under gradient checkpointing in training."""
    config = model.config
    output_attentions = config.output_attentions if output_attentions is None else output_attentions
    output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
    return_dict = config.return_dict if return_dict is None else return_dict
    use_cache = config.use_cache if use_cache is None else use_cache
    if not config.causal or (model.gradient_checkpointing and model.training):
        use_cache = False
    return bool(output_attentions), bool(output_hidden_states), bool(return_dict), bool(use_cache)


def trim_static_cache(
    key: torch.Tensor, value: torch.Tensor, kv_length: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys/values of the first `kv_length` positions: a static cache returns its whole preallocated length,
    whose unfilled tail must not be attended to."""
    if kv_length is None or key.shape[-2] == kv_length:
        return key, value
    return key[..., :kv_length, :], value[..., :kv_length, :]


def cumulative_lengths(name: str, value: Any) -> torch.Tensor | None:
    """`cu_seq_lens_*` as an integer tensor: a list or tuple of ints is taken as one."""
    if value is not None and not isinstance(value, torch.Tensor):
        with contextlib.suppress(TypeError, ValueError, RuntimeError):
            value = torch.as_tensor(value)
    if value is None or (
        isinstance(value, torch.Tensor) and not value.is_floating_point() and value.dtype != torch.bool
    ):
        return value
    shown = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
    raise ValueError(
        f"`{name}` must be integer cumulative document lengths (a tensor or list like [0, 7, 19]); got {shown}. "
        "Pass the collator's value unchanged."
    )


def packed_document_ids(
    position_ids: torch.Tensor | None,
    padding_mask: torch.Tensor | None,
    packing: dict[str, Any],
    batch: int,
    length: int,
    past_length: int,
) -> torch.Tensor | None:
    """[B, L] document ids of packed rows, or None (each row one document).

    From `cu_seq_lens_q` / `cu_seq_lens_k` when given (they win), else from `position_ids` restarting at 0,
    read only when no padding mask is given (left padding also restarts positions; transformers' rule)."""
    cu_q, cu_k = (cumulative_lengths(name, packing.get(name)) for name in ("cu_seq_lens_q", "cu_seq_lens_k"))
    if cu_q is not None and cu_k is not None and not torch.equal(cu_q.flatten(), cu_k.flatten()):
        raise ValueError("`cu_seq_lens_q` and `cu_seq_lens_k` differ: packed self-attention needs one document set.")
    cu = cu_q if cu_q is not None else cu_k
    document_ids = None
    if cu is not None:
        document_ids = document_ids_from_cu_seq_lens(cu, batch, length)
    elif position_ids is not None and padding_mask is None and not torch.compiler.is_compiling():
        document_ids = document_ids_from_position_ids(position_ids)
    if document_ids is None:
        return None
    if past_length > 0:
        raise ValueError(
            f"packed documents (position_ids restarting at 0, or cu_seq_lens) cannot continue a cache of "
            f"{past_length} tokens: pass packed rows without `past_key_values`, or one document per row."
        )
    return document_ids.to(torch.long).expand(batch, length)


class GeometricPreTrainedModel(PreTrainedModel):
    """Base of every family's `PreTrainedModel`; subclasses set `config_class` and `_no_split_modules`.

    Every family names its classes `<Prefix>Model`, `<Prefix>ForCausalLM` and
    `<Prefix>ForSequenceClassification` next to `<Prefix>Config`, so the remote-code `auto_map` is derived.
    """

    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    # Flash / flex kernels compute plain softmax attention: a different function, so they are refused.
    _supports_flash_attn = False
    _supports_flex_attn = False
    # Why softmax engines (flash_attention_*, flex_attention, paged attention, vLLM: implementations that compute
    # softmax(q.k * scale) v) cannot compute this family's mixers, as a clause of the refusal; None where its
    # mixers hand engines inputs whose softmax attention is the family's function (ZPX: q^, k^, v).
    softmax_engine_refusal: str | None = None
    if TYPE_CHECKING:  # for the type checker only: transformers reads a class's `config` annotation as its config_class
        config: GeometricConfig

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        # Fields assigned after the config was built were checked one by one; how they combine is checked
        # here, before any weight is allocated (see `configuration_common`).
        config.validate()
        super().__init__(config, *args, **kwargs)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            hf_init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                hf_init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            hf_init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            hf_init.ones_(module.weight)

    def get_correct_attn_implementation(self, requested_attention: str | None, *args: Any, **kwargs: Any) -> str:
        # refused by name when it is set (from_pretrained, set_attn_implementation), before any forward
        refusal = softmax_engine_refusal(self, requested_attention)
        if refusal is not None:
            raise ValueError(refusal)
        return super().get_correct_attn_implementation(requested_attention, *args, **kwargs)

    def create_masks_for_generate(self, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """`generate` with a compileable (static) cache would build 4-D softmax masks here; every family takes the
        2-D padding mask and builds what its mixer needs, so the mask is passed through."""
        return attention_mask

    @classmethod
    def remote_code_auto_map(cls) -> dict[str, str]:
        """Auto class name -> "module.Class" in the copied remote-code files, for every Auto class."""
        config_class = cls.config_class
        if config_class is None:
            raise TypeError(f"{cls.__name__} sets no config_class: a family's PreTrainedModel declares its config.")
        prefix = config_class.__name__.removesuffix("Config")
        module = cls.__module__.rsplit(".", 1)[-1]
        return {
            "AutoConfig": f"{config_class.__module__.rsplit('.', 1)[-1]}.{config_class.__name__}",
            "AutoModel": f"{module}.{prefix}Model",
            "AutoModelForCausalLM": f"{module}.{prefix}ForCausalLM",
            "AutoModelForSequenceClassification": f"{module}.{prefix}ForSequenceClassification",
        }

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
        # HF writes `auto_map` only for the saved class; a checkpoint should open through every Auto
        # class of its family, so the full map is written before saving.
        self.config.auto_map = self.remote_code_auto_map()
        return super().save_pretrained(save_directory, *args, **kwargs)


class GeometricDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block:  h = h + mixer(norm_1(h));  h = h + mlp(norm_2(h)).

    A family's layer declares `mixer_class` (built as `mixer_class(config, layer_idx)`; `mixer_class_for` picks
    per layer where a family mixes kinds), `mlp_class` and `norm_class` (built by `module_from_config`), and
    names the mixer's attribute in `mixer_name` (ZPX and PCT: `self_attn`; Versor: `mixer`, the names its
    checkpoints hold). The mixer returns `(output, attention weights or None, per-layer extra or None)`; packed
    rows add `document_ids` [B, L] (passed only when given).
    """

    mixer_name = "self_attn"
    mixer_class: type[nn.Module]
    mlp_class: type[nn.Module]
    norm_class: type[nn.Module]

    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        setattr(self, self.mixer_name, self.mixer_class_for(config, layer_idx)(config, layer_idx))
        self.mlp = module_from_config(self.mlp_class, config)
        self.input_layernorm = module_from_config(self.norm_class, config)
        self.post_attention_layernorm = module_from_config(self.norm_class, config)

    def mixer_class_for(self, config: Any, layer_idx: int) -> type[nn.Module]:
        """The mixer class of layer `layer_idx` (`mixer_class` for every layer by default)."""
        return self.mixer_class

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: Any = None,
        padding_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        output_attentions: bool = False,
        kv_length: int | None = None,
        document_ids: torch.Tensor | None = None,
        **attention_kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
        residual = hidden_states
        packed = {} if document_ids is None else {"document_ids": document_ids}
        mixed, weights, extra = getattr(self, self.mixer_name)(
            self.input_layernorm(hidden_states),
            position_embeddings=position_embeddings,
            padding_mask=padding_mask,
            past_key_values=past_key_values,
            output_attentions=output_attentions,
            kv_length=kv_length,
            **packed,
            **attention_kwargs,
        )
        hidden_states = residual + mixed
        hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states, weights, extra


class GeometricModel(GeometricPreTrainedModel):
    """The backbone every family shares: embeddings -> decoder layers -> final norm.

    A family declares `embedding_class`, `decoder_layer_class` (built as `decoder_layer_class(config,
    layer_idx)`) and `norm_class` (the others by `module_from_config`); the rotary table comes from the config
    (`build_rotary`, None for `rotary="none"`). `feature_size` is the real features per token the heads read
    (`hidden_size`). A family may override `new_cache`, `check_cache`, `position_embeddings` and
    `extra_outputs` (outputs beyond HF's, e.g. ZPX's phases).
    """

    output_class: type = BaseModelOutputWithPast
    embedding_class: type[nn.Module] = nn.Embedding
    decoder_layer_class: type[nn.Module]
    norm_class: type[nn.Module] = RMSNorm

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens = module_from_config(self.embedding_class, config)
        self.layers = nn.ModuleList([self.decoder_layer_class(config, i) for i in range(config.num_hidden_layers)])
        self.norm = module_from_config(self.norm_class, config)
        self.rotary_emb = build_rotary(config)
        self.feature_size = config.hidden_size
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed_tokens = value

    def new_cache(self) -> Any:
        """The cache `forward` creates when `use_cache` and none is passed."""
        from transformers.cache_utils import DynamicCache

        return DynamicCache(config=self.config)

    def check_cache(self, cache: Any) -> None:
        """Raise on a cache this family cannot continue from."""

    def position_embeddings(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor) -> Any:
        """Per-token position tables for the mixers: the rotary module's (cos, sin), None without one."""
        return self.rotary_emb(inputs_embeds, position_ids) if self.rotary_emb is not None else None

    def extra_outputs(self, extras: list[Any], token_mask: torch.Tensor | None, **kwargs: Any) -> dict[str, Any]:
        """Fields added to the output from the mixers' per-layer extras (none by default); `document_ids` [B, L]
        of packed rows (or None) comes in `kwargs`."""
        return {}

    def attention_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The forward's extra kwargs that reach every mixer (an attention backend's, e.g. a serving engine's
        metadata); none by default: only a family whose mixer calls transformers' attention functions takes them."""
        return {}

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        past_key_values = pop_cache_kwarg(past_key_values, kwargs)
        packing = {key: kwargs.pop(key) for key in PACKING_KWARGS if key in kwargs}
        refusal = softmax_engine_refusal(self, self.config._attn_implementation)
        if refusal is not None:  # set past transformers' checks (`get_correct_attn_implementation`)
            raise ValueError(refusal)
        output_attentions, output_hidden_states, return_dict, use_cache = resolve_forward_flags(
            self, output_attentions, output_hidden_states, return_dict, use_cache
        )
        self.check_cache(past_key_values)
        if use_cache and past_key_values is None:
            past_key_values = self.new_cache()
        grow_dynamic_layers(past_key_values)  # appending a token writes a row instead of copying the cache
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        if isinstance(past_length, torch.Tensor):  # static caches count in a tensor that layers update in place
            past_length = int(past_length)
        # (a module wrapping the embedding, e.g. PEFT's modules_to_save, may hold no weight tensor: not checked then)
        embedding_weight = getattr(self.embed_tokens, "weight", None)
        if not isinstance(embedding_weight, torch.Tensor):
            embedding_weight = None
        check_inputs(
            self.config,
            input_ids,
            inputs_embeds,
            attention_mask,
            position_ids,
            past_length,
            embedding_width=None if embedding_weight is None else embedding_weight.shape[-1],
            embedding_dtype=None if embedding_weight is None else embedding_weight.dtype,
        )
        if position_ids is not None and position_ids.dim() == 1:
            position_ids = position_ids[None]  # [L] is shared by every row, as [1, L]: packed documents too

        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        length = inputs_embeds.shape[1]
        # [B, past + L] bool, True = real token; None when nothing is padded (a host read, so eager mode only:
        # a compiled graph keeps an all-ones mask, which computes the same function).
        padding_mask = None
        if attention_mask is not None and (torch.compiler.is_compiling() or not bool(attention_mask.all())):
            padding_mask = attention_mask.to(device=inputs_embeds.device, dtype=torch.bool)
        # Packed rows: documents found once here, handed to every mixer; positions restart per document.
        document_ids = packed_document_ids(
            position_ids, padding_mask, packing, inputs_embeds.shape[0], length, past_length
        )
        if position_ids is None and document_ids is not None:
            position_ids = document_positions(document_ids)
        if position_ids is None:  # an all-ones mask counts the same positions as none
            position_ids = default_position_ids(padding_mask, past_length, length, inputs_embeds.device)
        position_embeddings = self.position_embeddings(inputs_embeds, position_ids)

        hidden_states = inputs_embeds
        all_hidden_states: list[torch.Tensor] = []
        all_attentions: list[Any] = []
        extras = []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states.append(hidden_states)
            hidden_states, weights, extra = layer(
                hidden_states,
                position_embeddings=position_embeddings,
                padding_mask=padding_mask,
                past_key_values=past_key_values,
                output_attentions=output_attentions,
                kv_length=past_length + length,
                document_ids=document_ids,
                **self.attention_kwargs(kwargs),
            )
            extras.append(extra)
            if output_attentions:
                all_attentions.append(weights)
        hidden_states = self.norm(hidden_states)
        if output_hidden_states:
            all_hidden_states.append(hidden_states)

        token_mask = padding_mask[:, past_length:] if padding_mask is not None else None
        output = self.output_class(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
            **self.extra_outputs(extras, token_mask, document_ids=document_ids, **kwargs),
            **{CACHE_FIELD: past_key_values if use_cache else None},
        )
        return output if return_dict else output.to_tuple()


def check_labels(
    labels: torch.Tensor | None,
    shift_labels: torch.Tensor | None,
    input_shape: tuple[int, int],
    logits_shape: tuple[int, int],
) -> None:
    """Raise, naming the argument, unless the causal-LM targets line up with the inputs: `labels` [batch,
    seq_len] like `input_ids` (shifted inside the loss), `shift_labels` one target per logit position. A
    reshaped `labels` ([1, 16] or [16] for [2, 8] inputs) has the same count and would give a misaligned loss."""
    if shift_labels is not None:
        if tuple(shift_labels.shape) != logits_shape:
            raise ValueError(
                f"`shift_labels` must be [batch, seq_len] = {logits_shape} (one target per logit position); got "
                f"{tuple(shift_labels.shape)}."
            )
        return
    if labels is None:  # no targets: nothing to line up
        return
    if tuple(labels.shape) != input_shape:
        raise ValueError(
            f"`labels` must be [batch, seq_len] = {input_shape}, the shape of `input_ids` (the target of each "
            f"position; the loss shifts them); got {tuple(labels.shape)}. Pass them unflattened, one row per input."
        )
    if logits_shape != input_shape:
        raise ValueError(
            f"`labels` need logits at every position, but `logits_to_keep` kept {logits_shape[1]} of "
            f"{input_shape[1]}; drop `logits_to_keep`, or pass `shift_labels` for the kept positions."
        )
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"`labels` must be integer token ids (-100 = ignored); got {labels.dtype}.")


def check_classification_labels(labels: torch.Tensor, batch: int, num_labels: int) -> None:
    """Raise, naming `labels`, unless they hold one target per sequence: `[batch]` (class ids, or values when
    `num_labels == 1`) or `[batch, num_labels]` (multi-label / multi-output regression)."""
    if labels.dim() == 0 or labels.shape[0] != batch or labels.numel() not in (batch, batch * num_labels):
        raise ValueError(
            f"`labels` must be [batch={batch}] (one class id or value per sequence) or [batch, num_labels="
            f"{num_labels}] (multi-label); got {tuple(labels.shape)}."
        )


if TYPE_CHECKING:  # the heads are mixins placed before a family's PreTrainedModel (and GenerationMixin)

    class _CausalLMBase(GeometricPreTrainedModel, GenerationMixin): ...

    _SequenceClassificationBase = GeometricPreTrainedModel
else:
    _CausalLMBase = _SequenceClassificationBase = object


class ForCausalLMHead(_CausalLMBase):
    """Causal-LM head shared by every family (HF's `Generic*` pattern); a family declares
    `class XForCausalLM(ForCausalLMHead, XPreTrainedModel, GenerationMixin)` and sets `backbone_class`.

    `self.model` is the backbone; `lm_head` maps its `feature_size` real features to the vocabulary. The
    loss is transformers' causal-LM loss: `labels` are shifted inside, or `shift_labels` (context
    parallelism, padding-free collators) are the targets as given. Families with an auxiliary objective
    (ZPX's centre term) override `auxiliary_loss` and `extra_outputs`.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    backbone_class: type[GeometricModel]
    output_class: type = CausalLMOutputWithPast

    def __init__(self, config: Any) -> None:
        if not config.causal:
            raise ValueError(f"config field `causal`=False is invalid for {type(self).__name__}: set causal=True.")
        super().__init__(config)
        self.model = self.backbone_class(config)
        self.lm_head = nn.Linear(self.model.feature_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        # Parameters cannot change inside one `generate` call: weights derived from them are built once for
        # the call instead of once per token (`modeling_blocks.derived_weight`).
        with keep_derived_weights():
            return super().generate(*args, **kwargs)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def auxiliary_loss(self, outputs: Any) -> torch.Tensor | None:
        """Extra training objective added to the task loss (none by default)."""
        return None

    def extra_outputs(self, outputs: Any) -> dict[str, Any]:
        """Backbone output fields copied into the head's output (none by default)."""
        return {}

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        shift_labels: torch.LongTensor | None = None,
        **kwargs: Any,
    ) -> Any:
        past_key_values = pop_cache_kwarg(past_key_values, kwargs)
        loss_kwargs = {key: kwargs.pop(key) for key in ("num_items_in_batch", "ignore_index") if key in kwargs}
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden_states = hidden_states[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, torch.Tensor):
            hidden_states = hidden_states[:, logits_to_keep]
        logits = kept_linear(hidden_states, (self.lm_head,))  # decoding on CPU (see `kept_linear`)
        if logits is None:
            logits = self.lm_head(hidden_states)

        loss = None
        if labels is not None or shift_labels is not None:
            check_labels(labels, shift_labels, tuple(outputs.last_hidden_state.shape[:2]), tuple(logits.shape[:-1]))
            loss = ForCausalLMLoss(
                logits, labels, vocab_size=logits.shape[-1], shift_labels=shift_labels, **loss_kwargs
            )
            auxiliary = self.auxiliary_loss(outputs)
            if auxiliary is not None:
                loss = loss + auxiliary
        output = self.output_class(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **self.extra_outputs(outputs),
            **{CACHE_FIELD: outputs.get(CACHE_FIELD)},
        )
        return output if return_dict else output.to_tuple()


# `generate` inspects a remote-code model's `forward` signature on every decoding step (looking for the
# removed `cache_position`); a precomputed `__signature__` makes that an attribute read (~0.1 ms per token).
# attr-defined: a function's attributes are writable; mypy types a function as having a fixed set
ForCausalLMHead.forward.__signature__ = inspect.signature(ForCausalLMHead.forward)  # type: ignore[attr-defined]


class ForSequenceClassificationHead(_SequenceClassificationBase):
    """Sequence-classification head shared by every family: a linear `score` on the features of the
    last real token (see `pool_last_token`), transformers' regression / single- / multi-label loss."""

    backbone_class: type[GeometricModel]

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = self.backbone_class(config)
        self.score = nn.Linear(self.model.feature_size, config.num_labels, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def auxiliary_loss(self, outputs: Any) -> torch.Tensor | None:
        return None

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutputWithPast | tuple:
        kwargs.pop("num_items_in_batch", None)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        pooled = pool_last_token(outputs.last_hidden_state, input_ids, attention_mask, self.config.pad_token_id)
        logits = self.score(pooled)
        loss = None
        if labels is not None:
            check_classification_labels(labels, logits.shape[0], self.num_labels)
            # float32 logits, as the causal-LM loss does, so bf16 autocast does not change the loss.
            loss = ForSequenceClassificationLoss(labels, logits.float(), self.config)
            auxiliary = self.auxiliary_loss(outputs)
            if auxiliary is not None:
                loss = loss + auxiliary
        output = SequenceClassifierOutputWithPast(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "ATTENTION_IMPLEMENTATIONS",
    "ATTENTION_KERNELS",
    "attention_implementation",
    "eager_attention_forward",
    "family_attention_forward",
    "softmax_engine_refusal",
    "resolve_forward_flags",
    "trim_static_cache",
    "packed_document_ids",
    "GeometricPreTrainedModel",
    "GeometricDecoderLayer",
    "GeometricModel",
    "check_classification_labels",
    "check_labels",
    "ForCausalLMHead",
    "ForSequenceClassificationHead",
]
