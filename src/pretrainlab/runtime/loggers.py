"""Experiment loggers: Weights & Biases (offline by default), CSV, or none.

W&B runs are written under the run directory (``<run_dir>/wandb/offline-run-*``) and can be
uploaded later with ``wandb sync <run_dir>/wandb/offline-run-*``. The composed config is logged as
a flat dict of dotted keys plus ``choice.<group>`` entries, so keys locked by a W&B sweep (e.g.
``objective``) never hide the composed groups' values.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from lightning.pytorch import loggers as pl_loggers
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("pretrainlab")


class WandbLogger(pl_loggers.WandbLogger):
    """Lightning's W&B logger, less the ``anonymous`` argument it always passes to ``wandb.init``:
    wandb deprecated that setting and warns about it at every run, even when it is None."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)


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
        kwargs["name"] = lcfg.get("name") or name or run_name(cfg, choices)
        kwargs["group"] = lcfg.get("group") or group or cfg.objective.name
        kwargs["job_type"] = job_type
        # a resumed run continues the same W&B run: the one started in this directory (a copy of a run
        # directory starts its own, or the copy's logs would be merged into the original's W&B run)
        wandb_id, written_in = read_wandb_id(run_dir)
        if lcfg.get("id") is None and resume and wandb_id:
            if written_in is None or written_in == str(run_dir.resolve()):
                kwargs["id"] = wandb_id
                kwargs["resume"] = "allow"
            else:
                log.info(
                    "%s continues a run copied from %s: a new W&B run is started (continuing its W&B run %s "
                    "would merge the two)",
                    run_dir,
                    written_in,
                    wandb_id,
                )
    logger = instantiate(lcfg, **kwargs)
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    params.update({f"choice.{k}": v for k, v in choices.items()})
    params.update(extra or {})
    logger.log_hyperparams(params)
    if isinstance(logger, pl_loggers.WandbLogger):
        _remember_id(logger, run_dir / ".wandb_id")
    return logger


@rank_zero_only
def _remember_id(logger: pl_loggers.WandbLogger, path: Path) -> None:
    """``.wandb_id``: the W&B run's id, and on a second line the run directory it was started in."""
    path.write_text(f"{logger.experiment.id}\n{path.parent.resolve()}\n")


def read_wandb_id(run_dir: Path) -> tuple[str | None, str | None]:
    """(W&B run id, the directory it was started in) from ``<run_dir>/.wandb_id``; the directory is
    None in files written before it was recorded; (None, None) without the file."""
    path = Path(run_dir) / ".wandb_id"
    if not path.is_file():
        return None, None
    lines = path.read_text().splitlines()
    return (lines[0].strip() or None) if lines else None, (lines[1].strip() or None) if len(lines) > 1 else None


STOPPED = {130: "interrupted", 143: "preempted"}  # exit codes of SIGINT and SIGTERM


@rank_zero_only
def finish_logger(logger: Logger | bool, exit_code: int = 0) -> None:
    """Close the W&B run with the run's exit code, so that the next run in this process (multirun,
    tests) starts a new one. A run that did not finish is stored as failed (non-zero exit code);
    one stopped by Ctrl-C or SIGTERM also gets the tag and summary ``stopped`` "interrupted" or
    "preempted"."""
    if isinstance(logger, pl_loggers.WandbLogger):
        import wandb

        run = wandb.run
        if run is None:
            return
        if exit_code in STOPPED:
            run.tags = tuple(run.tags or ()) + (STOPPED[exit_code],)
            run.summary["stopped"] = STOPPED[exit_code]
        wandb.finish(exit_code=exit_code)


def log_interval(trainer: Any) -> int:
    """Lightning's ``log_every_n_steps``: set on the trainer when it is built, not declared on its class."""
    return int(trainer.log_every_n_steps)
