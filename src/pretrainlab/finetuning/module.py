"""What every fine-tuned head on a pretrained (or freshly initialised) encoder shares: ``Trainable``.
The heads themselves belong to their evaluations (GLUE's classifier, the NER tagger, SQuAD's span
head: ``pretrainlab.evaluation``). Their dev sets are scored at the end of every epoch, logged as
``val/<metric>`` and kept in ``history``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import lightning as L
import torch
import torch.nn.functional as F

from pretrainlab.model.encoder import Encoder
from pretrainlab.optim import OptimConfig
from pretrainlab.runtime.loggers import log_interval
from pretrainlab.runtime.nonfinite import NonFiniteWatch


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


__all__ = ["Trainable"]
