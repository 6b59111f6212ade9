"""Checks of a run's numeric settings, made before any work starts (corpus, tokenizer, training).

Each failed check is a :class:`~pretrainlab.model.encoder.ConfigError` naming the setting, its value,
what it must be, and where it is set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pretrainlab.config import ConfigError


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
    check(cfg, FINETUNE, "conf/finetune.yaml, conf/task/<task>.yaml or conf/glue.yaml")


__all__ = ["check", "check_finetuning", "check_pretraining"]
