"""Optimisation, shared by pretraining and fine-tuning: AdamW, its learning-rate schedules, and the
compute budget that decides how long pretraining runs.

    OptimConfig   AdamW settings (conf/optim/, and fine-tuning's optim node); builds the optimizer
    Budget        steps, tokens, FLOPs or minutes; counts its own use and progress, and fits the
                  schedule to it
    StepProgress  an optimizer step's place in the run (0 to 1), for settings scheduled over it
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class OptimConfig:
    """AdamW with linear warmup then linear decay to ``min_lr_ratio`` x lr at the last step.

    Weight decay skips biases and LayerNorm weights (every parameter with fewer than 2 dims).
    ``warmup`` below 1 is a fraction of the training (steps, or the budget); 1 or more is a number
    of steps.
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
        self.betas = (float(self.betas[0]), float(self.betas[1]))
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be positive, got {self.lr}.")
        if self.warmup < 0:
            raise ValueError(f"optim.warmup must be >= 0, got {self.warmup}.")

    def param_groups(self, module: torch.nn.Module) -> list[dict]:
        """AdamW groups: weight decay on matrices, none on biases and LayerNorm weights."""
        params = [p for p in module.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": self.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]

    def warmup_steps(self, max_steps: int) -> int:
        return int(round(self.warmup * max_steps)) if self.warmup < 1 else int(self.warmup)

    def optimizer(self, module: torch.nn.Module, mixed_precision: bool = False) -> torch.optim.AdamW:
        """AdamW over ``module``'s trained parameters. Fused kernels unless ``fused`` is false, or
        mixed precision meets gradient clipping: Lightning's mixed-precision plugin cannot clip the
        gradients of a fused AdamW (it unscales internally), so that case uses the foreach one."""
        fused = self.fused
        if fused is None:
            fused = not (mixed_precision and self.grad_clip)
        elif fused and mixed_precision and self.grad_clip:
            raise ValueError(
                "optim.fused=true cannot be combined with mixed precision and optim.grad_clip; set "
                "optim.fused=null (automatic) or optim.grad_clip=null."
            )
        groups = self.param_groups(module)
        try:
            return torch.optim.AdamW(
                groups, lr=self.lr, betas=self.betas, eps=self.eps, **({"fused": True} if fused else {})
            )
        except (RuntimeError, ValueError):
            if self.fused:  # asked for explicitly: say it is not available
                raise
            return torch.optim.AdamW(groups, lr=self.lr, betas=self.betas, eps=self.eps)

    def schedule(self, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        """Warmup then linear decay over ``total_steps`` optimizer steps."""
        warmup = self.warmup_steps(total_steps)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_lambda(s, warmup, total_steps, self.min_lr_ratio)
        )


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return max(min_ratio, 1.0 - (1.0 - min_ratio) * min(1.0, progress))


def budget_lr_factor(
    progress: float, step_progress: float, warmup: float, warmup_steps: int, step: int, min_ratio: float
) -> float:
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


KINDS = ("steps", "tokens", "flops", "minutes")


@dataclass(frozen=True)
class StepProgress:
    """Where an optimizer step is in the run, from 0 (the first step) to 1 (the last planned one and
    any after it): what a setting scheduled over the run (a masking rate, a causal phase) follows.
    A function of the step alone, so data workers, resumed runs and every rank agree on it."""

    planned_steps: int

    def __post_init__(self) -> None:
        if self.planned_steps < 1:
            raise ValueError(f"a schedule needs at least one planned step, got {self.planned_steps}")

    def __call__(self, step: int) -> float:
        return min(1.0, step / self.planned_steps)


@dataclass
class Budget:
    """How long pretraining runs, in one unit: optimizer ``steps``, training ``tokens``, training
    ``flops`` (ELECTRA's generator included) or wall-clock ``minutes`` of training.

    The budget keeps its own account: :meth:`record` after every optimizer step, with what the run
    has used so far (checkpointed counters, so a resumed run continues the count). The learning-rate
    schedule follows its progress (used / total), so warmup and decay are fitted to the budgeted
    length whatever the objective's cost per step, and the run stops after the first optimizer step
    that reaches it (:attr:`reached`)."""

    kind: str = "steps"
    total: float = 0.0
    expected_per_step: float = 0.0  # a first estimate, for the first step's learning rate
    used: float = field(default=0.0, init=False)
    last_step_used: float = field(default=0.0, init=False)  # how much of the budget the last optimizer step used

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"budget kind must be one of {', '.join(KINDS)}, got {self.kind!r}.")
        if not self.total > 0:
            raise ValueError(f"budget.{self.kind} must be positive, got {self.total}.")

    def measure(self, steps: int, tokens: float, flops: float, seconds: float) -> float:
        """The amount of this budget's unit that these counters stand for."""
        return {
            "steps": float(steps),
            "tokens": float(tokens),
            "flops": float(flops),
            "minutes": float(seconds) / 60.0,
        }[self.kind]

    def start(self, used: float) -> None:
        """Training starts (or resumes) having used ``used``."""
        self.used, self.last_step_used = used, 0.0

    def record(self, used: float) -> None:
        """An optimizer step ended; the run has used ``used`` in all."""
        self.last_step_used, self.used = max(0.0, used - self.used), used

    @property
    def progress(self) -> float:
        return self.used / self.total

    def planned_steps(self) -> int | None:
        """The optimizer steps the budget is expected to take: ``total`` for a step budget, ``total``
        over the first estimate per step for tokens and FLOPs; None for minutes (not known ahead)."""
        if self.kind == "steps":
            return int(self.total)
        if self.kind == "minutes" or not self.expected_per_step:
            return None
        return max(1, int(math.ceil(self.total / self.expected_per_step)))

    @property
    def reached(self) -> bool:
        """Whether training should stop (a step budget is left to the trainer's max_steps)."""
        return self.kind != "steps" and self.used >= self.total

    def schedule(self, optimizer: torch.optim.Optimizer, optim: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
        """``optim``'s warmup and decay, fitted to this budget."""
        if self.kind == "steps":
            return optim.schedule(optimizer, int(self.total))
        fraction = optim.warmup if optim.warmup < 1 else 0.0
        steps = int(optim.warmup) if optim.warmup >= 1 else 0
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda s: budget_lr_factor(
                self.progress,
                (self.last_step_used or self.expected_per_step) / self.total,
                fraction,
                steps,
                s,
                optim.min_lr_ratio,
            ),
        )


__all__ = ["KINDS", "Budget", "OptimConfig", "StepProgress", "budget_lr_factor", "lr_lambda"]
