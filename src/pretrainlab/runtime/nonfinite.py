"""NonFiniteWatch: notice a NaN or infinite loss without waiting for the device every step.

The watch records, on the device, the first optimizer step whose loss was not finite (on any rank:
one all-reduce, no host synchronisation) and its value. The training loop looks at the record when
it synchronises anyway (at its logging interval) and before it writes a checkpoint, so a run stops
within a logging interval of a bad step, and no checkpoint ever holds weights that a non-finite
loss has reached.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class NonFiniteWatch(nn.Module):
    bad_step: torch.Tensor
    bad_value: torch.Tensor
    step: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        # not saved in checkpoints: a resumed run starts with a clean record
        self.register_buffer("bad_step", torch.full((), -1, dtype=torch.int64), persistent=False)
        self.register_buffer("bad_value", torch.zeros((), dtype=torch.float64), persistent=False)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64), persistent=False)

    def start(self, step: int) -> None:
        """Training starts (or resumes) at optimizer step ``step``."""
        self.step.fill_(step)

    def record(self, loss: torch.Tensor) -> None:
        """Note ``loss`` (a scalar) of the current step, if it is the first non-finite one."""
        bad = (~torch.isfinite(loss.detach())).to(torch.int32)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        first = bad.bool() & (self.bad_step < 0)
        self.bad_step.copy_(torch.where(first, self.step, self.bad_step))
        self.bad_value.copy_(torch.where(first, loss.detach().double(), self.bad_value))

    def advance(self) -> None:
        """An optimizer step ended."""
        self.step.add_(1)

    def check(self, what: str, advice: str) -> None:
        """Raise a FloatingPointError naming the first non-finite step, if there was one (waits for
        the device). ``what``: which loss; ``advice``: what to change."""
        step = int(self.bad_step)
        if step >= 0:
            raise FloatingPointError(
                f"non-finite {what} ({float(self.bad_value)}) at step {step}: training stopped, "
                f"checkpoints written so far are untouched. {advice}"
            )


__all__ = ["NonFiniteWatch"]
