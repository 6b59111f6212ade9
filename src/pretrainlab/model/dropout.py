"""Dropout that is cheap on CPU.

``torch.nn.Dropout`` draws one Bernoulli variable per element; on CPU that draw costs about as
much as a small matmul (≈10 ms per million elements on one core), and a BERT layer drops out
four tensors. Here the keep-mask comes from 16-bit slices of 64-bit random integers (numpy's
SFC64 generator): four mask elements per draw, compared with a threshold, about 8x cheaper. The
drop probability is ``round(p * 2**16) / 2**16`` (0.1 -> 0.09999), and kept values are scaled by
the exact inverse of the keep probability, so the expectation is unchanged. Each call seeds its
generator with one draw from torch's default generator: ``torch.manual_seed`` makes it
reproducible.

On other devices, and under ``torch.compile`` (whose kernels fuse dropout into its neighbours),
``torch.nn.functional.dropout`` is used.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pretrainlab.model.fastpath import eager_cpu

_LEVELS = 1 << 16
_MASK64 = (1 << 64) - 1


def _check(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")


def _random_words(n: int) -> torch.Tensor:
    """n uniformly random 64-bit words (int64). numpy's SFC64 generator makes them about twice as
    fast as torch's Mersenne twister; it is seeded by one draw from torch's default generator."""
    seed = int(torch.empty((), dtype=torch.int64).random_(-(1 << 63), None)) & _MASK64
    return torch.from_numpy(np.random.SFC64(seed).random_raw(n).view(np.int64))


def _keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """(mask, scale): mask * scale is 0 where dropped and 1 / keep-probability where kept.

    In float32 the scale is folded into the mask (one multiply per use); a bf16/fp16 mask holds
    0/1 and the exact scale is applied separately, as the scale itself is not representable there.
    """
    n = math.prod(shape)
    dropped = round(p * _LEVELS)
    scale = _LEVELS / (_LEVELS - dropped)
    bits = _random_words((n + 3) // 4)
    # compared straight into a float tensor: a bool mask would cost a slow bool -> float pass per use
    mask = torch.ge(bits.view(torch.int16)[:n], dropped - (1 << 15), out=torch.empty(n, dtype=dtype)).view(shape)
    if dtype == torch.float32:
        return mask.mul_(scale), 1.0
    return mask, scale


class _MaskedScale(torch.autograd.Function):
    """x * mask * scale, saving only the mask (the gradient is the same product)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x * mask if scale == 1.0 else x * mask * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return (grad * mask if ctx.scale == 1.0 else grad * mask * ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    _check(p)
    if not eager_cpu(x):  # fused kernels (compiled ones, too)
        return F.dropout(x, p, True)
    return _MaskedScale.apply(x, *_keep_mask(x.shape, p, x.dtype))


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
