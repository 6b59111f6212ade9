"""A run's settings, checked before any work starts, and what they decide.

- the numeric settings (optimizer, trainer, budgets, a task's): each failed check is a
  :class:`~pretrainlab.config.ConfigError` naming the setting, its value, what it must be, and where
  it is set (``check_pretraining``, ``check_finetuning``, ``check`` for an evaluation's own);
- the devices: how many processes a trainer config runs, how the global batch splits over them
  (``Devices``: micro-batch, accumulation, compile options, static shapes), the device settings
  that cannot work (``check_precision``, ``refuse_multirun_ddp``), where a task that trains nothing
  runs, and the process's float32 matmul precision (``set_matmul_precision``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from pretrainlab.config import ConfigError

# --- Numeric settings ----------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def integer(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: _is_int(v) and v >= low), f"an integer of at least {low}"


def optional_integer(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v is None or (_is_int(v) and v >= low)), f"null or an integer of at least {low}"


def positive() -> tuple[Callable[[Any], bool], str]:
    return (lambda v: _is_number(v) and v > 0), "positive (a number above 0)"


def optional_positive() -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v is None or (_is_number(v) and v > 0)), "positive (a number above 0) or null"


def at_least(low: float) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: _is_number(v) and v >= low), f"a number of at least {low}"


def fraction(closed_low: bool = False) -> tuple[Callable[[Any], bool], str]:
    if closed_low:
        return (lambda v: _is_number(v) and 0 <= v < 1), "a number in [0, 1)"
    return (lambda v: _is_number(v) and 0 < v < 1), "a number between 0 and 1 (exclusive)"


def one_of(*choices: Any) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: any(v is c or (type(v) is type(c) and v == c) for c in choices)), "one of " + ", ".join(
        str(c).lower() if isinstance(c, bool) else str(c) for c in choices
    )


def check(cfg: DictConfig, rules: dict[str, tuple[Callable[[Any], bool], str]], where: str) -> None:
    """Apply ``rules`` (dotted key -> (test, what it must be)) to ``cfg``; keys absent from ``cfg``
    are skipped. ``where``: the config file the keys come from, for the message."""
    for key, (ok, want) in rules.items():
        if OmegaConf.select(cfg, key, default="<absent>") == "<absent>":
            continue
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ConfigError(f"{key}={value!r}: must be {want}. Set it in {where} or on the command line ({key}=...).")


OPTIM = {
    "optim.lr": positive(),
    "optim.weight_decay": at_least(0.0),
    "optim.eps": positive(),
    "optim.warmup": at_least(0.0),
    "optim.min_lr_ratio": (lambda v: isinstance(v, (int, float)) and 0 <= v <= 1, "a number in [0, 1]"),
    "optim.grad_clip": optional_positive(),
    "optim.betas.0": fraction(closed_low=True),
    "optim.betas.1": fraction(closed_low=True),
}

SPEED = {
    "compile": one_of("auto", True, False),
    "compile_mode": one_of("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "static_shapes": one_of("auto", True, False),
    "tf32": one_of(True, False),
}

TRAINER = {
    "trainer.num_nodes": integer(1),
    "trainer.log_every_n_steps": integer(1),
    "trainer.limit_val_batches": (lambda v: _is_number(v) and v >= 0, "a non-negative number (batches, or a fraction)"),
    "trainer.num_sanity_val_steps": integer(-1),
}

PRETRAIN = {
    "seed": integer(0),
    "split_seed": integer(0),
    "max_seq_len": integer(8),
    "batch_size": integer(1),
    "device_batch_size": optional_integer(1),
    "val_every": integer(1),
    "checkpoint_every": integer(1),
    "num_workers": integer(0),
    "progress_refresh_rate": integer(0),
    "val_fraction": fraction(),
    "budget.tokens": optional_positive(),
    "budget.flops": optional_positive(),
    "budget.minutes": optional_positive(),
    "on_nonfinite": one_of("stop", "skip"),
    **OPTIM,
    **TRAINER,
    **SPEED,
}

FINETUNE = {
    "seed": integer(0),
    "num_workers": integer(0),
    "progress_refresh_rate": integer(0),
    "task.batch_size": integer(1),
    "task.epochs": integer(1),
    "task.lr": positive(),
    "task.max_seq_len": integer(8),
    "task.warmup": at_least(0.0),
    "task.weight_decay": at_least(0.0),
    "task.classifier_dropout": fraction(closed_low=True),
    "glue.max_train_examples": optional_integer(1),
    "glue.max_eval_examples": optional_integer(1),
    "glue.synthetic.scale": positive(),
    **TRAINER,
    **SPEED,
}


def check_pretraining(cfg: DictConfig) -> None:
    check(cfg, PRETRAIN, "conf/train.yaml (or the chosen conf/optim, conf/trainer file)")
    budgets = [k for k, v in (cfg.get("budget") or {}).items() if v is not None]
    if len(budgets) > 1:
        raise ConfigError(f"set one budget, not {len(budgets)}: {', '.join(f'budget.{k}' for k in budgets)}.")
    if not budgets and not (_is_int(cfg.max_steps) and cfg.max_steps >= 1):
        raise ConfigError(
            f"max_steps={cfg.max_steps!r}: must be an integer of at least 1 (or set a budget: "
            f"budget.tokens, budget.flops or budget.minutes). Set it in conf/train.yaml or on the "
            f"command line (max_steps=...)."
        )


def check_finetuning(cfg: DictConfig) -> None:
    check(cfg, FINETUNE, "conf/finetune.yaml, conf/task/<task>.yaml or conf/suite.yaml")


# --- Devices -------------------------------------------------------------------------------------


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
class Devices:
    """Where and how a run trains, decided once from its config (``Devices.of``, where the
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
    ) -> Devices:
        """The devices, batch split and compile settings of ``cfg.trainer`` and
        ``cfg.compile``/``compile_mode``/``static_shapes``, with a global batch of ``batch_size`` (ConfigError naming ``setting`` where it does not split over
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


__all__ = [
    "Devices",
    "batch_split",
    "check",
    "check_finetuning",
    "check_precision",
    "check_pretraining",
    "compile_options",
    "dynamic_shape_options",
    "refuse_multirun_ddp",
    "set_matmul_precision",
    "static_shapes",
    "uses_cuda",
    "world_size",
]
