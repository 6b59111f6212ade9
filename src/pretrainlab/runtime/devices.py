"""Devices: how many processes a trainer config runs, how the global batch splits over them, and
the device settings that cannot work."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf

from pretrainlab.config import ConfigError


def world_size(cfg: DictConfig) -> int:
    """Processes (devices x nodes) that ``cfg.trainer`` trains on."""
    devices = cfg.trainer.get("devices", 1)
    nodes = cfg.trainer.get("num_nodes", 1) or 1
    if isinstance(devices, int) and devices > 0:
        return devices * nodes
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        return len(devices) * nodes
    if devices in ("auto", -1, "-1"):
        accelerator = str(cfg.trainer.get("accelerator", "auto"))
        if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
            return max(1, torch.cuda.device_count()) * nodes
        return nodes
    return int(devices) * nodes


def uses_cuda(cfg: DictConfig) -> bool:
    """Whether ``cfg.trainer`` trains on CUDA GPUs."""
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def compile_options(cfg: DictConfig) -> dict | None:
    """``torch.compile`` arguments from ``cfg.compile`` (auto: on CUDA GPUs) and ``cfg.compile_mode``,
    or None (eager). Shapes are fixed with static shapes, else dynamic where they vary (with
    ``dynamic_shape_options``)."""
    on = cfg.get("compile", "auto")
    if on == "auto":
        on = uses_cuda(cfg)
    if not on:
        return None
    mode = cfg.get("compile_mode", "default")
    if static_shapes(cfg):
        return {"mode": None if mode == "default" else mode, "dynamic": False}
    return {"dynamic": None, "options": dynamic_shape_options(mode)}


def dynamic_shape_options(mode: str) -> dict:
    """Inductor options for a compile whose shapes vary from batch to batch: the mode's own (torch.compile
    takes a mode or options, not both), with inductor's coalescing analysis of kernel tilings off.

    That analysis does not apply to dynamic shapes (inductor's config says so), yet it runs on them, and
    in torch 2.11 on CUDA it fails on kernels of this encoder once the step is recompiled with symbolic
    shapes (``InductorError: AssertionError`` in ``tiling_utils.get_pw_red_splits``, pytorch/pytorch#181563;
    on an H200 it stopped the resume tests and the quick study at their second batch shape)."""
    import torch._inductor
    import torch._inductor.config

    options = dict(torch._inductor.list_mode_options(mode))
    if hasattr(torch._inductor.config.triton, "coalesce_tiling_analysis"):  # absent before the analysis existed
        options["triton.coalesce_tiling_analysis"] = False
    return options


def static_shapes(cfg: DictConfig) -> bool:
    """Whether every batch has the same shapes: ``cfg.static_shapes``, or (auto) when CUDA graphs
    (compile modes reduce-overhead and max-autotune) need them."""
    static = cfg.get("static_shapes", "auto")
    if static == "auto":
        on = cfg.get("compile", "auto")
        on = uses_cuda(cfg) if on == "auto" else on
        return bool(on) and cfg.get("compile_mode", "default") in ("reduce-overhead", "max-autotune")
    return bool(static)


@dataclass(frozen=True)
class DevicePlan:
    """Where and how a run trains, decided once from its config (``DevicePlan.of``, where the
    config is checked) and handed to everything that needs it: the number of processes, how the
    global batch splits over them, and the compile settings.

    ``micro_batch`` x ``accumulate`` x ``world`` = the global batch, exactly."""

    world: int
    micro_batch: int
    accumulate: int
    compile: dict | None  # torch.compile's arguments, None: eager
    static_shapes: bool  # every batch max_seq_len wide with a fixed number of masked slots
    compile_mode: str = "default"

    @classmethod
    def of(
        cls, cfg: DictConfig, batch_size: int, device_batch_size: int | None = None, setting: str = "batch_size"
    ) -> DevicePlan:
        """The plan for ``cfg.trainer`` and ``cfg.compile``/``compile_mode``/``static_shapes``, with a
        global batch of ``batch_size`` (ConfigError naming ``setting`` where it does not split over
        the devices)."""
        world = world_size(cfg)
        micro, accumulate = batch_split(batch_size, world, device_batch_size, setting)
        return cls(
            world, micro, accumulate, compile_options(cfg), static_shapes(cfg), cfg.get("compile_mode", "default")
        )

    def describe(self) -> str:
        return (
            f"global batch {self.world * self.micro_batch * self.accumulate} = {self.world} device(s) x {self.micro_batch} micro-batch x "
            f"{self.accumulate} accumulation" + (f"; compiled ({self.compile_mode})" if self.compile else "")
        )


def set_matmul_precision(tf32: bool) -> None:
    """TF32 for float32 matmuls and convolutions on CUDA GPUs that have it (on: ~8x the float32
    throughput of an A100/H100 at 10 bits of mantissa; results move by numerical noise only)."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")


def batch_split(
    batch_size: int, world: int, device_batch_size: int | None, setting: str = "batch_size"
) -> tuple[int, int]:
    """(micro-batch per device, gradient accumulation) for a global ``batch_size`` on ``world``
    devices: batch_size = world x micro-batch x accumulation, exactly. ``setting``: the batch size's
    name in the config, for the error."""
    if batch_size % world:
        raise ConfigError(
            f"{setting}={batch_size} is not divisible by the {world} devices; the global batch "
            f"must split evenly across devices."
        )
    per_device = batch_size // world
    micro = device_batch_size or per_device
    if micro > per_device or per_device % micro:
        raise ConfigError(
            f"device_batch_size={device_batch_size} does not divide the per-device batch {per_device} "
            f"({setting}={batch_size} / {world} devices); choose a divisor of {per_device}."
        )
    return micro, per_device // micro


def check_precision(cfg: DictConfig) -> None:
    """fp16 on CPU is refused: it has no fast kernels there."""
    precision = str(cfg.trainer.get("precision", "32-true"))
    if not uses_cuda(cfg) and precision.startswith("16"):
        raise ConfigError(
            f"trainer.precision={precision} on CPU: float16 has no fast CPU kernels and runs orders of "
            f"magnitude slower. Use trainer.precision=bf16-mixed (or 32-true) on CPU."
        )


def refuse_multirun_ddp(cfg: DictConfig) -> None:
    """Hydra multirun + Lightning's ``ddp`` (which re-executes the command for every rank) makes
    each rank start its own multirun (hydra#2070): refused, pointing to what works."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    strategy = str(cfg.trainer.get("strategy", "auto"))
    if strategy in ("ddp", "ddp_find_unused_parameters_true") and world_size(cfg) > 1:
        raise ConfigError(
            "Hydra multirun (-m) with trainer.strategy=ddp is not supported: ddp re-runs the command for every "
            "rank, and each rank would start its own multirun. Use trainer.strategy=ddp_spawn for multirun, or run "
            "one process per run (a W&B agent: sweeps/*.yaml; or a shell loop over python train.py ...)."
        )


def inference_device(cfg: DictConfig) -> torch.device:
    """Where a task that trains nothing (zero-shot scoring, feature extraction) runs: the GPU when
    there is one and the trainer config allows it, else the CPU."""
    accelerator = str(cfg.trainer.get("accelerator", "auto")) if cfg.get("trainer") else "auto"
    if torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda"):
        return torch.device("cuda")
    return torch.device("cpu")


def inference_autocast(cfg: DictConfig, device: torch.device):
    """bf16 autocast on a GPU when the trainer's precision is bf16, else nothing."""
    precision = str(cfg.trainer.get("precision", "32")) if cfg.get("trainer") else "32"
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda" and "bf16" in precision)


__all__ = [
    "DevicePlan",
    "inference_autocast",
    "inference_device",
    "batch_split",
    "check_precision",
    "compile_options",
    "dynamic_shape_options",
    "refuse_multirun_ddp",
    "set_matmul_precision",
    "static_shapes",
    "uses_cuda",
    "world_size",
]
