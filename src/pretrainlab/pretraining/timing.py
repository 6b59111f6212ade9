"""StepTimer: how long training steps take, and how long they wait for their batches.

    train_seconds (a module buffer, saved in checkpoints)   training time so far, for minute budgets
    perf/tokens_per_s                                       throughput of the training step
    perf/data_wait_s, perf/data_wait_frac                   time a step waited for its batch, and its
                                                            share of the step: near 0 when data keeps up

Under DDP the time added per step is the slowest rank's (one all-reduce per optimizer step).
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback


class StepTimer(Callback):
    """Times optimizer steps into ``pl_module.train_seconds`` and logs throughput.

    Its ``on_train_batch_end`` must run before any callback that saves a checkpoint there (a step
    checkpoint must hold the time of the step it is saved at): list it first; Lightning moves
    ``ModelCheckpoint`` callbacks to the end by itself."""

    def __init__(self) -> None:
        self._step_start: float | None = None
        self._step_at_start = -1
        self._batch_start = 0.0
        self._batch_end: float | None = None  # when the previous training batch (or validation) finished
        self._data_wait: float | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batch_end = time.perf_counter()  # the first batch's wait includes starting the loader workers

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batch_end = time.perf_counter()  # the next batch's wait starts after validation

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._batch_start = time.perf_counter()
        self._step_at_start = trainer.global_step
        # the time since the previous batch (or validation) finished: fetching this batch and the
        # loop's own bookkeeping; the previous batch's checkpoint is saved before _batch_end is taken
        self._data_wait = self._batch_start - self._batch_end if self._batch_end is not None else None
        if self._step_start is None:  # the first micro-batch of this optimizer step (or after a skipped one)
            self._step_start = self._batch_start

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = time.perf_counter()
        stepped = trainer.global_step != self._step_at_start  # not inside an accumulation, nor a skipped batch
        if stepped and self._step_start is not None:
            seconds = torch.tensor(now - self._step_start, dtype=torch.float64, device=pl_module.train_seconds.device)
            if dist.is_available() and dist.is_initialized():  # the slowest rank's clock, on every rank
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            pl_module.train_seconds += seconds
            self._step_start = None
        tokens = getattr(pl_module, "step_tokens", None)  # None: the batch was skipped
        if tokens is not None and trainer.global_step % trainer.log_every_n_steps == 0:
            bs = batch["input_ids"].shape[0]
            elapsed = now - self._batch_start
            if elapsed > 0:
                pl_module.log("perf/tokens_per_s", float(tokens) / elapsed, batch_size=bs)
            if self._data_wait is not None:
                pl_module.log("perf/data_wait_s", self._data_wait, batch_size=bs)
                pl_module.log("perf/data_wait_frac", self._data_wait / (self._data_wait + elapsed), batch_size=bs)
        self._batch_end = time.perf_counter()


__all__ = ["StepTimer"]
