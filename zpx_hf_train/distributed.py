"""How a multi-process launch trains: on CUDA as accelerate does, without CUDA on the CPUs with gloo (or it stops).

- With CUDA, accelerate runs DDP, FSDP and DeepSpeed itself (`ddp_gpu.yaml`, `fsdp.yaml`, `deepspeed_zero2.yaml`).
- Without CUDA, a multi-process launch trains on the CPUs with gloo. accelerate starts several CPU processes only
  through its torchrun launcher, and there it gives each process a world of one unless told to use the CPU, so
  this module selects accelerate's CPU DDP. accelerate cannot shard on the CPU; an FSDP launch is sharded here
  with FSDP2's `fully_shard` (one unit per decoder layer, plus the root) and saved as one full state dict.
  DeepSpeed needs CUDA and stops.
- A launch that hides the GPUs says it means the CPUs (`CUDA_VISIBLE_DEVICES` without a valid id:
  `CUDA_VISIBLE_DEVICES=-1 accelerate launch ...`; `ddp_cpu.yaml` and `fsdp_cpu.yaml` set `gpu_ids: "-1,-1"`,
  which accelerate < 1.16 always exports and 1.16 exports only where torch sees an accelerator). Any other
  launch without CUDA (a GPU config, or a CPU config under accelerate >= 1.16 on a machine with no GPU) warns
  that it trains on the CPUs, since the config that asked cannot be told apart there.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

from .errors import ConfigError

_cpu_fsdp: dict[str, Any] = {}  # set once per process by `configure_launch` for an FSDP launch on CPU
_warned_cpu_launch: list[bool] = []  # the CPU-launch warning is printed once, by rank 0


def configure_launch() -> str:
    """Select the training mode of this process: `single`, `accelerate` (CUDA), `cpu-ddp` or `cpu-fsdp`."""
    if _cpu_fsdp:
        return "cpu-fsdp"
    if os.environ.get("LOCAL_RANK") is None:
        return "single"
    import torch

    if torch.cuda.is_available():
        return "accelerate"
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        raise ConfigError("DeepSpeed needs CUDA GPUs; on CPUs use configs/accelerate/ddp_cpu.yaml or fsdp_cpu.yaml.")
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not gpus_hidden() and os.environ.get("RANK", "0") == "0" and not _warned_cpu_launch:
        _warned_cpu_launch.append(True)
        world = os.environ.get("WORLD_SIZE", "several")
        print(
            f"zpx-train: warning: CUDA is not available, so this {world}-process launch trains on the CPUs with "
            f"gloo ({'FSDP2' if fsdp else 'DDP'}); launch with CUDA_VISIBLE_DEVICES=-1 to say so and silence this.",
            file=sys.stderr,
            flush=True,
        )
    os.environ["ACCELERATE_USE_CPU"] = "true"  # accelerate's MULTI_CPU state: gloo, one world
    if not fsdp:
        return "cpu-ddp"
    unsupported = {
        "FSDP_VERSION": ("2", "fsdp_version: 2"),
        "FSDP_OFFLOAD_PARAMS": ("false", "fsdp_offload_params: false"),
        "FSDP_ACTIVATION_CHECKPOINTING": ("false", "fsdp_activation_checkpointing: false"),
    }
    for name, (wanted, setting) in unsupported.items():
        value = os.environ.get(name, wanted).lower()
        if value != wanted:
            raise ConfigError(f"FSDP on CPU supports `{setting}` only (the launch sets {name}={value}).")
    if os.environ.get("ACCELERATE_MIXED_PRECISION", "no") == "fp16":
        raise ConfigError("FSDP on CPU does not support fp16 (no gradient scaler there); use bf16 or no.")
    os.environ.pop("ACCELERATE_USE_FSDP")  # accelerate cannot shard on CPU: `shard_model` does it
    _cpu_fsdp["reshard_after_forward"] = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() == "true"
    return "cpu-fsdp"


def gpus_hidden() -> bool:
    """Whether `CUDA_VISIBLE_DEVICES` is set and names no device (empty or negative ids): a CPU launch."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and all(not part.strip() or part.strip().startswith("-") for part in value.split(","))


def machine_count(world_size: int) -> int:
    """Machines (nodes) of the launch: torchrun gives each process `LOCAL_WORLD_SIZE`, the processes of its node."""
    return max(1, world_size // int(os.environ.get("LOCAL_WORLD_SIZE") or world_size or 1))


def cpu_fsdp_requested() -> bool:
    """Whether this process is an FSDP launch on CPU (sharded by `shard_model`)."""
    return bool(_cpu_fsdp)


def shard_model(model: Any) -> Any:
    """FSDP2 in place: every `_no_split_modules` layer is one unit, the root holds the rest."""
    from torch.distributed.fsdp import fully_shard

    reshard = _cpu_fsdp.get("reshard_after_forward", True)
    layer_names = set(model._no_split_modules or ())
    layers = [module for module in model.modules() if type(module).__name__ in layer_names]
    if not layers:
        raise ConfigError(f"FSDP: {type(model).__name__} names no decoder layer in `_no_split_modules` to shard.")
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return model


def full_state_dict(model: Any) -> dict[str, Any]:
    """The full (unsharded) state dict on rank 0, an empty dict elsewhere; every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def local_parameter_count(model: Any) -> int:
    """Parameters this process holds (its shards under FSDP)."""
    from torch.distributed.tensor import DTensor

    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())


def gather_objects(value: Any) -> list[Any]:
    """`value` from every process (a one-element list outside a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def process_zero_value(value: Any) -> Any:
    """`value` as process 0 has it (this process's own outside a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def state_dict_digest(state: dict[str, Any], keys: Any = None) -> str:
    """sha256 over the names, dtypes, shapes and bytes of a state dict (bit-exact fingerprint)."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(state if keys is None else keys):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


__all__ = [
    "configure_launch",
    "cpu_fsdp_requested",
    "full_state_dict",
    "gather_objects",
    "local_parameter_count",
    "process_zero_value",
    "shard_model",
    "state_dict_digest",
]
