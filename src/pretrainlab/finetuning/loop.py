"""The loop every fine-tuned evaluation shares (GLUE's classifier, the NER tagger, SQuAD's span head):
an evaluation builds a :class:`Job` (its head on the encoder, a ``Trainable``, and its data loaders)
and hands it to :class:`Fitting`, which the runner (``evaluation.run``) lends it. ``Fitting.fit``
trains it for ``task.epochs`` with the run's trainer, logger and signal handling, evaluates the dev
sets after every epoch, and returns the fields its results share: the metrics after the **last**
epoch (never the best epoch picked on the same dev set, which would flatter every model), every
epoch's in ``history``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from pretrainlab.finetuning.module import Trainable
from pretrainlab.optim import OptimConfig
from pretrainlab.runtime.devices import DevicePlan
from pretrainlab.runtime.script import RunScript
from pretrainlab.runtime.signals import SaveOnSignal


@dataclass
class Job:
    """What a fine-tuned evaluation brings to the shared loop: its head on the encoder, its batches,
    and what its results add (``fields``: examples, its trivial baseline's metrics, its data)."""

    module: Trainable
    train_loader: torch.utils.data.DataLoader
    eval_loaders: list[torch.utils.data.DataLoader]
    steps_per_epoch: int
    eval_examples: dict[str, int]
    fields: dict = field(default_factory=dict)


class Fitting:
    """The run a fine-tuned evaluation trains in: ``plan`` (devices, batch split, compile) and ``optim``
    (AdamW with the task's recipe) for the job's module; ``fit(job)`` trains and evaluates it.
    ``make_logger(eval_examples)``: the run's logger, built once the job knows its dev sets."""

    def __init__(
        self,
        cfg: DictConfig,
        script: RunScript,
        name: str,
        plan: DevicePlan,
        optim: OptimConfig,
        make_logger: Callable[[dict[str, int]], Any],
        resume_hint: str,
    ):
        self.cfg, self.script, self.name = cfg, script, name
        self.plan, self.optim = plan, optim
        self.make_logger, self.resume_hint = make_logger, resume_hint
        self.logger: Any = None
        self.stopper: SaveOnSignal | None = None
        self.primary = True  # this process writes the results (the first rank)

    def steps(self, examples: int) -> tuple[int, int]:
        """(optimizer steps per epoch, in all) for ``examples`` training examples."""
        per_epoch = math.ceil(examples / self.cfg.task.batch_size)
        return per_epoch, per_epoch * int(self.cfg.task.epochs)

    def fit(self, job: Job) -> dict:
        """Train ``job`` for ``task.epochs`` and evaluate it after every epoch; the results' shared
        fields. A signal stops it without results (the run's command continues it); dev metrics that
        are not finite (fine-tuning diverged) are refused."""
        cfg = self.cfg
        module = job.module
        total_steps = job.steps_per_epoch * cfg.task.epochs
        self.logger = self.make_logger(job.eval_examples)
        self.stopper = stopper = SaveOnSignal(None)
        trainer: L.Trainer = instantiate(
            cfg.trainer,
            max_epochs=cfg.task.epochs,
            default_root_dir=str(self.script.dir),
            logger=self.logger,
            callbacks=[stopper, *self.script.callbacks()],
            limit_val_batches=1.0,
            num_sanity_val_steps=0,
            check_val_every_n_epoch=1,
            enable_checkpointing=False,
            gradient_clip_val=self.optim.grad_clip,
            log_every_n_steps=min(cfg.trainer.get("log_every_n_steps", 10), job.steps_per_epoch),
        )
        stopper.fit(trainer, module, train_dataloaders=job.train_loader, val_dataloaders=job.eval_loaders)
        if stopper.stopped or (stopper.signum is not None and len(module.history) < cfg.task.epochs):
            self.script.exit_code = stopper.exit_code  # stopping is always for a signal: signum is set
            stopper.exit(
                f"fine-tuning of {self.name} (seed {cfg.seed}) stopped at step {trainer.global_step} of "
                f"{total_steps}; no results were written. Continue with:\n  {self.resume_hint}"
            )
        if not module.history:
            raise RuntimeError("fine-tuning finished without an evaluation; is task.epochs at least 1?")
        final = module.history[-1]["metrics"]
        diverged = {k: v for k, v in final.items() if not math.isfinite(v)}
        if diverged:
            raise FloatingPointError(
                f"{self.name} seed {cfg.seed}: the dev metrics are not finite ({', '.join(f'{k}={v}' for k, v in diverged.items())}"
                f"): fine-tuning diverged. No results were written; lower task.lr (it is {cfg.task.lr}) or check the "
                f"encoder."
            )
        self.primary = trainer.is_global_zero
        return {
            "metrics": final,
            "reported_epoch": "last",
            "history": module.history,
            "eval_examples": job.eval_examples,
            **job.fields,
            **({"detail": module.detail} if getattr(module, "detail", None) else {}),
            "steps": trainer.global_step,
        }

    def finish(self) -> None:
        """After the results are written: a signal that came during the last evaluation stops the run now."""
        if self.stopper is not None and self.stopper.signum is not None:
            self.stopper.exit(
                f"fine-tuning of {self.name} (seed {self.cfg.seed}) had finished; its results are written. Stopping."
            )


__all__ = ["Fitting", "Job"]
