"""Experiment loggers: Weights & Biases (offline by default; ``wandb_runs``), CSV, or none.

The composed config is logged as a flat dict of dotted keys plus ``choice.<group>`` entries, so
keys locked by a W&B sweep (e.g. ``objective``) never hide the composed groups' values. Closing a
W&B run with the run's exit code: ``wandb_runs.finish``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from lightning.pytorch import loggers as pl_loggers
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from pretrainlab.runtime import wandb_runs

log = logging.getLogger("pretrainlab")


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(d, list) and any(isinstance(x, (dict, list)) for x in d):
        for i, v in enumerate(d):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = d
    return out


def run_name(cfg: DictConfig, choices: dict[str, str]) -> str:
    model = choices.get("model", "model")
    return f"{cfg.objective.name}-{model}-s{cfg.seed}"


def build_logger(
    cfg: DictConfig,
    run_dir: Path,
    choices: dict[str, str],
    name: str | None = None,
    group: str | None = None,
    job_type: str = "pretrain",
    extra: dict | None = None,
    resume: bool = False,
) -> Logger | bool:
    """The configured logger, with the flattened config logged. W&B runs are named and grouped
    (defaults: ``<objective>-<model>-s<seed>``, grouped by objective) and typed by ``job_type``.
    ``resume``: the run continues from a checkpoint of this run directory, and so continues its
    W&B run (the id kept in ``.wandb_id``); otherwise it is a new W&B run."""
    lcfg = cfg.get("logger")
    if not lcfg or not lcfg.get("_target_"):
        return False
    kwargs: dict[str, Any] = {"save_dir": str(run_dir)}
    target = lcfg["_target_"]
    if target.endswith("WandbLogger"):
        kwargs.update(
            wandb_runs.init_kwargs(
                lcfg, run_dir, name or run_name(cfg, choices), group or cfg.objective.name, job_type, resume
            )
        )
    logger = instantiate(lcfg, **kwargs)
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    params.update({f"choice.{k}": v for k, v in choices.items()})
    params.update(extra or {})
    logger.log_hyperparams(params)
    if isinstance(logger, pl_loggers.WandbLogger):
        wandb_runs.remember_id(logger, run_dir / ".wandb_id")
    return logger


def log_interval(trainer: Any) -> int:
    """Lightning's ``log_every_n_steps``: set on the trainer when it is built, not declared on its class."""
    return int(trainer.log_every_n_steps)
