"""The fine-tuning loop every fine-tuned evaluation shares (GLUE's classifier, the NER tagger, SQuAD's
span head), in the order an evaluation uses it:

    Trainable    the LightningModule base of every fine-tuned head (optimizer, dev metrics after every epoch)
    Job, Fitting train a head with its encoder for the task's epochs, evaluating after each

The encoder it starts from is ``pretrainlab.export.pretrained`` (``Pretrained``, ``load_pretrained``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig

from pretrainlab.evaluation.base import Trained
from pretrainlab.model.encoder import Encoder
from pretrainlab.optim import OptimConfig
from pretrainlab.runtime.nonfinite import NonFiniteWatch
from pretrainlab.runtime.script import RunScript, log_interval
from pretrainlab.runtime.settings import Devices, uses_cuda
from pretrainlab.runtime.signals import SaveOnSignal

# --- The trainable ----------------------------------------------------------------------------
# What every fine-tuned head on a pretrained (or freshly initialised) encoder shares: ``Trainable``.
# The heads themselves belong to their evaluations (GLUE's classifier, the NER tagger, SQuAD's span
# head: ``pretrainlab.evaluation``). Their dev sets are scored at the end of every epoch, logged as
# ``val/<metric>`` and kept in ``history``.


class Trainable(L.LightningModule):
    """What every fine-tuned head shares: the encoder, AdamW with warmup and linear decay, the
    non-finite loss watch, logging, and an evaluation after every epoch whose metrics go to
    ``val/<metric>`` and ``history``. Subclasses give ``logits``, ``loss``, ``validation_step`` (which
    appends to ``self._outputs[dataloader]``) and ``evaluate`` (outputs -> metrics)."""

    def __init__(self, encoder: Encoder, optim: OptimConfig, total_steps: int, compile: dict | None = None):
        """``compile``: ``torch.compile`` options for the forward (None: eager)."""
        super().__init__()
        self.encoder = encoder
        self.optim, self.total_steps = optim, total_steps
        self.history: list[dict] = []
        self.detail: dict | None = None  # what an evaluation adds to its results beside the metrics (NER's counts)
        self._outputs: dict[int, list] = {}
        self.nonfinite = NonFiniteWatch()
        self.compile_options = compile
        self._compiled: Callable[[dict], torch.Tensor] | None = (
            None  # made in setup(), in the process that trains (a compiled function does not pickle)
        )

    def setup(self, stage: str) -> None:
        if self.compile_options is not None and self._compiled is None:
            self._compiled = torch.compile(self.logits, **self.compile_options)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_compiled": None}

    def forward(self, batch: dict) -> torch.Tensor:
        return (self._compiled or self.logits)(batch)

    def logits(self, batch: dict) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def evaluate(self, outputs: dict[int, list]) -> dict[str, float]:
        raise NotImplementedError

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(self(batch), batch["labels"])
        self.nonfinite.record(loss)  # looked at when logging and before every evaluation
        if (self.global_step + 1) % log_interval(self.trainer) == 0:
            self.log("train/loss", loss.detach(), prog_bar=True)
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.nonfinite.advance()
        if self.trainer.global_step % log_interval(self.trainer) == 0:
            self._check_finite()

    def on_train_start(self) -> None:
        self.nonfinite.start(self.global_step)

    def _check_finite(self) -> None:
        self.nonfinite.check("fine-tuning loss", "Lower task.lr or raise task.warmup.")

    # --- evaluation -------------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._check_finite()
        self._outputs = {}

    def on_validation_epoch_end(self) -> None:
        if not self._outputs:
            return
        metrics = self.evaluate(self._outputs)
        if not metrics:
            return
        for name, value in metrics.items():
            self.log(f"val/{name}", value, rank_zero_only=True)
        if not self.trainer.sanity_checking:
            self.history.append({"epoch": self.current_epoch + 1, "step": self.global_step, "metrics": metrics})

    def world_size(self) -> int:
        """The processes scoring the dev sets: the trainer's, or 1 outside one (``evaluation.fused``)."""
        return self._trainer.world_size if self._trainer is not None else 1

    def _all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.all_gather(x))

    def gather_padded(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every rank's tensors (their first dimension may differ by one: padded to agree), flattened."""
        out = []
        for x in tensors:
            size = torch.tensor([x.shape[0]], device=x.device)
            longest = int(self._all_gather(size).max())
            padded = F.pad(x, (0, 0) * (x.dim() - 1) + (0, longest - x.shape[0]), value=-1)
            out.append(self._all_gather(padded).flatten(0, 1))
        keep = out[0] >= 0 if out[0].dim() == 1 else torch.ones(len(out[0]), dtype=torch.bool, device=out[0].device)
        return tuple(x[keep] for x in out)

    # --- optimisation -----------------------------------------------------------------------------
    def configure_optimizers(self):
        opt = self.optim.optimizer(self, "mixed" in str(self.trainer.precision))
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": self.optim.schedule(opt, self.total_steps), "interval": "step"},
        }


# --- The loop ---------------------------------------------------------------------------------
# The loop every fine-tuned evaluation shares (GLUE's classifier, the NER tagger, SQuAD's span head):
# an evaluation builds a :class:`Job` (its head on the encoder, a ``Trainable``, and its data loaders)
# and hands it to :class:`Fitting`, which the runner (``evaluation.run``) lends it. ``Fitting.fit``
# trains it for ``task.epochs`` with the run's trainer, logger and signal handling, evaluates the dev
# sets after every epoch, and returns the fields its results share: the metrics after the **last**
# epoch (never the best epoch picked on the same dev set, which would flatter every model), every
# epoch's in ``history``.


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
    """The run a fine-tuned evaluation trains in: its recipe's epochs, batch size and learning rate
    (``evaluation``, the typed task), ``devices`` (devices, batch split, compile) and ``optim`` (AdamW with
    the task's recipe) for the job's module; ``fit(job)`` trains and evaluates it.
    ``make_logger(eval_examples)``: the run's logger, built once the job knows its dev sets."""

    def __init__(
        self,
        cfg: DictConfig,
        script: RunScript,
        evaluation: Trained,
        devices: Devices,
        optim: OptimConfig,
        make_logger: Callable[[dict[str, int]], Any],
        resume_hint: str,
    ):
        self.cfg, self.script, self.recipe, self.name = cfg, script, evaluation, evaluation.name
        self.devices, self.optim = devices, optim
        self.make_logger, self.resume_hint = make_logger, resume_hint
        self.logger: Any = None
        self.stopper: SaveOnSignal | None = None
        self.primary = True  # this process writes the results (the first rank)

    @property
    def precision(self) -> str:
        """The trainer's precision (32-true, bf16-mixed, ...)."""
        return str(self.cfg.trainer.get("precision", "32-true"))

    @property
    def on_cuda(self) -> bool:
        return uses_cuda(self.cfg)

    @property
    def log_every(self) -> int:
        """The trainer's logging interval, in optimizer steps."""
        return int(self.cfg.trainer.get("log_every_n_steps", 10))

    @property
    def progress_bar(self) -> bool:
        return bool(self.cfg.trainer.get("enable_progress_bar", True))

    def steps(self, examples: int) -> tuple[int, int]:
        """(optimizer steps per epoch, in all) for ``examples`` training examples."""
        per_epoch = math.ceil(examples / self.recipe.batch_size)
        return per_epoch, per_epoch * int(self.recipe.epochs)

    def fit(self, job: Job) -> dict:
        """Train ``job`` for the recipe's epochs and evaluate it after every epoch; the results' shared
        fields. A signal stops it without results (the run's command continues it); dev metrics that
        are not finite (fine-tuning diverged) are refused."""
        cfg, epochs = self.cfg, int(self.recipe.epochs)
        module = job.module
        total_steps = job.steps_per_epoch * epochs
        self.logger = self.make_logger(job.eval_examples)
        self.stopper = stopper = SaveOnSignal(None)
        trainer: L.Trainer = instantiate(
            cfg.trainer,
            max_epochs=epochs,
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
        if stopper.stopped or (stopper.signum is not None and len(module.history) < epochs):
            self.script.exit_code = stopper.exit_code  # stopping is always for a signal: signum is set
            stopper.exit(
                f"fine-tuning of {self.name} (seed {cfg.seed}) stopped at step {trainer.global_step} of "
                f"{total_steps}; no results were written. Continue with:\n  {self.resume_hint}"
            )
        self.primary = trainer.is_global_zero
        return self.outcome(job, trainer.global_step)

    def outcome(self, job: Job, steps: int) -> dict:
        """The results' shared fields of ``job`` trained for ``steps`` optimizer steps: the metrics after
        the last epoch, every epoch's; dev metrics that are not finite (fine-tuning diverged) are refused."""
        module, cfg = job.module, self.cfg
        if not module.history:
            raise RuntimeError("fine-tuning finished without an evaluation; is task.epochs at least 1?")
        final = module.history[-1]["metrics"]
        diverged = {k: v for k, v in final.items() if not math.isfinite(v)}
        if diverged:
            raise FloatingPointError(
                f"{self.name} seed {cfg.seed}: the dev metrics are not finite ({', '.join(f'{k}={v}' for k, v in diverged.items())}"
                f"): fine-tuning diverged. No results were written; lower task.lr (it is {self.recipe.lr}) or check the "
                f"encoder."
            )
        return {
            "metrics": final,
            "reported_epoch": "last",
            "history": module.history,
            "eval_examples": job.eval_examples,
            **job.fields,
            **({"detail": module.detail} if module.detail else {}),
            "steps": steps,
        }

    def finish(self) -> None:
        """After the results are written: a signal that came during the last evaluation stops the run now."""
        if self.stopper is not None and self.stopper.signum is not None:
            self.stopper.exit(
                f"fine-tuning of {self.name} (seed {self.cfg.seed}) had finished; its results are written. Stopping."
            )


__all__ = ["Fitting", "Job", "Trainable"]
