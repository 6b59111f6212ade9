"""Fine-tuned heads on a pretrained (or freshly initialised) encoder. ``FinetuneModule``: a
classifier on the pooled ``[CLS]`` output, for one GLUE task (``pretrainlab.evaluation.tagging``
has the token tagger).

Classification trains with cross-entropy, STS-B (one output) with mean squared error. The dev
sets are scored at the end of every epoch with the task's GLUE metrics over the *whole* dev set
(predictions gathered across ranks and de-duplicated by example index), logged as
``val/<metric>`` and kept in ``history``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pretrainlab.glue.metrics import compute
from pretrainlab.glue.tasks import TaskSpec
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


class FinetuneModule(Trainable):
    """A classifier on the pooled ``[CLS]`` output for one GLUE task."""

    def __init__(
        self,
        encoder: Encoder,
        spec: TaskSpec,
        optim: OptimConfig,
        total_steps: int,
        classifier_dropout: float = 0.1,
        eval_splits: list[str] | None = None,
        compile: dict | None = None,
    ):
        super().__init__(encoder, optim, total_steps, compile)
        h = encoder.config.hidden_size
        # encoders exported without a pooler (add_pooler=false) get a fresh one: dense + tanh on [CLS]
        self.pooler = None if encoder.pooler is not None else nn.Linear(h, h)
        self.dropout = nn.Dropout(classifier_dropout)
        self.classifier = nn.Linear(h, spec.num_labels)
        for layer in [self.classifier] + ([self.pooler] if self.pooler is not None else []):
            nn.init.normal_(layer.weight, std=encoder.config.initializer_range)
            nn.init.zeros_(layer.bias)
        self.spec = spec
        self.eval_splits = eval_splits or list(spec.eval_splits)

    def logits(self, batch: dict) -> torch.Tensor:
        out = self.encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        pooled = out.pooled if self.pooler is None else torch.tanh(self.pooler(out.hidden_states[:, 0]))
        logits = self.classifier(self.dropout(pooled)).float()
        return logits.squeeze(-1) if self.spec.is_regression else logits

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.spec.is_regression:
            return F.mse_loss(logits, labels.float())
        return F.cross_entropy(logits, labels)

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        logits = self(batch)
        pred = logits if self.spec.is_regression else logits.argmax(-1)
        self._outputs.setdefault(dataloader_idx, []).append(
            (batch["index"], pred.detach().float(), batch["labels"].float())
        )

    def evaluate(self, outputs: dict[int, list]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for i, split in enumerate(self.eval_splits):
            outs = outputs.get(i, [])
            if not outs:
                continue
            index = torch.cat([o[0] for o in outs])
            pred = torch.cat([o[1] for o in outs])
            label = torch.cat([o[2] for o in outs])
            if self.trainer.world_size > 1:  # every rank scores the whole dev set
                index, pred, label = (self._all_gather(x).flatten(0, 1) for x in (index, pred, label))
            _, first = np.unique(index.cpu().numpy(), return_index=True)  # a distributed sampler repeats a few
            predicted, gold = pred.cpu().numpy()[first], label.cpu().numpy()[first]
            if not self.spec.is_regression:
                predicted, gold = predicted.astype(np.int64), gold.astype(np.int64)
            suffix = self.spec.eval_splits[split][1]
            for name, value in compute(list(self.spec.metrics), predicted, gold).items():
                metrics[f"{name}{suffix}"] = value
        return metrics


__all__ = ["FinetuneModule", "Trainable"]
