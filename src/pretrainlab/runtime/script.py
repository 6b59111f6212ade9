"""A run's skeleton, shared by pretraining and fine-tuning: its directory, the process set-up
(malloc, seed), its config file, its logger (closed with the run's exit code) and progress bar.

The logger is Weights & Biases (offline by default; ``wandb_runs``), CSV, or none. The composed config
is logged as a flat dict of dotted keys plus ``choice.<group>`` entries, so keys locked by a W&B sweep
(e.g. ``objective``) never hide the composed groups' values.

    script = RunScript.of(cfg, run_dir, choices)   # run_dir None: Hydra's output directory
    script.start()                                 # directory, malloc, seed: after the checks
    ...                                            # data, model
    script.save_config()
    logger = script.build_logger(...)
    try:
        trainer.fit(...)
        script.exit_code = 0                       # anything else is a failure, for W&B too
    finally:
        script.finish()
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch import loggers as pl_loggers
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from pretrainlab.runtime import hydra, wandb_runs
from pretrainlab.runtime.console import quiet_third_parties
from pretrainlab.runtime.malloc import keep_freed_memory
from pretrainlab.runtime.settings import set_matmul_precision


def rerun_command() -> str:
    """This process's command line, quoted for the shell: the command that runs it again (a study
    or an evaluation suite continues where it stopped when run again). A command that started this process
    through another (``experiments/slot.py``, which installs what the node lacks, then starts
    ``python -m pretrainlab.slot``) says its own in ``PRETRAINLAB_COMMAND``; a module run with ``-m``
    is named as one."""
    given = os.environ.get("PRETRAINLAB_COMMAND")
    if given:
        return given
    program = sys.argv[0]
    module = re.fullmatch(r".*src/pretrainlab/(?:(\w+)/)?__main__\.py", program)
    head = ["-m", f"pretrainlab.{module[1]}" if module[1] else "pretrainlab"] if module else [program]
    return " ".join(["python", *map(shlex.quote, [*head, *sys.argv[1:]])])


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
    concurrent: bool = False,
) -> Logger | bool:
    """The configured logger, with the flattened config logged. W&B runs are named and grouped
    (defaults: ``<objective>-<model>-s<seed>``, grouped by objective) and typed by ``job_type``.
    ``resume``: the run continues from a checkpoint of this run directory, and so continues its
    W&B run (the id kept in ``.wandb_id``); otherwise it is a new W&B run. ``concurrent``: other runs log
    from this process at the same time (a fused group), each to a W&B run of its own."""
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
        if concurrent:
            kwargs["reinit"] = "create_new"
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


@dataclass
class RunScript:
    cfg: DictConfig
    dir: Path
    choices: dict[str, str]  # config group -> option, logged as choice.<group>
    exit_code: int = 1
    logger: Logger | bool = field(default=False, repr=False)
    concurrent: bool = False  # other runs train in this process at the same time (a fused group): a W&B run of its own
    _file_handler: logging.FileHandler | None = field(default=None, repr=False)

    @classmethod
    def of(cls, cfg: DictConfig, run_dir: str | Path | None = None, choices: dict[str, str] | None = None) -> RunScript:
        if run_dir is None:
            from hydra.core.hydra_config import HydraConfig

            run_dir = HydraConfig.get().runtime.output_dir
        return cls(cfg, Path(run_dir), hydra.choices() if choices is None else choices)

    def start(self) -> None:
        """Create the run directory; set up the process (malloc, TF32, every seed)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        quiet_third_parties()
        self._log_to_file()
        if self.cfg.get("keep_freed_memory", True):
            keep_freed_memory()
        set_matmul_precision(bool(self.cfg.get("tf32", True)))
        L.seed_everything(self.cfg.seed, workers=True, verbose=False)

    def save_config(self) -> None:
        OmegaConf.save(self.cfg, self.dir / "config.yaml", resolve=True)

    def callbacks(self) -> list[Callback]:
        """The progress bar, unless the trainer config turns it off."""
        if not self.cfg.trainer.get("enable_progress_bar", True):
            return []
        return [TQDMProgressBar(refresh_rate=self.cfg.progress_refresh_rate)]

    def build_logger(self, **kwargs: Any) -> Logger | bool:
        self.logger = build_logger(self.cfg, self.dir, self.choices, concurrent=self.concurrent, **kwargs)
        return self.logger

    def finish(self) -> None:
        wandb_runs.finish(self.logger, self.exit_code)
        if self._file_handler is not None:
            logging.getLogger().removeHandler(self._file_handler)
            self._file_handler.close()
            self._file_handler = None

    def _log_to_file(self) -> None:
        """``<run dir>/train.log``: Hydra's job logging writes it for ``train.py``; a run started
        from Python (a study, a test) gets a file handler of its own for the length of the run."""
        root = logging.getLogger()
        here = self.dir.resolve()
        if any(
            isinstance(h, logging.FileHandler) and Path(h.baseFilename).resolve().parent == here for h in root.handlers
        ):
            return
        handler = logging.FileHandler(here / "train.log")
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        handler.setLevel(logging.INFO)
        root.addHandler(handler)
        if logging.getLogger("pretrainlab").getEffectiveLevel() > logging.INFO:
            logging.getLogger("pretrainlab").setLevel(logging.INFO)
        self._file_handler = handler


__all__ = ["RunScript", "build_logger", "log_interval", "rerun_command", "run_name"]
