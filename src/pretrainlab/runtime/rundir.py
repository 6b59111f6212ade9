"""A run directory belongs to one run.

A pretraining run refuses a directory that already holds another run's checkpoints or exported
encoder: writing there would replace that encoder, leave its ``last.ckpt`` for a later
``ckpt_path=last`` to resume, and merge two W&B runs. It goes ahead when it resumes that run
(``ckpt_path=last`` / ``auto``, or a checkpoint inside the directory), or with ``overwrite=true``,
which deletes the old run's outputs first (:data:`RUN_OUTPUTS`) and says so.

For ``python train.py`` the check also runs as a Hydra callback, before Hydra writes the run's
``.hydra/`` files into the directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("pretrainlab")

# what overwrite=true deletes: everything a run and its GLUE suites wrote that later steps read back
RUN_OUTPUTS = ("checkpoints", "encoder", "snapshots", ".wandb_id", "csv", "glue", "glue-scratch")


class RunDirError(ValueError):
    """A run directory that holds another run."""


def held_run(run_dir: Path) -> list[str]:
    """What in ``run_dir`` makes it another run's: its checkpoints and its exported encoder."""
    held = []
    ckpts = sorted((run_dir / "checkpoints").glob("*.ckpt")) if (run_dir / "checkpoints").is_dir() else []
    if ckpts:
        held.append(f"{len(ckpts)} checkpoint(s) in checkpoints/ ({', '.join(p.name for p in ckpts[:3])})")
    if (run_dir / "encoder").exists():
        held.append("an exported encoder in encoder/")
    if (run_dir / "snapshots").is_dir() and any((run_dir / "snapshots").iterdir()):
        held.append("encoder snapshots in snapshots/")
    return held


def checkpoint_to_resume(ckpt_path: str | None, run_dir: Path) -> Path | None:
    """The checkpoint file ``ckpt_path`` names: ``last`` (this run directory's ``last.ckpt``; it must
    exist), ``auto`` (``last.ckpt`` if it exists, else a fresh start: for requeued cluster jobs), a
    run directory (its ``last.ckpt``), or a checkpoint file. None: start fresh."""
    if not ckpt_path:
        return None
    last = run_dir / "checkpoints" / "last.ckpt"
    if ckpt_path == "auto":
        return last if last.is_file() else None
    if ckpt_path == "last":
        if not last.is_file():
            raise FileNotFoundError(
                f"ckpt_path=last: no checkpoint at {last}. To resume another run, pass ckpt_path=<its run "
                f"directory> (or hydra.run.dir=<its run directory> ckpt_path=last)."
            )
        return last
    p = Path(os.path.expanduser(str(ckpt_path)))
    if p.is_dir():
        p = p / "checkpoints" / "last.ckpt"
    if not p.is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no checkpoint file at {p}.")
    return p


def resumes_here(checkpoint: Path | None, run_dir: Path) -> bool:
    """Whether resuming ``checkpoint`` continues the run in ``run_dir`` (it lies inside it)."""
    if checkpoint is None:
        return False
    return run_dir.resolve() in Path(checkpoint).resolve().parents


def claim(run_dir: Path, checkpoint: Path | None, overwrite: bool = False) -> None:
    """Refuse ``run_dir`` when it holds another run (see the module docstring) and the run does
    not resume ``checkpoint`` inside it; with ``overwrite``, delete that run's outputs."""
    held = held_run(run_dir)
    if not held or resumes_here(checkpoint, run_dir):
        return
    if not overwrite:
        raise RunDirError(
            f"{run_dir} already holds a run: {'; '.join(held)}. A new run there would replace its encoder and "
            f"mix their checkpoints and W&B runs. Resume it with ckpt_path=last, give this run another directory "
            f"(hydra.run.dir=...), or pass overwrite=true to delete the old run's outputs and start afresh."
        )
    removed = []
    for name in RUN_OUTPUTS:
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        removed.append(name)
    log.warning("overwrite=true: deleted the previous run's %s in %s", ", ".join(removed), run_dir)


def _is_secondary_rank() -> bool:
    """A DDP process other than the first: it re-runs the command after the first one checked."""
    return any(int(os.environ.get(k, "0") or 0) > 0 for k in ("LOCAL_RANK", "NODE_RANK", "RANK"))


class GuardRunDir(Callback):
    """Hydra callback: refuse an occupied run directory before Hydra writes into it.

    Hydra turns an exception raised by a callback into a warning and goes on, so the refusal is
    printed here and the process exits with status 1."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if _is_secondary_rank() or config.get("overwrite"):
            return
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().set_config(config)  # resolves ${now:...} and ${hydra:...} as the run will
        run_dir = Path(str(config.hydra.run.dir))
        try:
            checkpoint = checkpoint_to_resume(config.get("ckpt_path"), run_dir)
        except FileNotFoundError:
            return  # the run itself says so
        try:
            claim(run_dir, checkpoint)
        except RunDirError as e:
            print(f"Error: {e}", file=sys.stderr)
            raise SystemExit(1) from None


__all__ = ["GuardRunDir", "RUN_OUTPUTS", "RunDirError", "checkpoint_to_resume", "claim", "held_run", "resumes_here"]
