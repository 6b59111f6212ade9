"""Runs of one encoder shape trained as one model: the step of a fused group.

``FusedGroup`` holds the runs' encoders stacked (``model.stacked.StackedEncoder``) and each run's
objective (its heads and losses, unchanged); a step takes one batch per run, makes every run's
encoder call at once and returns every run's ``ObjectiveOutput``. The sum of their losses has, in each
run's parameters, that run's own gradient.

``GroupAdamW`` is AdamW for such a group: each run updated as ``torch.optim.AdamW`` (what a run alone
uses) updates it, at its own learning rate, after clipping its own gradient to its own norm, as
``torch.nn.utils.clip_grad_norm_`` clips a run alone. All runs' parameters live in two flat buffers
(the stacked encoder's, runs x parameters, and the heads', one after another), so that a step of
the whole group is a few dozen kernels whatever the number of runs. Weight decay skips the
parameters a run alone does not decay (biases and LayerNorm weights: fewer than 2 dimensions), and a
parameter a run does not train (a pooler its objective does not use) is left as it is.

Which objectives can be fused: those that name their encoder call (``Objective.encoder_call``:
BERT, RoBERTa, SpanBERT, ALBERT, the causal LM, GPT-BERT, CLM-then-MLM), on encoders of one config;
every batch of the group is padded to the same length (static shapes).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from pretrainlab.config import ConfigError
from pretrainlab.model.encoder import Encoder
from pretrainlab.model.stacked import StackedEncoder
from pretrainlab.objectives.base import Batch, Objective, ObjectiveOutput
from pretrainlab.optim import OptimConfig


def fusable(objective: Objective, batch: Batch) -> bool:
    """Whether ``objective``'s loss on ``batch`` comes from one encoder call it names."""
    return objective.encoder_call(batch) is not None


class FusedGroup(nn.Module):
    """Several runs, one encoder shape: their encoders stacked, their objectives side by side."""

    def __init__(self, encoders: Sequence[Encoder], objectives: Sequence[Objective]):
        super().__init__()
        if len(encoders) != len(objectives):
            raise ValueError(f"{len(encoders)} encoders for {len(objectives)} objectives")
        self.stacked = StackedEncoder(list(encoders))
        self.objectives = nn.ModuleList(objectives)

    @property
    def runs(self) -> int:
        return self.stacked.runs

    def forward(self, batches: Sequence[Batch]) -> list[ObjectiveOutput]:
        """One batch per run, in order: every run's loss and metrics."""
        calls = []
        for module, batch in zip(self.objectives, batches, strict=True):
            objective = cast(Objective, module)
            call = objective.encoder_call(batch)
            if call is None:
                raise ConfigError(
                    f"objective={objective.name} cannot be fused: its loss needs more than one encoder call it "
                    f"names (Objective.encoder_call). Train it on its own."
                )
            calls.append(call)
        outs = self.stacked(calls)
        return [
            cast(Objective, objective).loss_of(self.stacked.member(m), batch, out)  # type: ignore[arg-type]
            for m, (objective, batch, out) in enumerate(zip(self.objectives, batches, outs, strict=True))
        ]


class _Flat:
    """Parameters moved into one flat buffer (``p.data`` becomes a view of it) with gradients
    accumulated into another (``p.grad`` a view of it), and AdamW's moments beside them."""

    def __init__(self, params: list[nn.Parameter], buffer: torch.Tensor, offsets: list[int], view):
        self.params, self.data = params, buffer
        self.grad = torch.zeros_like(buffer)
        for p, start in zip(params, offsets, strict=True):
            end = start + view.numel(p)
            fresh = view.slice(buffer, start, end, p)
            fresh.copy_(p.detach())
            p.data = fresh
            p.grad = view.slice(self.grad, start, end, p)
        self.exp_avg = torch.zeros_like(buffer)
        self.exp_avg_sq = torch.zeros_like(buffer)

    def zero_grad(self) -> None:
        self.grad.zero_()


class _Stacked:  # parameters (runs, ...) as columns of a (runs, total) buffer
    @staticmethod
    def numel(p):
        return p[0].numel()

    @staticmethod
    def slice(buffer, start, end, p):
        return buffer[:, start:end].view(p.shape)


class _Concatenated:  # parameters one after another in a (total,) buffer
    @staticmethod
    def numel(p):
        return p.numel()

    @staticmethod
    def slice(buffer, start, end, p):
        return buffer[start:end].view(p.shape)


def _offsets(sizes: list[int]) -> tuple[list[int], int]:
    out, total = [], 0
    for n in sizes:
        out.append(total)
        total += n
    return out, total


class GroupAdamW:
    """AdamW over a :class:`FusedGroup`, each run as its own (see the module docstring).

    ``step(lrs)``: one optimizer step of every run, ``lrs[m]`` run ``m``'s learning rate for it (from
    its own schedule); ``zero_grad()`` before the next backward. Gradients accumulate into the flat
    buffers: do not set the parameters' ``.grad`` to None."""

    def __init__(self, group: FusedGroup, optim: OptimConfig):
        # a parameter's gradient is a strided view of the flat buffer, as the parameter is: autograd
        # adds into it in place, and warns that such a layout may be slower (it is not, here)
        warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")
        self.optim, self.runs = optim, group.runs
        stacked = group.stacked
        enc = [(name, p) for name, p in stacked.encoder.named_parameters()]
        device = enc[0][1].device
        offsets, total = _offsets([p[0].numel() for _, p in enc])
        self.encoder = _Flat([p for _, p in enc], torch.zeros(self.runs, total, device=device), offsets, _Stacked)
        # per column: weight decay (a run alone decays parameters of 2 or more dimensions) ...
        self.encoder_decay = torch.zeros(total, device=device)
        # ... and per run and column: whether the run trains it (a frozen pooler: not)
        trained = torch.ones(self.runs, total, device=device)
        for (name, p), start in zip(enc, offsets, strict=True):
            end = start + p[0].numel()
            if p.dim() - 1 >= 2:
                self.encoder_decay[start:end] = optim.weight_decay
            trained[:, start:end] *= stacked.trained[name].to(device, torch.float32)[:, None]
        self.encoder_trained = trained
        heads = [
            (m, p) for m, objective in enumerate(group.objectives) for p in objective.parameters() if p.requires_grad
        ]
        offsets, total = _offsets([p.numel() for _, p in heads])
        self.heads = _Flat([p for _, p in heads], torch.zeros(total, device=device), offsets, _Concatenated)
        self.owner = torch.zeros(total, dtype=torch.long, device=device)
        self.heads_decay = torch.zeros(total, device=device)
        for (m, p), start in zip(heads, offsets, strict=True):
            self.owner[start : start + p.numel()] = m
            if p.dim() >= 2:
                self.heads_decay[start : start + p.numel()] = optim.weight_decay
        self.steps = [0] * self.runs

    def zero_grad(self) -> None:
        self.encoder.zero_grad()
        self.heads.zero_grad()

    def grad_norms(self) -> torch.Tensor:
        """Each run's gradient norm over all its parameters (runs,)."""
        enc = self.encoder.grad.pow(2).sum(1)
        heads = torch.zeros(self.runs, device=enc.device).index_add_(0, self.owner, self.heads.grad.pow(2))
        return (enc + heads).sqrt()

    @torch.no_grad()
    def step(self, lrs: Sequence[float]) -> None:
        """Every run's AdamW step, run ``m``'s at learning rate ``lrs[m]`` (its own schedule's)."""
        if len(lrs) != self.runs:
            raise ValueError(f"{len(lrs)} learning rates for {self.runs} runs")
        beta1, beta2 = self.optim.betas
        self.steps = [s + 1 for s in self.steps]
        lr = [float(x) for x in lrs]
        step_size = [lr[m] / (1 - beta1 ** self.steps[m]) for m in range(self.runs)]
        bc2_sqrt = [math.sqrt(1 - beta2 ** self.steps[m]) for m in range(self.runs)]
        host = torch.tensor([lr, step_size, bc2_sqrt], dtype=torch.float32)
        lr_t, step_t, bc2_t = host.to(self.encoder.data.device, non_blocking=True)
        if self.optim.grad_clip:
            coef = (self.optim.grad_clip / (self.grad_norms() + 1e-6)).clamp(max=1.0)
            self.encoder.grad.mul_(coef[:, None])
            self.heads.grad.mul_(coef[self.owner])
        trained = self.encoder_trained
        self._update(
            self.encoder, lr_t[:, None] * trained, step_t[:, None] * trained, bc2_t[:, None], self.encoder_decay
        )
        o = self.owner
        self._update(self.heads, lr_t[o], step_t[o], bc2_t[o], self.heads_decay)

    def _update(self, flat: _Flat, lr, step_size, bc2_sqrt, decay) -> None:
        """torch.optim.AdamW's update (foreach, as a run alone takes it), with per-element factors: a
        column a run does not train has lr and step size 0 there, and a gradient of 0, so it stays."""
        beta1, beta2 = self.optim.betas
        p, g, m, v = flat.data, flat.grad, flat.exp_avg, flat.exp_avg_sq
        p.mul_(1 - lr * decay)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / bc2_sqrt).add_(self.optim.eps)
        p.sub_(m / denom * step_size)

    def state(self, m: int) -> dict:
        """Run ``m``'s optimizer state: its step count and moments, by parameter."""
        return {
            "step": self.steps[m],
            "encoder": {"exp_avg": self.encoder.exp_avg[m].clone(), "exp_avg_sq": self.encoder.exp_avg_sq[m].clone()},
            "heads": {
                "exp_avg": self.heads.exp_avg[self.owner == m].clone(),
                "exp_avg_sq": self.heads.exp_avg_sq[self.owner == m].clone(),
            },
        }


__all__ = ["FusedGroup", "GroupAdamW", "fusable"]
