"""StepTimer: training throughput, and how long steps wait for their batches.

    perf/tokens_per_s                                       training tokens per second (all ranks) since
                                                            the last log, validation excluded
    perf/data_wait_s, perf/data_wait_frac                   time a batch waited to be fetched (mean since
                                                            the last log), and the share of training
                                                            time spent waiting: near 0 when data keeps up

Everything is measured on the host clock, without waiting for the device: on a GPU the host runs
ahead of the kernels it queued, and the trainer's logging, which reads values back from the device,
brings it in step at every logging interval, so rates over an interval are the device's.

The training time that minute budgets count (``train_seconds``, saved in checkpoints, and the
``seconds`` an export records) is the module's own account, kept where each optimizer step ends
(``PretrainModule.optimizer_step``): on a GPU each step's span on the device, from CUDA events.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from pretrainlab.runtime.script import log_interval


class StepTimer(Callback):
    """Logs throughput and data wait at the trainer's logging interval. It changes nothing the run
    computes, so its place among the callbacks does not matter."""

    def __init__(self) -> None:
        self._step_at_start = -1
        self._batch_start = 0.0
        self._batch_end: float | None = None  # when the previous training batch (or validation) finished
        self._busy = self._wait = self._tokens = 0.0  # since the last log
        self._batches = 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batch_end = time.perf_counter()  # the first batch's wait includes starting the loader workers

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batch_end = time.perf_counter()  # the next batch's wait starts after validation

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_start = time.perf_counter()
        self._step_at_start = trainer.global_step
        # the time since the previous batch (or validation) finished: fetching this batch and the
        # loop's own bookkeeping; the previous batch's checkpoint is saved before _batch_end is taken
        if self._batch_end is not None:
            self._wait += self._batch_start - self._batch_end
            self._batches += 1

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        self._busy += now - self._batch_start
        if pl_module.batch_tokens is not None:  # None: the batch was skipped
            self._tokens += pl_module.batch_tokens
        stepped = trainer.global_step != self._step_at_start  # not inside an accumulation
        if stepped and trainer.global_step % log_interval(trainer) == 0:
            elapsed = self._busy + self._wait
            bs = batch["input_ids"].shape[0]
            if elapsed > 0:
                pl_module.log("perf/tokens_per_s", self._tokens / elapsed, batch_size=bs)
            if self._batches:
                pl_module.log("perf/data_wait_s", self._wait / self._batches, batch_size=bs)
                pl_module.log("perf/data_wait_frac", self._wait / elapsed, batch_size=bs)
            self._busy = self._wait = self._tokens = 0.0
            self._batches = 0
        self._batch_end = time.perf_counter()


__all__ = ["StepTimer"]
