"""PretrainModule: the shared encoder + one objective plugin, optimised with AdamW.

The module owns the encoder (exported for fine-tuning) and the objective (its heads, ELECTRA's
generator). Everything objective-specific happens in ``objective.forward``; this class only
optimises, counts and logs:

    train/loss, train/<objective metrics>, val/...    from ObjectiveOutput
    train/lr, train/tokens_seen, train/flops          for compute-matched comparisons
    perf/tokens_per_s                                 wall-clock throughput of the training step
    perf/data_wait_s, perf/data_wait_frac             time the step waited for its batch, and its
                                                      share of the step: near 0 when data keeps up
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import lightning as L
import numpy as np
import torch
import torch.distributed as dist

from pretrainlab.checkpoint import KEY as CHECKPOINT_KEY
from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.objectives.base import Batch, Objective

log = logging.getLogger("pretrainlab")


@dataclass
class OptimConfig:
    """AdamW with linear warmup then linear decay to ``min_lr_ratio`` x lr at the last step.

    Weight decay skips biases and LayerNorm weights (every parameter with fewer than 2 dims).
    ``warmup`` below 1 is a fraction of the training steps; 1 or more is a number of steps.
    """

    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    warmup: float = 0.06
    min_lr_ratio: float = 0.0
    grad_clip: float | None = 1.0
    fused: bool | None = None  # None: fused kernels where this torch supports them

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be positive, got {self.lr}.")
        if self.warmup < 0:
            raise ValueError(f"optim.warmup must be >= 0, got {self.warmup}.")

    def param_groups(self, module: torch.nn.Module) -> list[dict]:
        """AdamW groups: weight decay on matrices, none on biases and LayerNorm weights."""
        params = [p for p in module.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": self.weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]

    def warmup_steps(self, max_steps: int) -> int:
        return int(round(self.warmup * max_steps)) if self.warmup < 1 else int(self.warmup)


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return max(min_ratio, 1.0 - (1.0 - min_ratio) * min(1.0, progress))


@dataclass
class Budget:
    """How long pretraining runs, in one unit: optimizer ``steps``, training ``tokens``, training
    ``flops`` (ELECTRA's generator included) or wall-clock ``minutes`` of training.

    The learning-rate schedule follows the budget's own progress (consumed / total), so warmup
    and decay are fitted to the budgeted length whatever the objective's cost per step, and the run
    stops after the first optimizer step that reaches the budget."""

    kind: str = "steps"
    total: float = 0.0
    expected_per_step: float = 0.0  # a first estimate, for the first step's learning rate

    def __post_init__(self) -> None:
        if self.kind not in ("steps", "tokens", "flops", "minutes"):
            raise ValueError(f"budget kind must be steps, tokens, flops or minutes, got {self.kind!r}.")
        if not self.total > 0:
            raise ValueError(f"budget.{self.kind} must be positive, got {self.total}.")


def budget_lr_factor(progress: float, step_progress: float, warmup: float, warmup_steps: int, step: int,
                     min_ratio: float) -> float:
    """Linear warmup then linear decay to ``min_ratio`` over budget progress in [0, 1].
    ``warmup`` < 1 is a fraction of the budget; else ``warmup_steps`` optimizer steps."""
    if warmup_steps > 0:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        start = 0.0
    else:
        ahead = progress + step_progress  # the step this learning rate will be used for
        if warmup > 0 and ahead < warmup:
            return max(ahead, 1e-8) / warmup
        start = warmup
    decay = (progress - start) / max(1e-12, 1.0 - start)
    return max(min_ratio, 1.0 - (1.0 - min_ratio) * min(1.0, max(0.0, decay)))


class PretrainModule(L.LightningModule):
    def __init__(self, encoder_config: EncoderConfig, objective: Objective, optim: OptimConfig,
                 max_steps: int, seq_len: int, seed: int = 0, on_nonfinite: str = "stop",
                 budget: Budget | None = None, run_info: dict | None = None):
        """``run_info``: what checkpoints record of the run (objective and model settings), so that
        a resumed run can be checked against it (``pretrainlab.checkpoint``)."""
        super().__init__()
        self.run_info = run_info or {}
        self.budget = budget or Budget("steps", max_steps)
        if on_nonfinite not in ("stop", "skip"):
            raise ValueError(f"on_nonfinite must be stop or skip, got {on_nonfinite!r}.")
        self.seed, self.on_nonfinite = seed, on_nonfinite
        self.encoder = Encoder(encoder_config)
        if self.encoder.pooler is not None and not objective.uses_pooler:
            self.encoder.pooler.requires_grad_(False)  # no gradient reaches it; DDP needs every trained one to
        self.objective = objective
        self.optim = optim
        self.max_steps = max_steps
        self.flops_per_token = float(objective.flops_per_token(self.encoder, seq_len))
        # counters saved in checkpoints, so a resumed run keeps counting where it stopped
        self.register_buffer("tokens_seen", torch.zeros((), dtype=torch.float64))
        self.register_buffer("skipped_batches", torch.zeros((), dtype=torch.int64))
        self.register_buffer("train_seconds", torch.zeros((), dtype=torch.float64))
        self._last_consumed = 0.0
        self._step_start: float | None = None
        self._batch_start: float | None = None
        self._batch_end: float | None = None  # when the previous training batch (or validation) finished
        self._data_wait: float | None = None
        self._step_tokens: torch.Tensor | None = None

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
        self._step_tokens = n_tokens
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
        self._batch_start = time.perf_counter()
        # the time since the previous batch (or validation) finished: fetching this batch and the
        # loop's own bookkeeping; the previous batch's checkpoint is saved before _batch_end is taken
        self._data_wait = self._batch_start - self._batch_end if self._batch_end is not None else None
        self._step_tokens = None  # set by training_step unless the batch is skipped
        if self._step_start is None:  # the first micro-batch of this optimizer step (or after a skipped one)
            self._step_start = self._batch_start

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        # The step's training time is counted here, before any on_train_batch_end hook: the step
        # checkpoint is saved from one, and must hold the time of the step it is saved at.
        if self._step_start is not None:
            seconds = torch.tensor(time.perf_counter() - self._step_start, dtype=torch.float64,
                                   device=self.train_seconds.device)
            if dist.is_available() and dist.is_initialized():  # the slowest rank's clock, on every rank
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            self.train_seconds += seconds
            self._step_start = None

    # --- budget ----------------------------------------------------------------------------------
    def on_train_start(self) -> None:
        self._consumed_before = self.consumed()  # a resumed run starts counting from the checkpoint

    def consumed(self) -> float:
        """How much of the budget's unit has been spent so far (saved in checkpoints)."""
        kind = self.budget.kind
        if kind == "steps":
            return float(self.global_step)
        if kind == "tokens":
            return float(self.tokens_seen)
        if kind == "flops":
            return float(self.tokens_seen) * self.flops_per_token
        return float(self.train_seconds) / 60.0

    def progress(self) -> float:
        return self.consumed() / self.budget.total

    def _step_progress(self) -> float:
        per_step = self._last_consumed or self.budget.expected_per_step
        return per_step / self.budget.total

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches == 0:  # after an optimizer step
            used = self.consumed()
            self._last_consumed = max(0.0, used - getattr(self, "_consumed_before", 0.0))
            self._consumed_before = used
            self.log("budget/used", used, batch_size=1)
            self.log("budget/fraction", used / self.budget.total, batch_size=1)
            if self.budget.kind != "steps" and used >= self.budget.total:
                self.trainer.should_stop = True
        if self._step_tokens is not None and self.global_step % self.trainer.log_every_n_steps == 0:
            bs = batch["input_ids"].shape[0]
            elapsed = time.perf_counter() - self._batch_start
            if elapsed > 0:
                self.log("perf/tokens_per_s", float(self._step_tokens) / elapsed, batch_size=bs)
            if self._data_wait is not None:
                self.log("perf/data_wait_s", self._data_wait, batch_size=bs)
                self.log("perf/data_wait_frac", self._data_wait / (self._data_wait + elapsed), batch_size=bs)
        self._batch_end = time.perf_counter()

    def on_validation_end(self) -> None:
        self._batch_end = time.perf_counter()  # the next batch's wait starts after validation

    def on_train_epoch_start(self) -> None:
        self._batch_end = time.perf_counter()  # the first batch's wait includes starting the loader workers

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = self.run_info

    # --- optimisation ---------------------------------------------------------------------------
    def configure_optimizers(self):
        groups = self.optim.param_groups(self)
        kwargs = {}
        # Lightning's mixed-precision plugin cannot clip the gradients of a fused AdamW (it
        # unscales internally), so mixed precision with clipping uses the foreach implementation.
        mixed = "mixed" in str(getattr(self.trainer, "precision", "")) if self._trainer is not None else False
        fused = self.optim.fused
        if fused is None:
            fused = not (mixed and self.optim.grad_clip)
        elif fused and mixed and self.optim.grad_clip:
            raise ValueError("optim.fused=true cannot be combined with mixed precision and optim.grad_clip; set "
                             "optim.fused=null (automatic) or optim.grad_clip=null.")
        if fused:
            kwargs["fused"] = True
        try:
            opt = torch.optim.AdamW(groups, lr=self.optim.lr, betas=self.optim.betas, eps=self.optim.eps, **kwargs)
        except (RuntimeError, ValueError):
            if self.optim.fused:  # asked for explicitly: say it is not available
                raise
            opt = torch.optim.AdamW(groups, lr=self.optim.lr, betas=self.optim.betas, eps=self.optim.eps)
        if self.budget.kind == "steps":
            warmup = self.optim.warmup_steps(self.max_steps)
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: lr_lambda(s, warmup, self.max_steps, self.optim.min_lr_ratio)
            )
        else:
            fraction = self.optim.warmup if self.optim.warmup < 1 else 0.0
            steps = int(self.optim.warmup) if self.optim.warmup >= 1 else 0
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: budget_lr_factor(
                self.progress(), self._step_progress(), fraction, steps, s, self.optim.min_lr_ratio))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


__all__ = ["Budget", "OptimConfig", "PretrainModule", "budget_lr_factor", "lr_lambda"]
