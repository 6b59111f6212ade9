"""Encoders saved part-way through a run, for compute-efficiency curves.

``snapshots=[0.125,0.25,0.5]`` exports the encoder to ``<run>/snapshots/<fraction>/`` after the
first optimizer step at which the run has used that fraction of its budget (``max_steps``, or the
tokens, FLOPs or minutes of ``budget.*``); the final encoder, ``<run>/encoder/``, is the point at 1.
Each snapshot is a complete native export whose ``pretraining`` metadata records its fraction, step,
tokens and FLOPs, so that GLUE results of a snapshot carry the compute that produced it.

A snapshot is an intermediate state of one run (its learning rate not yet decayed), as in the
compute curves of Clark et al. (2020), not a shorter run trained to that budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import lightning as L

log = logging.getLogger("pretrainlab")

SNAPSHOTS = "snapshots"


def snapshot_dir(run_dir: str | Path, fraction: float) -> Path:
    """``<run>/snapshots/<fraction>`` (``0.125``, ``0.5``)."""
    return Path(run_dir) / SNAPSHOTS / f"{float(fraction):g}"


def check_fractions(fractions) -> list[float]:
    """Sorted fractions, each in (0, 1); a ValueError naming the bad one otherwise."""
    out = []
    for f in fractions or []:
        try:
            value = float(f)
        except (TypeError, ValueError):
            value = float("nan")
        if not 0 < value < 1:
            raise ValueError(f"snapshots={list(fractions)}: {f!r} is not a fraction of the budget strictly between 0 "
                             f"and 1 (the final encoder is the point at 1). Example: snapshots=[0.125,0.25,0.5].")
        out.append(value)
    return sorted(set(out))


class EncoderSnapshots(L.Callback):
    """Export the encoder once the run's budget progress reaches each fraction (first rank only).
    ``export(module, out_dir, fraction)`` writes one snapshot. Snapshots already on disk (a
    resumed run) are kept."""

    def __init__(self, fractions: list[float], run_dir: Path, export: Callable[[L.LightningModule, Path, float], None]):
        self.fractions = check_fractions(fractions)
        self.run_dir = Path(run_dir)
        self.export = export

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if not self.fractions or (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        progress = pl_module.budget_used() / pl_module.budget.total
        while self.fractions and progress >= self.fractions[0] - 1e-9:
            fraction = self.fractions.pop(0)
            out = snapshot_dir(self.run_dir, fraction)
            if trainer.is_global_zero and not (out / "config.json").is_file():
                self.export(pl_module, out, fraction)
                log.info("snapshot at %g of the budget (step %d) -> %s", fraction, trainer.global_step, out)


__all__ = ["EncoderSnapshots", "SNAPSHOTS", "check_fractions", "snapshot_dir"]
