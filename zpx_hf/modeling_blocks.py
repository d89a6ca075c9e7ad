"""Building blocks shared by the ZPX, PCT and Versor families.

Llama-style pieces (RMSNorm, SwiGLU), attention-mask construction, input checks,
sequence-classification pooling and loss, the common `PreTrainedModel` base (weight
init, remote-code `auto_map` for every Auto class), and the one place that knows how
the installed transformers names the KV cache argument (`past_key_values` up to
5.2x, `cache` later).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutputWithPast

try:  # transformers >= 5: init helpers that respect weights already loaded by `from_pretrained`
    from transformers import initialization as hf_init
except ImportError:  # pragma: no cover - older layout
    hf_init = nn.init

# Name of the cache field in HF outputs and the kwarg `generate` passes to `forward`.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def pop_cache_kwarg(past_key_values: Any, kwargs: dict) -> Any:
    """Accept the cache under either name (`past_key_values` or, in newer transformers, `cache`)."""
    cache = kwargs.pop("cache", None)
    return past_key_values if past_key_values is not None else cache


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in float32 (Llama's RMSNorm)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with Llama's parameter names."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def resolve_forward_flags(
    model: nn.Module,
    output_attentions: bool | None,
    output_hidden_states: bool | None,
    return_dict: bool | None,
    use_cache: bool | None,
) -> tuple[bool, bool, bool, bool]:
    """A backbone's (output_attentions, output_hidden_states, return_dict, use_cache), config defaults
    filled in. No cache for a bidirectional encoder or under gradient checkpointing in training."""
    config = model.config
    output_attentions = config.output_attentions if output_attentions is None else output_attentions
    output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
    return_dict = config.return_dict if return_dict is None else return_dict
    use_cache = config.use_cache if use_cache is None else use_cache
    if not config.causal or (model.gradient_checkpointing and model.training):
        use_cache = False
    return bool(output_attentions), bool(output_hidden_states), bool(return_dict), bool(use_cache)


def check_inputs(
    config: Any,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    past_length: int,
) -> None:
    """Fail early, naming the argument, on inputs the model cannot handle."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`.")
    if input_ids is not None:
        if input_ids.dim() != 2:
            raise ValueError(f"`input_ids` must be [batch, seq_len]; got shape {tuple(input_ids.shape)}.")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"`input_ids` must be an integer tensor; got {input_ids.dtype}.")
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= config.vocab_size):
            raise ValueError(
                f"`input_ids` must lie in [0, vocab_size={config.vocab_size}); got values in "
                f"[{int(input_ids.min())}, {int(input_ids.max())}]. Check the tokenizer matches the model."
            )
        batch, length = input_ids.shape
    else:
        if inputs_embeds.dim() != 3:
            raise ValueError(
                f"`inputs_embeds` must be [batch, seq_len, features]; got shape {tuple(inputs_embeds.shape)}."
            )
        if not torch.isfinite(inputs_embeds).all():
            raise ValueError("`inputs_embeds` contains NaN or Inf.")
        batch, length = inputs_embeds.shape[:2]
    if attention_mask is not None:
        if (
            attention_mask.dim() != 2
            or attention_mask.shape[0] != batch
            or attention_mask.shape[1] != past_length + length
        ):
            raise ValueError(
                f"`attention_mask` must be [batch={batch}, past+current={past_length + length}]; got shape "
                f"{tuple(attention_mask.shape)}."
            )
    total = past_length + length
    if total > config.max_position_embeddings and not config.allow_longer_positions:
        raise ValueError(
            f"sequence length {total} exceeds `max_position_embeddings`={config.max_position_embeddings}; "
            "truncate the input or set `allow_longer_positions=True` in the config."
        )


def default_position_ids(
    attention_mask: torch.Tensor | None, past_length: int, length: int, device: torch.device
) -> torch.Tensor:
    """Positions for the current tokens: counted over real tokens when a padding mask is given
    (so left-padded prompts start at 0), else `past_length + arange(length)`."""
    if attention_mask is not None:
        positions = attention_mask.long().cumsum(-1) - 1
        positions = positions.clamp(min=0)
        return positions[:, past_length : past_length + length].to(device)
    return (torch.arange(length, device=device) + past_length).unsqueeze(0)


def build_attention_mask(
    attention_mask: torch.Tensor | None,
    batch: int,
    q_len: int,
    kv_len: int,
    causal: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """Boolean mask [B, 1, q_len, kv_len] (True = may attend), or `None` when none is needed.

    `None` means: no padding and either bidirectional attention or a causal square block, which the
    attention ops handle with `is_causal`. Query rows with no visible key (left-padding rows) are
    opened to all keys so that softmax never sees an empty row; those outputs are padding anyway.
    """
    has_padding = attention_mask is not None and not bool(attention_mask.all())
    if not has_padding and (not causal or q_len == kv_len or q_len == 1):
        return None
    mask = torch.ones(batch, 1, q_len, kv_len, dtype=torch.bool, device=device)
    if causal:
        # Query i sits at absolute position (kv_len - q_len + i).
        q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        k_pos = torch.arange(kv_len, device=device)[None, :]
        mask = mask & (k_pos <= q_pos)[None, None]
    if has_padding:
        mask = mask & attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
        empty_rows = ~mask.any(dim=-1, keepdim=True)
        mask = mask | empty_rows
    return mask


def uses_is_causal(mask: torch.Tensor | None, causal: bool, q_len: int) -> bool:
    """Whether an attention op must apply its own causal masking (see `build_attention_mask`)."""
    return mask is None and causal and q_len > 1


def pool_last_token(
    hidden_states: torch.Tensor, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, pad_token_id: Any
) -> torch.Tensor:
    """Features of the last real token of each sequence (right or left padding both work)."""
    batch, length = hidden_states.shape[:2]
    if attention_mask is not None:
        # last index where the mask is 1
        index = torch.arange(length, device=hidden_states.device)
        last = (attention_mask.to(hidden_states.device).long() * index).argmax(-1)
    elif input_ids is not None and pad_token_id is not None:
        non_pad = (input_ids != pad_token_id).long().to(hidden_states.device)
        index = torch.arange(length, device=hidden_states.device)
        last = (non_pad * index).argmax(-1)
    else:
        last = torch.full((batch,), length - 1, device=hidden_states.device, dtype=torch.long)
    return hidden_states[torch.arange(batch, device=hidden_states.device), last]


def sequence_classification_loss(logits: torch.Tensor, labels: torch.Tensor, config: Any) -> torch.Tensor:
    """HF's problem-type logic: regression, single-label or multi-label classification."""
    num_labels = config.num_labels
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    labels = labels.to(logits.device)
    if config.problem_type == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.squeeze(-1).float(), labels.squeeze(-1).float())
        return F.mse_loss(logits.float(), labels.float())
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits.float().view(-1, num_labels), labels.view(-1))
    if config.problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    raise ValueError(
        f"config field `problem_type`={config.problem_type!r} is invalid: expected 'regression', "
        "'single_label_classification' or 'multi_label_classification'."
    )


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Next-token cross-entropy (logits[:, t] predicts labels[:, t+1]), float32, HF's own loss.

    `kwargs` may carry `num_items_in_batch` (passed by `Trainer` so that gradient accumulation
    averages over tokens, not micro-batches) and `ignore_index`.
    """
    kwargs = {k: v for k, v in kwargs.items() if k in ("num_items_in_batch", "ignore_index")}
    return ForCausalLMLoss(logits, labels, vocab_size=logits.shape[-1], **kwargs)


class GeometricPreTrainedModel(PreTrainedModel):
    """Base of every family's `PreTrainedModel`.

    Subclasses set `config_class`, `_no_split_modules` and `remote_code_auto_map` (Auto class name ->
    "module.Class" of the copied remote-code files).
    """

    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    remote_code_auto_map: dict[str, str] = {}

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

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
        # HF writes `auto_map` only for the saved class; a checkpoint should open through every Auto
        # class of its family, so the full map is written before saving.
        if self.remote_code_auto_map:
            self.config.auto_map = dict(self.remote_code_auto_map)
        return super().save_pretrained(save_directory, *args, **kwargs)


class ForCausalLMHead:
    """Causal-LM head shared by every family (HF's `Generic*` pattern); a family declares
    `class XForCausalLM(ForCausalLMHead, XPreTrainedModel, GenerationMixin)` and sets `backbone_class`.

    `self.model` is the backbone; its outputs have `feature_size` real features per token, which
    `lm_head` maps to the vocabulary. Families with an auxiliary objective (ZPX's centre term)
    override `auxiliary_loss` and `extra_outputs`; keyword arguments the head does not know
    (e.g. `output_phases`) go to the backbone.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    backbone_class: type[PreTrainedModel]
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
        logits = self.lm_head(hidden_states)

        loss = None
        if labels is not None:
            loss = causal_lm_loss(logits, labels, **loss_kwargs)
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


class ForSequenceClassificationHead:
    """Sequence-classification head shared by every family: a linear `score` on the features of the
    last real token (see `pool_last_token`), HF's regression / single- / multi-label losses."""

    backbone_class: type[PreTrainedModel]

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
            loss = sequence_classification_loss(logits, labels, self.config)
            auxiliary = self.auxiliary_loss(outputs)
            if auxiliary is not None:
                loss = loss + auxiliary
        output = SequenceClassifierOutputWithPast(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


def init_bias_log_context(length: int) -> float:
    """-log(n): sigmoid-attention bias initialisation for a context of n tokens (arXiv 2409.04431)."""
    return -math.log(max(int(length), 2))
