"""Encoders saved part-way through a run, for compute-efficiency curves.

``snapshots=[0.125,0.25,0.5]`` exports the encoder to ``<run>/snapshots/<fraction>/`` after the
first optimizer step at which the run has used that fraction of its budget (``max_steps``, or the
tokens, FLOPs or minutes of ``budget.*``); the final encoder, ``<run>/encoder/``, is the point at 1.
Each snapshot is a complete native export whose ``pretraining`` metadata records its fraction, step,
tokens and FLOPs, so that GLUE results of a snapshot carry the compute that produced it.

:class:`EncoderExport` writes every export of a run, the snapshots and the final encoder alike, with
the provenance that says what produced it.

A snapshot is an intermediate state of one run (its learning rate not yet decayed), as in the
compute curves of Clark et al. (2020), not a shorter run trained to that budget.

A run resumed with another budget (a finished run trained further with a larger ``max_steps`` or
``budget.*``) finds snapshots taken under the old one: :func:`relabel` renames each to the fraction
of the new budget it actually sits at (step 75 of a 150-step run, labelled 0.5, is 0.25 of 300
steps) and records the old label. A fraction the resumed run has already passed without a snapshot
is not taken late under that label: it is reported missing.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L

from pretrainlab import atomic
from pretrainlab.export import export_encoder
from pretrainlab.optim import Budget
from pretrainlab.tokens import SpecialTokens

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
            raise ValueError(
                f"snapshots={list(fractions)}: {f!r} is not a fraction of the budget strictly between 0 "
                f"and 1 (the final encoder is the point at 1). Example: snapshots=[0.125,0.25,0.5]."
            )
        out.append(value)
    return sorted(set(out))


def _recorded_budget(pre: dict) -> dict | None:
    """The budget a snapshot was taken under: recorded, or for older snapshots read from the run's
    config (the one budget set, else max_steps)."""
    if pre.get("budget"):
        return pre["budget"]
    config = pre.get("config") or {}
    chosen = {k: v for k, v in (config.get("budget") or {}).items() if v is not None}
    if len(chosen) == 1:
        kind, total = next(iter(chosen.items()))
        return {"kind": kind, "total": float(total)}
    return {"kind": "steps", "total": float(config["max_steps"])} if config.get("max_steps") else None


def relabel(run_dir: str | Path, budget: Budget) -> list[tuple[float, float]]:
    """Rename every snapshot of ``run_dir`` taken under another budget than ``budget`` to the
    fraction of ``budget`` it sits at, recording its old label and budget in its metadata
    (``pretraining.relabelled_from``); returns the (old, new) fractions. Refuses (ValueError) when a
    snapshot's place cannot be worked out or its new name is taken."""
    root = Path(run_dir) / SNAPSHOTS
    moves = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        config = d / "config.json"
        if not config.is_file():
            continue
        meta = json.loads(config.read_text())
        pre = meta.get("pretraining") or {}
        was = _recorded_budget(pre)
        now = {"kind": budget.kind, "total": float(budget.total)}
        if was == now:
            continue
        if budget.kind == "minutes" and pre.get("seconds") is None:
            raise ValueError(
                f"{d} was taken under another budget ({was}) and records no training time, so its place in "
                f"this run's budget.minutes cannot be worked out. Move {root} away to resume."
            )
        used = budget.measure(pre["global_step"], pre["tokens_seen"], pre["flops"], pre.get("seconds") or 0.0)
        fraction = float(f"{used / budget.total:.6g}")
        pre.update(fraction=fraction, budget=now, relabelled_from={"fraction": pre.get("fraction"), "budget": was})
        moves.append((d, snapshot_dir(run_dir, fraction), meta))
    if not moves:
        return []
    moving = {d for d, _, _ in moves}
    for _, target, _ in moves:
        if target.exists() and target not in moving:
            raise ValueError(
                f"the snapshot taken under the old budget that now sits at {target.name} of the budget "
                f"cannot be renamed: {target} exists. Move one of them away to resume."
            )
    parked = []
    for d, target, meta in moves:  # through temporary names: one snapshot's new name may be another's old one
        tmp = d.with_name(f".{d.name}.relabel")
        shutil.move(str(d), tmp)
        parked.append((tmp, target, meta))
    out = []
    for tmp, target, meta in parked:
        atomic.write_json(tmp / "config.json", meta)
        shutil.move(str(tmp), target)
        old = meta["pretraining"]["relabelled_from"]["fraction"]
        log.warning(
            "snapshot %g of the old budget is at %s of this one (%s %g): relabelled %s",
            old,
            target.name,
            budget.kind,
            budget.total,
            target,
        )
        out.append((old, float(target.name)))
    return out


class EncoderExport:
    """Exports a run's encoder (``module.encoder``, with ``module.objective``'s weights) as a native
    export whose ``pretraining`` metadata records what produced it: the objective, the run
    directory, the step, tokens, FLOPs and training time so far, the fraction of the budget and the
    budget, the config group choices, the resolved config, the data's identity (corpus and
    tokenizer keys) and the code it was trained with (``software``: one entry per version of the code
    over its resumptions, see :func:`pretrainlab.runtime.provenance.software`). Called with fraction 1
    for the final encoder, and by :class:`EncoderSnapshots`."""

    def __init__(
        self,
        tokenizer: Any,
        special: SpecialTokens,
        run_dir: Path,
        budget: Budget,
        choices: dict[str, str],
        config: dict,
        data_id: dict[str, str],
    ):
        self.tokenizer, self.special, self.run_dir = tokenizer, special, Path(run_dir)
        self.budget, self.choices, self.config, self.data_id = budget, choices, config, data_id

    def provenance(self, module: Any, fraction: float) -> dict:
        return {
            "objective": module.objective.name,
            "run_dir": str(self.run_dir.resolve()),
            "global_step": module.global_step,
            "fraction": fraction,
            "tokens_seen": module.tokens_trained,
            "flops": module.flops,
            "seconds": module.seconds,
            "seconds_clock": "device" if module.device.type == "cuda" else "host",  # PretrainModule.seconds
            "budget": {"kind": self.budget.kind, "total": self.budget.total},
            "choices": self.choices,
            "config": self.config,
            "data": self.data_id,
            "software": module.run_info.get("software"),
        }

    def __call__(self, module: Any, out: Path, fraction: float) -> Path:
        return export_encoder(
            module.encoder,
            self.tokenizer,
            self.special,
            out,
            pretraining=self.provenance(module, fraction),
            objective=module.objective,
        )


class EncoderSnapshots(L.Callback):
    """Export the encoder once the run's budget progress reaches each fraction (first rank only).
    ``export(module, out_dir, fraction)`` (an :class:`EncoderExport`) writes one snapshot. Snapshots already on disk (a
    resumed run) are kept."""

    def __init__(self, fractions: list[float], run_dir: Path, export: Callable[[Any, Path, float], Any]):
        self.fractions = check_fractions(fractions)
        self.run_dir = Path(run_dir)
        self.export = export

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        self.start = None  # the budget's progress when this session began: set at its first batch

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if getattr(self, "start", None) is None:
            self.start = pl_module.budget.progress

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if not self.fractions or (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        progress = pl_module.budget_used() / pl_module.budget.total
        while self.fractions and progress >= self.fractions[0] - 1e-9:
            fraction = self.fractions.pop(0)
            out = snapshot_dir(self.run_dir, fraction)
            if not trainer.is_global_zero or (out / "config.json").is_file():
                continue
            if fraction < (self.start or 0.0) - 1e-9:  # passed before this run resumed: too late for it
                log.warning(
                    "no snapshot at %g of the budget: the run resumed at %.4g of it, past that point (a "
                    "snapshot taken now would be mislabelled)",
                    fraction,
                    self.start,
                )
                continue
            self.export(pl_module, out, fraction)
            log.info("snapshot at %g of the budget (step %d) -> %s", fraction, trainer.global_step, out)


__all__ = ["EncoderExport", "EncoderSnapshots", "SNAPSHOTS", "check_fractions", "relabel", "snapshot_dir"]
