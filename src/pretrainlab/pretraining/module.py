"""PretrainModule: the shared encoder + one objective plugin, optimised with AdamW.

The module owns the encoder (exported for fine-tuning) and the objective (its heads, ELECTRA's
generator). Everything objective-specific happens in ``objective.forward``; this class only
optimises, counts and logs:

    train/loss, train/<objective metrics>, val/...    from ObjectiveOutput
    learning/...                                      each head beside its trivial baseline (held out)
    train/lr, train/tokens_seen, train/flops          for compute-matched comparisons
    budget/used, budget/fraction                      the budget's account (pretrainlab.optim.Budget)

Its counters (tokens seen, skipped batches, training seconds) are buffers, saved in checkpoints, so
a resumed run keeps counting where it stopped. Each optimizer step is accounted for where it ends
(:meth:`optimizer_step`): its training time is added and the budget records it before the trainer
steps the learning-rate schedule and before any callback sees the step, so the schedule, step
checkpoints, snapshots and a signal's checkpoint all see the finished step, in whatever order the
callbacks are listed. Throughput and data-wait logging: ``timing.StepTimer``.

The step leaves the device alone: the objective's forward and loss need nothing back from it (and
can be compiled whole, ``compile=``); tokens are counted on the host, from the batch before it
moves to the device; training metrics are logged only at the trainer's logging interval; and a
non-finite loss is recorded on the device and looked at when the run logs or saves a checkpoint,
so that no checkpoint is ever written after one (``on_nonfinite=skip`` needs to know at once, and
waits for the device every step).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist

from pretrainlab.model.encoder import EncoderConfig
from pretrainlab.objectives import learning
from pretrainlab.objectives.base import Batch, Objective, ObjectiveOutput
from pretrainlab.optim import Budget, OptimConfig, StepProgress
from pretrainlab.pretraining.assembly import build_encoder
from pretrainlab.runtime.checkpoints import KEY as CHECKPOINT_KEY
from pretrainlab.runtime.nonfinite import NonFiniteWatch
from pretrainlab.runtime.script import log_interval

log = logging.getLogger("pretrainlab")


class PretrainModule(L.LightningModule):
    """One optimizer step, in the order it runs (Lightning's loop calls the methods below, which follow
    this order in the file; ``tests/test_train.py`` checks it against a run):

    0. the batch       examples of the corpus, masked on the host by the objective's collator
                       (``data.batches.MaskedBatches``: seeded by seed, epoch and batch index), made ahead
                       of the step by the data loader and moved to the device
    for each micro-batch of the step (``Devices.accumulate`` of them; ``micro-batch x accumulate x
    devices`` is the global batch):
    1. on_train_batch_start    seed the step's randomness (dropout) by (seed, step, micro-batch, rank);
                               start the step's clock
    2. training_step           the objective's forward and each head's loss (``Objective.forward``; its
                               ``ObjectiveOutput.loss`` is the heads' weighted sum); count the tokens (and
                               FLOPs); log the training metrics at the logging interval
    3. backward                Lightning: the loss divided by ``accumulate``, backward; on several devices
                               DDP all-reduces the gradients on the last micro-batch only
    (a run of a fused group, ``pretraining.group``: 2 and 3 meet the group's other runs, whose
    forward and backward are made with this run's at once)
    then, after the last micro-batch:
    4. configure_gradient_clipping   Lightning: the gradients' norm clipped to ``optim.grad_clip``
    5. optimizer_step          AdamW's step (Lightning runs 2-4 of the last micro-batch inside it, as the
                               optimizer's closure); then the step's seconds and the budget's record
    6. lr_scheduler_step       Lightning: the learning-rate schedule (``Budget.schedule``: warmup, decay)
    7. on_train_batch_end      stop once the budget is reached; a non-finite loss stops the run here

    Validation (``validation_step``) and checkpoints come between steps, at their intervals.
    """

    tokens_seen: torch.Tensor  # buffers (checkpointed)
    skipped_batches: torch.Tensor
    train_seconds: torch.Tensor
    flops_seen: torch.Tensor  # a scheduled objective's FLOPs so far
    progress: StepProgress | None
    seq_len: int | None

    def __init__(
        self,
        encoder_config: EncoderConfig,
        objective: Objective,
        optim: OptimConfig,
        budget: Budget,
        flops_per_token: float,
        seed: int = 0,
        on_nonfinite: str = "stop",
        run_info: dict | None = None,
        compile: dict | None = None,
        progress: StepProgress | None = None,
        seq_len: int | None = None,
    ):
        """``budget``: how long to train (``Budget("steps", max_steps)`` for a plain run);
        ``flops_per_token``: the objective's training FLOPs per token at the run's sequence length
        (``Objective.flops_per_token``), computed once by the caller, which sizes the budget with it;
        ``run_info``: what checkpoints record of the run (objective and model settings), so that a
        resumed run can be checked against it (``pretrainlab.runtime.checkpoints``); ``compile``:
        ``torch.compile`` options for the objective's forward and loss (None: eager); ``progress``
        (an objective whose batches change over the run): each step's place in the run, at which its
        FLOPs per token are counted (``Objective.flops_at`` at ``seq_len``), ``flops_per_token`` then
        being their mean over the run."""
        super().__init__()
        self.run_info = run_info or {}
        self.budget = budget
        if on_nonfinite not in ("stop", "skip"):
            raise ValueError(f"on_nonfinite must be stop or skip, got {on_nonfinite!r}.")
        self.seed, self.on_nonfinite = seed, on_nonfinite
        self.encoder = build_encoder(encoder_config, objective)
        self.objective = objective
        self.optim = optim
        self.flops_per_token = float(flops_per_token)
        # counters saved in checkpoints, so a resumed run keeps counting where it stopped; the host
        # keeps their values (tokens_seen, train_seconds below) and writes them into the buffers
        self.register_buffer("tokens_seen", torch.zeros((), dtype=torch.float64))
        self.register_buffer("skipped_batches", torch.zeros((), dtype=torch.int64))
        self.register_buffer("train_seconds", torch.zeros((), dtype=torch.float64))
        self.progress = progress
        self.seq_len = seq_len
        if progress is not None:  # FLOPs counted step by step (a schedule's steps cost differently)
            if seq_len is None:
                raise ValueError("a scheduled objective's FLOPs need the run's seq_len")
            self.register_buffer("flops_seen", torch.zeros((), dtype=torch.float64))
        self._flops = 0.0
        self.nonfinite = NonFiniteWatch()
        self._tokens = self._seconds = 0.0
        self.batch_tokens: float | None = None  # tokens of the current micro-batch on all ranks (host)
        self._log_now = False
        self.compile_options = compile
        self._compiled: Callable[[dict[str, torch.Tensor]], ObjectiveOutput] | None = (
            None  # made in setup(), in the process that trains (a compiled function does not pickle)
        )
        self._compile_warmup_start: float | None = None
        self._step_start: float | None = None  # host clock at the first micro-batch of this optimizer step
        # on a GPU, each optimizer step's span on the device (CUDA events), added to the seconds once done
        self._step_event: torch.cuda.Event | None = None
        self._device_steps: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._start_step = 0
        self._tally: learning.Tally | None = None
        self.learning_checks: list[learning.HeadCheck] = []  # from the last validation
        self.learning_states = ""  # what the encoder's final states say there (learning.states_line)
        self.learning_row: dict | None = None  # the same, as a row of <run>/learning.csv
        # a fused group's step (pretraining.group.Fuser): this run's forward and backward made with its
        # group's, its encoder's parameters views of the group's stacked ones; None for a run alone
        self.fuser: Any = None

    def objective_loss(self, batch: Batch) -> ObjectiveOutput:
        """The objective's forward and loss on the encoder: what ``compile`` compiles."""
        return self.objective(self.encoder, batch)

    def forward_loss(self, batch: Batch) -> ObjectiveOutput:
        if self.fuser is not None:  # one of a fused group (pretraining.group): every run's step at once
            return self.fuser.forward(self, batch)
        return (self._compiled or self.objective_loss)(batch)

    def setup(self, stage: str) -> None:
        if self.compile_options is not None and self._compiled is None:
            self._compiled = torch.compile(self.objective_loss, **self.compile_options)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_compiled": None, "_step_event": None, "_device_steps": [], "fuser": None}

    # --- counters --------------------------------------------------------------------------------
    @property
    def tokens_trained(self) -> float:
        """Training tokens so far (all ranks)."""
        return self._tokens

    @property
    def flops(self) -> float:
        """Training FLOPs so far (all ranks): the tokens times the objective's FLOPs per token, or for
        a scheduled objective, the sum of each step's tokens times its FLOPs per token."""
        return self._flops if self.progress is not None else self._tokens * self.flops_per_token

    def _settle(self, wait: bool) -> None:
        """Add the device time of the steps the GPU has finished (``wait``: of every step queued)."""
        while self._device_steps:
            start, end = self._device_steps[0]
            if wait:
                end.synchronize()
            elif not end.query():
                break
            self._device_steps.pop(0)
            self.add_train_seconds(start.elapsed_time(end) / 1000.0)

    def state_dict(self, *args, **kwargs):
        self._settle(wait=True)  # the checkpoint's train_seconds count every step queued
        return super().state_dict(*args, **kwargs)

    @property
    def seconds(self) -> float:
        """Seconds spent in training steps so far (what a ``minutes`` budget counts): on a CPU the host's
        clock from a step's first micro-batch to its optimizer step; on a GPU each step's span on the
        device (CUDA events: the host runs ahead of the kernels it queues), the steps still queued
        waited for."""
        self._settle(wait=True)
        return self._seconds

    def add_train_seconds(self, seconds: float) -> None:
        self._seconds += seconds
        self.train_seconds.fill_(self._seconds)

    def _count(self, batch: Batch) -> float:
        """This micro-batch's tokens on all ranks: said by the batch itself (a number on the host,
        see ``PretrainDataModule.on_before_batch_transfer``), or for a streamed corpus, where each
        rank knows its own share only, summed over the ranks (waiting for the device)."""
        if "global_tokens" in batch:
            return float(batch["global_tokens"])
        n = batch["n_tokens"].to(torch.float64)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(n)
        return float(n)

    # --- one optimizer step, in order (the class's docstring) -------------------------------------
    def on_train_batch_start(self, batch, batch_idx) -> None:
        # Dropout (and any other torch randomness in the step) is seeded by (seed, step, micro-batch,
        # rank): a resumed run draws exactly what an uninterrupted one would, without storing RNG state.
        micro = batch_idx % self.trainer.accumulate_grad_batches
        seed = int(np.random.SeedSequence([self.seed, self.global_step, micro, self.global_rank]).generate_state(1)[0])
        # the generators this step draws from; torch.manual_seed would also queue lazy seeding of
        # every device type this process has not initialised (a stack trace each, every step)
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.default_generators[self.device.index or 0].manual_seed(seed)
        # training metrics are logged at the trainer's interval only (Lightning writes them then)
        self._log_now = (self.global_step + 1) % log_interval(self.trainer) == 0
        if self._step_start is None:
            self._step_start = time.perf_counter()
            if self.device.type == "cuda":  # the step's span on the device: the host runs ahead of it
                self._step_event = torch.cuda.Event(enable_timing=True)
                self._step_event.record()
        if self._compiled is not None and self._compile_warmup_start is None:
            self._compile_warmup_start = self._step_start

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor | None:
        out = self.forward_loss(batch)
        loss = out.loss.detach()
        self.batch_tokens = None
        if self.on_nonfinite == "skip" and not self._finite(loss):
            self.skipped_batches += 1
            log.warning(
                "non-finite training loss at step %d: batch skipped (%d so far)",
                self.global_step,
                int(self.skipped_batches),
            )
            return None  # no backward, no optimizer step for this batch
        if self.on_nonfinite == "stop":
            self.nonfinite.record(loss)
        self.batch_tokens = self._count(batch)
        self._tokens += self.batch_tokens
        self.tokens_seen.fill_(self._tokens)
        if self.progress is not None:
            assert self.seq_len is not None
            place = self.progress(self.global_step)
            self._flops += self.batch_tokens * self.objective.flops_at(self.encoder.config, self.seq_len, place)
            self.flops_seen.fill_(self._flops)
        if self._log_now:
            bs = batch["input_ids"].shape[0]
            self.log("train/loss", loss, prog_bar=True, batch_size=bs)
            for name, value in out.metrics.items():
                self.log(f"train/{name}", value, prog_bar=name.endswith("acc"), batch_size=bs)
            self.log("train/tokens_seen", self._tokens, batch_size=bs)
            self.log("train/flops", self.flops, batch_size=bs)
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=bs)
        return out.loss

    def backward(self, loss: torch.Tensor, *args, **kwargs) -> None:
        """Lightning's backward; in a fused group, one backward of every run's loss once all have come."""
        if self.fuser is not None:
            self.fuser.backward(self, loss)
        else:
            super().backward(loss, *args, **kwargs)

    def optimizer_step(self, *args, **kwargs) -> None:
        """The optimizer step, then its account: the step's training time (from its first micro-batch:
        the host clock on a CPU, the device's on a GPU, :attr:`seconds`) and the budget's record. Lightning calls this at the end of every
        gradient accumulation, skipped batches included, and steps the schedule right after it."""
        super().optimizer_step(*args, **kwargs)
        if self._step_event is not None:  # a GPU: the step's time on the device, once it has run
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._device_steps.append((self._step_event, end))
            self._step_event = self._step_start = None
            # a minutes budget decides at every step: it waits for the device; the others look when it is done
            self._settle(wait=self.budget.kind == "minutes")
        elif self._step_start is not None:
            self.add_train_seconds(time.perf_counter() - self._step_start)
            self._step_start = None
        self.budget.record(self.budget_used(self.global_step + 1))  # the trainer counts this step once we return

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self._compile_warmup_start and self.trainer.global_step == 1 + self._start_step:  # the first step, compiled
            warmup = time.perf_counter() - self._compile_warmup_start
            log.info("the compiled training step took %.1fs to warm up (compilation included)", warmup)
            self.log("perf/compile_warmup_s", warmup, batch_size=1)
            self._compile_warmup_start = 0.0  # reported
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches:
            return  # inside a gradient accumulation
        self.nonfinite.advance()
        if self.budget.kind != "steps" and self.trainer.global_step % log_interval(self.trainer) == 0:
            self.log("budget/used", self.budget.used, batch_size=1)
            self.log("budget/fraction", self.budget.progress, batch_size=1)
        if self.on_nonfinite == "stop" and self.trainer.global_step % log_interval(self.trainer) == 0:
            self.check_finite()
        reached = self.budget.reached
        if self.budget.kind == "minutes" and self.trainer.world_size > 1:  # clocks differ: agree on the step
            reached = self.trainer.strategy.reduce_boolean_decision(reached, all=False)
        if reached:
            self.trainer.should_stop = True

    # --- validation -------------------------------------------------------------------------------
    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        # eager, also in a compiled run: compiled, validation (no gradients, eval mode) is a graph and a
        # compile of its own, tens of seconds at every run's start for a few batches now and then
        out = self.objective_loss(batch)
        bs = batch["input_ids"].shape[0]
        self.log("val/loss", out.loss, prog_bar=True, sync_dist=True, batch_size=bs)
        for name, value in out.metrics.items():
            self.log(f"val/{name}", value, sync_dist=True, batch_size=bs)
        if not self.trainer.sanity_checking:
            with torch.no_grad():
                self._tally = learning.add(self._tally, learning.held_out_tally(self.objective, self.encoder, batch))

    # --- what the heads learned (objectives.learning) ------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._tally = None

    def on_validation_epoch_end(self) -> None:
        """Each head's held-out score beside its trivial baseline, from the validation batches'
        summed tallies (all ranks): logged as ``learning/*``, with ``learning/heads_at_baseline``."""
        if not self._tally:
            return
        if dist.is_available() and dist.is_initialized():
            for value in self._tally.values():
                dist.all_reduce(value)
        metrics, self.learning_checks = learning.judge(self.objective, learning.to_host(self._tally))
        self.learning_states = learning.states_line(metrics)
        self._tally = None
        self.learning_row = {
            "step": self.global_step,
            "tokens": self._tokens,
            "flops": self.flops,
            **metrics,
            **{
                f"{key}:{c.head}": getattr(c, key)
                for c in self.learning_checks
                for key in ("metric", "value", "baseline", "status")
            },
        }
        for name, number in metrics.items():
            if np.isfinite(number):
                self.log(f"learning/{name}", float(number), batch_size=1)
        self.log("learning/heads_at_baseline", float(sum(c.at_baseline for c in self.learning_checks)), batch_size=1)

    # --- non-finite losses (runtime.nonfinite) -------------------------------------------------
    def _finite(self, loss: torch.Tensor) -> bool:
        """Whether the loss is finite on every rank (all ranks take the same decision); waits for the device."""
        finite = torch.isfinite(loss).to(torch.int32)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        return bool(finite)

    def check_finite(self) -> None:
        """Stop with a FloatingPointError naming the first step whose loss was not finite, if any."""
        self.nonfinite.check(
            "training loss",
            "Lower optim.lr, raise optim.warmup, or use trainer.precision=bf16-mixed "
            "instead of 16-mixed; on_nonfinite=skip skips such batches instead.",
        )

    # --- budget ----------------------------------------------------------------------------------
    def budget_used(self, steps: int | None = None) -> float:
        """What the run has used of its budget's unit, from the host's counters (``steps``: the
        optimizer steps taken, when the trainer has not counted the last one yet)."""
        steps = self.global_step if steps is None else steps
        return self.budget.measure(steps, self._tokens, self.flops, self._seconds)

    def on_train_start(self) -> None:
        # a resumed run counts on from its checkpoint's counters
        self._tokens, self._seconds = float(self.tokens_seen), float(self.train_seconds)
        if self.progress is not None:
            self._flops = float(self.flops_seen)
        self.nonfinite.start(self.global_step)
        self._start_step = self.global_step
        self._step_start = self._step_event = None
        self._device_steps = []
        self.budget.start(self.budget_used())

    def on_train_end(self) -> None:
        if self.fuser is not None:  # its group's other runs stop waiting for it
            self.fuser.leave(self)
        self.check_finite()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.check_finite()  # never a checkpoint of weights a non-finite loss has reached
        checkpoint[CHECKPOINT_KEY] = self.run_info

    # --- optimisation ---------------------------------------------------------------------------
    def configure_optimizers(self):
        mixed = "mixed" in str(self.trainer.precision) if self._trainer is not None else False
        opt = self.optim.optimizer(self, mixed)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": self.budget.schedule(opt, self.optim), "interval": "step"},
        }


__all__ = ["PretrainModule"]
