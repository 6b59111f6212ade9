"""The model's CPU fast paths, and the one test that chooses them.

A 2-core CPU spends much of a small encoder's step outside its matmuls: drawing dropout masks,
materialising vocabulary-sized logits, masking keys that are never padding. In eager mode on a CPU
the model therefore takes its own paths at four places, each computing the same values as the
plain one (dropout: the same distribution):

    dropout           model/encoder.py      keep-masks from 16-bit slices of 64-bit random words
    attention         model/encoder.py      SDPA's math with that dropout, on (batch x heads) blocks
    vocabulary loss   model/heads.py        only the scored rows, a slice of the vocabulary at a
                                            time (model/vocab_loss.py)
    padding mask      model/encoder.py      dropped when the batch has no padding

Everywhere else -- on a GPU, and under ``torch.compile`` on any device -- the model takes PyTorch's
kernels, with no shape that depends on the data and nothing that waits for the device, so that a
compiled step is one graph.

:func:`eager_cpu` is the one test for it. It is asked where the tensor is at hand rather than
stored on the model when it is built, because the same module objects are built on the CPU, moved
to their device by the trainer afterwards and traced by ``torch.compile`` later still. Asked this way,
it costs a device-type comparison in eager mode and is a constant of the trace when compiled (the
compiled graph holds only the fused path).
"""

from __future__ import annotations

import torch


def eager_cpu(x: torch.Tensor) -> bool:
    """Whether ``x`` is on a CPU and not being traced by ``torch.compile``: the fast paths apply."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


__all__ = ["eager_cpu"]
