"""A run directory belongs to one run.

A pretraining run refuses a directory that already holds another run's checkpoints or exported
encoder: writing there would replace that encoder, leave its ``last.ckpt`` for a later
``ckpt_path=last`` to resume, and merge two W&B runs. It goes ahead when it resumes that run
(``ckpt_path=last`` / ``auto``, or a checkpoint inside the directory), or with ``overwrite=true``,
which deletes the old run's outputs first (:data:`RUN_OUTPUTS`) and says so. A fine-tuning run
likewise refuses a directory whose results file holds an earlier run's results (``overwrite=true``
replaces them). One kind of run per directory: a fine-tuning run refuses a pretraining run's
directory, and a pretraining run one holding fine-tuning results, whose config.yaml and logs the
other would write over.

One process at a time: before anything is written, the run takes the directory's lock
(:data:`LOCK`, an ``flock`` on a file that names its holder). A second process started on the same
directory is refused, naming the first; the lock goes with its process (also when it is killed),
and a lock file left by a process that is gone is recognised as stale and taken over. Studies and
Evaluation suites lock their own directories the same way.

For ``python train.py`` and ``python finetune.py`` the check also runs as a Hydra callback, before
Hydra writes the run's ``.hydra/`` files into the directory.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import re
import shlex
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("pretrainlab")

# what overwrite=true deletes: everything a run and its evaluation suites wrote that later steps read back
RUN_OUTPUTS = (
    "checkpoints",
    "encoder",
    "snapshots",
    ".wandb_id",
    "csv",
    "glue",
    "glue-scratch",
    "eval",
    "eval-scratch",
    "results.json",
)
LOCK = ".pretrainlab-lock"


class RunDirError(ValueError):
    """A run directory that holds another run."""


class RunDirBusy(RunDirError):
    """A directory another live process is writing into."""


# --- one process per directory -----------------------------------------------------------------------
_held: dict[str, list] = {}  # resolved directory -> [file descriptor, times taken by this process]


def lock(directory: Path, what: str = "run") -> None:
    """Take ``directory``'s lock for this process (again: a count), creating the directory; refuse
    with :class:`RunDirBusy` when another live process holds it. ``what`` names the directory in
    the message (run, study, evaluation suite)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = str(directory.resolve())
    if key in _held:
        _held[key][1] += 1
        return
    path = directory / LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _describe_holder(_read_holder(fd))
            os.close(fd)
            raise RunDirBusy(
                f"{directory} is in use by another process ({holder}): two {what}s writing into one directory would "
                f"replace each other's outputs. Wait for it to finish, or give this {what} another directory. (If no "
                f"such process is running, remove {path}.)"
            ) from None
        # its holder may have removed the file between our open and our lock: then lock the new one
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = _read_holder(fd)
    if previous.get("pid") and (previous.get("pid"), previous.get("host")) != (os.getpid(), socket.gethostname()):
        log.info("%s: took over a stale lock (%s, no longer running)", directory, _describe_holder(previous))
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv)[:300],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    _held[key] = [fd, 1]


def unlock(directory: Path) -> None:
    """Give back one taking of ``directory``'s lock; the last one removes the lock file."""
    key = str(Path(directory).resolve())
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[key]
    try:
        (Path(key) / LOCK).unlink(missing_ok=True)
    finally:
        os.close(entry[0])


@atexit.register
def _unlock_all() -> None:
    for key in list(_held):
        _held[key][1] = 1
        unlock(Path(key))


def _read_holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, OSError):
        return {}


def _describe_holder(holder: dict) -> str:
    if not holder:
        return "its lock file names no process"
    return (
        f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}: {holder.get('command') or '?'}"
    )


def is_secondary_rank() -> bool:
    """A DDP process other than the first: it re-runs the command after the first one checked."""
    return any(int(os.environ.get(k, "0") or 0) > 0 for k in ("LOCAL_RANK", "NODE_RANK", "RANK"))


# --- pretraining runs --------------------------------------------------------------------------------
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
    if (run_dir / "results.json").exists():
        held.append("a fine-tuning run's results in results.json")
    return held


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a resumed run continues from: ``checkpoints/last.ckpt``, else the periodic
    checkpoint of the highest step (``step=<n>.ckpt``; when last.ckpt was lost), else None."""
    d = Path(run_dir) / "checkpoints"
    if (d / "last.ckpt").is_file():
        return d / "last.ckpt"
    steps = []
    for p in d.glob("*.ckpt") if d.is_dir() else []:
        m = re.fullmatch(r"step=(\d+)", p.stem)
        steps.append((int(m.group(1)) if m else -1, p.stat().st_mtime, p))
    return max(steps)[2] if steps else None


def ckpt_override(path: Path) -> str:
    """``ckpt_path=<path>`` as a command-line override, quoted for the shell and for Hydra (whose
    grammar refuses the ``=`` in ``step=200.ckpt`` unquoted)."""
    return shlex.quote(f'ckpt_path="{path}"')


def _resume_advice(run_dir: Path) -> str:
    """How to resume the run in ``run_dir``, naming the checkpoint that exists."""
    found = latest_checkpoint(run_dir)
    if found is None:
        return ""
    if found.name == "last.ckpt":
        return "Resume it with ckpt_path=last, "
    return f"Resume it from its newest checkpoint with {ckpt_override(found)} (there is no last.ckpt), "


def checkpoint_to_resume(ckpt_path: str | None, run_dir: Path) -> Path | None:
    """The checkpoint file ``ckpt_path`` names: ``last`` (this run directory's ``last.ckpt``; it must
    exist), ``auto`` (this run directory's newest checkpoint if it has one, else a fresh start: for
    requeued cluster jobs), a run directory (its newest checkpoint), or a checkpoint file. None:
    start fresh."""
    if not ckpt_path:
        return None
    if ckpt_path == "auto":
        return latest_checkpoint(run_dir)
    if ckpt_path == "last":
        last = run_dir / "checkpoints" / "last.ckpt"
        if not last.is_file():
            other = latest_checkpoint(run_dir)
            if other is not None:
                raise FileNotFoundError(
                    f"ckpt_path=last: no checkpoint at {last}; the newest checkpoint of this run is "
                    f"{other}: resume with {ckpt_override(other)}."
                )
            raise FileNotFoundError(
                f"ckpt_path=last: no checkpoint at {last}. To resume another run, pass ckpt_path=<its run "
                f"directory> (or hydra.run.dir=<its run directory> ckpt_path=last)."
            )
        return last
    p = Path(os.path.expanduser(str(ckpt_path)))
    if p.is_dir():
        found = latest_checkpoint(p)
        if found is None:
            raise FileNotFoundError(f"ckpt_path={ckpt_path}: a directory with no checkpoint in {p / 'checkpoints'}.")
        return found
    if not p.is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no checkpoint file at {p}.")
    return p


def resumes_here(checkpoint: Path | None, run_dir: Path) -> bool:
    """Whether resuming ``checkpoint`` continues the run in ``run_dir`` (it lies inside it)."""
    if checkpoint is None:
        return False
    return run_dir.resolve() in Path(checkpoint).resolve().parents


def claim(run_dir: Path, checkpoint: Path | None, overwrite: bool = False) -> None:
    """Take ``run_dir``'s lock and refuse it when it holds another run (see the module docstring)
    that this run does not resume from ``checkpoint``; with ``overwrite``, delete that run's outputs.
    The caller gives the lock back with :func:`release` when the run ends."""
    if not is_secondary_rank():
        lock(run_dir)
    try:
        _check_held(run_dir, checkpoint, overwrite)
    except BaseException:
        release(run_dir)
        raise


def release(run_dir: Path) -> None:
    """The run in ``run_dir`` is over: give its lock back."""
    if not is_secondary_rank():
        unlock(run_dir)


def _check_held(run_dir: Path, checkpoint: Path | None, overwrite: bool) -> None:
    held = held_run(run_dir)
    if not held or resumes_here(checkpoint, run_dir):
        return
    if not overwrite:
        advice = _resume_advice(run_dir)
        raise RunDirError(
            f"{run_dir} already holds a run: {'; '.join(held)}. A new run there would replace its encoder and "
            f"mix their checkpoints and W&B runs. {advice}{'give' if advice else 'Give'} this run another directory "
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


# --- fine-tuning runs --------------------------------------------------------------------------------
def claim_results(run_dir: Path, results_path: Path, overwrite: bool = False) -> None:
    """Take ``run_dir``'s lock and refuse it when ``results_path`` holds an earlier run's results
    (``overwrite``: they are replaced when this run writes its own)."""
    if not is_secondary_rank():
        lock(run_dir)
    pretraining = [h for h in held_run(run_dir) if "results.json" not in h]
    if pretraining:
        release(run_dir)
        raise RunDirError(
            f"{run_dir} holds a pretraining run ({'; '.join(pretraining)}): a fine-tuning run there would write its "
            f"config.yaml, logs and W&B run over that run's. Give the fine-tuning run a directory of its own "
            f"(hydra.run.dir=...)."
        )
    if results_path.exists() and not overwrite:
        release(run_dir)
        raise RunDirError(
            f"{results_path} holds the results of an earlier fine-tuning run; this run would replace them. Give this "
            f"run another directory (hydra.run.dir=...), move the results away, or pass overwrite=true to replace them."
        )


class GuardRunDir(Callback):
    """Hydra callback: take the run directory's lock and refuse an occupied directory before Hydra
    writes into it. ``kind``: ``pretraining`` (checkpoints, encoder) or ``finetuning``
    (``results.json``). The lock is held until the process ends.

    Hydra turns an exception raised by a callback into a warning and goes on, so the refusal is
    printed here and the process exits with status 1."""

    def __init__(self, kind: str = "pretraining"):
        if kind not in ("pretraining", "finetuning"):
            raise ValueError(f"GuardRunDir(kind={kind!r}): expected pretraining or finetuning.")
        self.kind = kind

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if is_secondary_rank():
            return
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().set_config(config)  # resolves ${now:...} and ${hydra:...} as the run will
        run_dir = Path(str(config.hydra.run.dir))
        try:
            lock(run_dir)
            if config.get("overwrite") and self.kind == "pretraining":
                return
            if self.kind == "finetuning":
                claim_results(run_dir, run_dir / "results.json", overwrite=bool(config.get("overwrite")))
                return
            try:
                checkpoint = checkpoint_to_resume(config.get("ckpt_path"), run_dir)
            except FileNotFoundError:
                return  # the run itself says so
            _check_held(run_dir, checkpoint, False)
        except RunDirError as e:
            print(f"Error: {e}", file=sys.stderr)
            raise SystemExit(1) from None


__all__ = [
    "GuardRunDir",
    "LOCK",
    "RUN_OUTPUTS",
    "RunDirBusy",
    "RunDirError",
    "checkpoint_to_resume",
    "claim",
    "claim_results",
    "ckpt_override",
    "held_run",
    "is_secondary_rank",
    "latest_checkpoint",
    "lock",
    "release",
    "resumes_here",
    "unlock",
]
