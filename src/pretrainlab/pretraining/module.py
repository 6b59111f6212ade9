"""PretrainModule: the shared encoder + one objective plugin, optimised with AdamW.

The module owns the encoder (exported for fine-tuning) and the objective (its heads, ELECTRA's
generator). Everything objective-specific happens in ``objective.forward``; this class only
optimises, counts and logs:

    train/loss, train/<objective metrics>, val/...    from ObjectiveOutput
    train/lr, train/tokens_seen, train/flops          for compute-matched comparisons
    budget/used, budget/fraction                      the budget's account (pretrainlab.optim.Budget)

Its counters (tokens seen, skipped batches, training seconds) are buffers, saved in checkpoints, so
a resumed run keeps counting where it stopped. Step timing and throughput: ``timing.StepTimer``.
"""

from __future__ import annotations

import logging

import lightning as L
import numpy as np
import torch
import torch.distributed as dist

from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.objectives.base import Batch, Objective
from pretrainlab.optim import Budget, OptimConfig
from pretrainlab.runtime.checkpoints import KEY as CHECKPOINT_KEY

log = logging.getLogger("pretrainlab")


class PretrainModule(L.LightningModule):
    def __init__(self, encoder_config: EncoderConfig, objective: Objective, optim: OptimConfig, budget: Budget,
                 seq_len: int, seed: int = 0, on_nonfinite: str = "stop", run_info: dict | None = None):
        """``budget``: how long to train (``Budget("steps", max_steps)`` for a plain run);
        ``run_info``: what checkpoints record of the run (objective and model settings), so that a
        resumed run can be checked against it (``pretrainlab.runtime.checkpoints``)."""
        super().__init__()
        self.run_info = run_info or {}
        self.budget = budget
        if on_nonfinite not in ("stop", "skip"):
            raise ValueError(f"on_nonfinite must be stop or skip, got {on_nonfinite!r}.")
        self.seed, self.on_nonfinite = seed, on_nonfinite
        self.encoder = Encoder(encoder_config)
        if self.encoder.pooler is not None and not objective.uses_pooler:
            self.encoder.pooler.requires_grad_(False)  # no gradient reaches it; DDP needs every trained one to
        self.objective = objective
        self.optim = optim
        self.flops_per_token = float(objective.flops_per_token(encoder_config, seq_len))
        # counters saved in checkpoints, so a resumed run keeps counting where it stopped
        self.register_buffer("tokens_seen", torch.zeros((), dtype=torch.float64))
        self.register_buffer("skipped_batches", torch.zeros((), dtype=torch.int64))
        self.register_buffer("train_seconds", torch.zeros((), dtype=torch.float64))  # kept by StepTimer
        self.step_tokens: torch.Tensor | None = None  # tokens of the current micro-batch, all ranks

    # --- steps ----------------------------------------------------------------------------------
    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        out = self.objective(self.encoder, batch)
        finite = torch.isfinite(out.loss.detach()).to(torch.int32)
        if dist.is_available() and dist.is_initialized():  # every rank takes the same decision
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if not bool(finite):
            if self.on_nonfinite == "skip":
                self.skipped_batches += 1
                log.warning("non-finite training loss at step %d: batch skipped (%d so far)", self.global_step,
                            int(self.skipped_batches))
                return None  # no backward, no optimizer step for this batch
            raise FloatingPointError(
                f"non-finite training loss ({out.loss.item()}) at step {self.global_step}: training stopped, "
                f"checkpoints written so far are untouched. Lower optim.lr, raise optim.warmup, or use "
                f"trainer.precision=bf16-mixed instead of 16-mixed; on_nonfinite=skip skips such batches instead."
            )
        n_tokens = batch["n_tokens"].to(torch.float64)
        if dist.is_available() and dist.is_initialized():
            n_tokens = n_tokens.clone()
            dist.all_reduce(n_tokens)
        self.tokens_seen += n_tokens
        self.step_tokens = n_tokens
        bs = batch["input_ids"].shape[0]
        self.log("train/loss", out.loss.detach(), prog_bar=True, batch_size=bs)
        for name, value in out.metrics.items():
            self.log(f"train/{name}", value, prog_bar=name.endswith("acc"), batch_size=bs)
        self.log("train/tokens_seen", self.tokens_seen, batch_size=bs)
        self.log("train/flops", self.tokens_seen * self.flops_per_token, batch_size=bs)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=bs)
        return out.loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        out = self.objective(self.encoder, batch)
        bs = batch["input_ids"].shape[0]
        self.log("val/loss", out.loss, prog_bar=True, sync_dist=True, batch_size=bs)
        for name, value in out.metrics.items():
            self.log(f"val/{name}", value, sync_dist=True, batch_size=bs)

    def on_train_batch_start(self, batch, batch_idx) -> None:
        # Dropout (and any other torch randomness in the step) is seeded by (seed, step, micro-batch,
        # rank): a resumed run draws exactly what an uninterrupted one would, without storing RNG state.
        micro = batch_idx % self.trainer.accumulate_grad_batches
        torch.manual_seed(int(np.random.SeedSequence(
            [self.seed, self.global_step, micro, self.global_rank]).generate_state(1)[0]))
        self.step_tokens = None  # set by training_step unless the batch is skipped

    # --- budget ----------------------------------------------------------------------------------
    def budget_used(self) -> float:
        """What the run has used of its budget's unit, from the checkpointed counters."""
        return self.budget.measure(self.global_step, float(self.tokens_seen),
                                   float(self.tokens_seen) * self.flops_per_token, float(self.train_seconds))

    def on_train_start(self) -> None:
        self.budget.start(self.budget_used())  # a resumed run starts counting from the checkpoint

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches == 0:  # after an optimizer step
            self.budget.record(self.budget_used())
            self.log("budget/used", self.budget.used, batch_size=1)
            self.log("budget/fraction", self.budget.progress, batch_size=1)
            if self.budget.reached:
                self.trainer.should_stop = True

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = self.run_info

    # --- optimisation ---------------------------------------------------------------------------
    def configure_optimizers(self):
        mixed = "mixed" in str(self.trainer.precision) if self._trainer is not None else False
        opt = self.optim.optimizer(self, mixed)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.budget.schedule(opt, self.optim), "interval": "step"}}


__all__ = ["PretrainModule"]
