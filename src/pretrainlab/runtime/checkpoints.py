"""Pretraining checkpoints: written atomically with ordinary permissions, read without running any
code they might carry, and checked against the run that resumes them.

A checkpoint holds, beside Lightning's state, ``checkpoint["pretrainlab"]``: the objective, the
model and the data (the corpus's and the tokenizer's fingerprints) it was trained with
(:func:`run_info`). Resuming compares them with the resuming run's before anything is loaded, so a
``bert`` checkpoint is never continued as ``albert``, nor a run continued on another corpus.

Checkpoints are only ever read with ``torch.load(weights_only=True)``: tensors and plain data.
A file that needs more (a pickled object, which could run code as it loads) is refused.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from pretrainlab import atomic
from pretrainlab.runtime.provenance import ADDED_SETTINGS

KEY = "pretrainlab"


def save(trainer, path: str | Path) -> None:
    """Save the trainer's full state (weights, optimizer, loops) to ``path``, through the run's
    ``CheckpointIO``. (Lightning's ``weights_only`` flag, passed as False here, is about what is
    saved; it would otherwise log that it was not set.)"""
    trainer.save_checkpoint(path, False)


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that belongs to another kind of run."""


def load_tensors(
    path: str | Path, mmap: bool = False, unsafe_advice: str = "", corrupt_advice: str = "", what: str = "file"
) -> Any:
    """``torch.load`` of ``path`` as tensors and plain data only, on the CPU, with errors that name
    the file and say what to do: ``unsafe_advice`` when it holds other Python objects (never
    unpickled: that could run arbitrary code), ``corrupt_advice`` when it is empty or damaged."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file.")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): an interrupted copy or a full disk? {corrupt_advice}")
    with open(path, "rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"
    if not zipped:
        raise CheckpointError(
            f"{path} is not a PyTorch {what} (torch.save writes a zip archive; this file is not one). Check the path."
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "weights only" not in str(e).lower():
            raise CheckpointError(f"{path} is corrupt ({_first_line(e)}). {corrupt_advice}") from None
        raise CheckpointError(
            f"{path} holds Python objects other than tensors and plain data ({_unsupported(e)}). It is not loaded: "
            f"unpickling them could run arbitrary code. {unsafe_advice}"
        ) from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as e:
        raise CheckpointError(f"{path} is truncated or corrupt ({_first_line(e)}). {corrupt_advice}") from None


def read(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """The checkpoint at ``path``, loaded as tensors and plain data only, on the CPU. ``mmap``:
    map the tensors instead of reading them (cheap, to look at the metadata of a large file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file.")
    checkpoint = load_tensors(
        path,
        mmap,
        unsafe_advice="pretrainlab checkpoints never need that; use a checkpoint written by pretrainlab.",
        corrupt_advice="Resume from another checkpoint, or start the run afresh.",
        what="checkpoint",
    )
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is a PyTorch file but not a training checkpoint (it has no state_dict).")
    return checkpoint


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def _unsupported(e: BaseException) -> str:
    """The Python object a weights-only load refused, without torch's advice to allow it."""
    import re

    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
    if m:
        return f"it needs {m.group(1)}"
    for line in str(e).splitlines():
        if "GLOBAL" in line:
            return line.strip()[:120]
    return _first_line(e)


def run_info(objective: dict, model: dict, data: dict | None = None) -> dict:
    """What a checkpoint records of its run: the objective's config, the encoder's, and the data's
    identity (``{"corpus": ..., "tokenizer": ...}`` fingerprints; None before they are known)."""
    info = {"objective": objective, "model": model}
    if data is not None:
        info["data"] = data
    return info


DATA_PARTS = {"corpus": "the corpus files (their names, sizes or contents)", "tokenizer": "the tokenizer"}


def data_differences(was: dict | None, now: dict | None) -> list[tuple[str, str, str | None]]:
    """(what, then, now) for each part of two data identities (``{"corpus": ..., "tokenizer": ...}``)
    that differs; nothing when either was not recorded (work made before records had it)."""
    if not was or not now:
        return []
    differences: list[tuple[str, str, str | None]] = []
    for k, why in DATA_PARTS.items():
        if was.get(k) is not None and was[k] != now.get(k):
            differences.append((why, str(was[k]), None if now.get(k) is None else str(now.get(k))))
    return differences


def check_resumable(path: str | Path, info: dict, ignore: tuple[str, ...] = ()) -> dict:
    """Read the checkpoint at ``path`` and refuse it when it was trained with another objective or
    model than ``info`` (:func:`run_info`) describes; ``ignore``: model fields not known yet (the
    vocabulary size, before the tokenizer). Returns the checkpoint (tensors mapped, not read)."""
    checkpoint = read(path, mmap=True)
    saved = checkpoint.get(KEY)
    if saved is None:
        return checkpoint  # written before checkpoints recorded their run; Lightning's own checks apply
    for part in ("objective", "model"):
        was, now = dict(saved.get(part) or {}), info.get(part) or {}
        skip = ignore if part == "model" else ()
        for k in set(now) - set(was):  # a setting added since the checkpoint: at the value it was made with
            if f"{part}.{k}" in ADDED_SETTINGS:
                was[k] = ADDED_SETTINGS[f"{part}.{k}"]
        changed = sorted(k for k in set(was) | set(now) if k not in skip and was.get(k) != now.get(k))
        if not changed:
            continue
        if part == "objective" and was.get("name") != now.get("name"):
            what = f"objective={was.get('name')}, and this run is objective={now.get('name')}"
        else:
            what = f"{part} settings " + ", ".join(
                f"{part}.{k}={was.get(k)!r} (this run: {now.get(k)!r})" for k in changed
            )
        raise CheckpointError(
            f"{path} was trained with {what}. A resumed run must continue the same training: resume with the "
            f"checkpoint's settings, or start a new run (another hydra.run.dir, without ckpt_path)."
        )
    changed = data_differences(saved.get("data"), info.get("data"))
    if changed:
        what = " and ".join(f"{why} ({then!r} then, {now!r} now)" for why, then, now in changed)
        raise CheckpointError(
            f"{path} was trained on other data than this run's: {what}. Resuming would continue one run's "
            f"training on another's data. Resume with the corpus and tokenizer it was trained on, or start a "
            f"new run (another hydra.run.dir, without ckpt_path)."
        )
    return checkpoint


def write(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``checkpoint`` to ``path`` through :mod:`pretrainlab.atomic`: a temporary file beside it, renamed
    onto it, with the umask's permissions (the run's Lightning ``CheckpointIO`` writes through this)."""
    atomic.write_with(Path(path), lambda f: torch.save(checkpoint, f))


__all__ = [
    "DATA_PARTS",
    "KEY",
    "CheckpointError",
    "check_resumable",
    "data_differences",
    "load_tensors",
    "read",
    "run_info",
    "save",
    "write",
]
