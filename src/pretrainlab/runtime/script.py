"""A run's skeleton, shared by pretraining and fine-tuning: its directory, the process set-up
(malloc, seed), its config file, its logger (closed with the run's exit code) and progress bar.

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
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from pretrainlab.runtime import hydra, wandb_runs
from pretrainlab.runtime.console import quiet_third_parties
from pretrainlab.runtime.devices import set_matmul_precision
from pretrainlab.runtime.loggers import build_logger
from pretrainlab.runtime.malloc import keep_freed_memory


def rerun_command() -> str:
    """This process's command line, quoted for the shell: the command that runs it again (a study
    or a GLUE suite continues where it stopped when run again)."""
    return " ".join(["python", *map(shlex.quote, sys.argv)])


@dataclass
class RunScript:
    cfg: DictConfig
    dir: Path
    choices: dict[str, str]  # config group -> option, logged as choice.<group>
    exit_code: int = 1
    logger: Logger | bool = field(default=False, repr=False)
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
        self.logger = build_logger(self.cfg, self.dir, self.choices, **kwargs)
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


__all__ = ["RunScript", "rerun_command"]
