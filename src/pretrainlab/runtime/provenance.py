"""What finished work was made with, checked against the settings that now ask for it.

Studies and suites skip work that is already done: a pretraining run whose encoder is exported, a
(task, seed) whose results file exists. Skipping is right only when the finished work was made
with the settings asking for it now; otherwise the report shows one experiment's numbers under
another's settings. Both checks compare the recorded config with the new one through
:func:`differences`, and refuse with :class:`SettingsMismatch`, which names what differs and the fix.

Settings that change *how* a run goes but not *what* it computes (devices, precision, logging,
workers, compilation, checkpoint and validation intervals) are not compared: see
:data:`PRETRAINING_HOW`.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shlex
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pretrainlab

# pretraining settings that do not change the encoder a run produces (beyond numerical noise):
# trainer settings, logging, workers, compilation, how often it validates and saves, where caches live
PRETRAINING_HOW = (
    "trainer",
    "logger",
    "num_workers",
    "compile",
    "compile_mode",
    "static_shapes",
    "tf32",
    "keep_freed_memory",
    "progress_refresh_rate",
    "cache_dir",
    "ckpt_path",
    "overwrite",
    "export",
    "snapshots",
    "log_encoder_artifact",
    "device_batch_size",
    "val_every",
    "checkpoint_every",
    "on_nonfinite",
)

# Settings added since runs were first recorded, at the value every run recorded without them was made
# with: a run asked for now with another value is another run (its study record, its checkpoint).
ADDED_SETTINGS = {
    "objective.whole_word": False,
    "objective.mask_rate_start": None,
    "objective.causal_first": 0.0,
    "objective.pair_unit": "segments",
    "objective.pair_task": "sop",  # ALBERT's (BERT's is fixed: NSP)
    "objective.cross_documents": True,
    "arm": None,
}


class SettingsMismatch(ValueError):
    """Finished work made with other settings than those asking for it now."""


@functools.cache
def software() -> dict[str, Any]:
    """The code a run is made with: pretrainlab's version and, when it runs from a git checkout, the
    commit and whether tracked files differ from it (``dirty``); torch's, Lightning's and Python's
    versions. Recorded in checkpoints and exports, so a published number can be traced to its code."""
    import lightning  # lazily: reading a record needs neither (start-up time)
    import torch

    here = Path(pretrainlab.__file__).resolve().parent
    commit, dirty = None, None
    try:

        def git(*args: str) -> str:
            return subprocess.run(
                ["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()

        git("ls-files", "--error-unmatch", "__init__.py")  # the package is this checkout's, not an installed copy
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "pretrainlab": pretrainlab.__version__,
        "commit": commit,
        "dirty": dirty,
        "torch": str(torch.__version__),  # a str subclass a weights-only load refuses
        "lightning": str(lightning.__version__),
        "python": platform.python_version(),
    }


def code_history(previous: list[dict] | None) -> list[dict]:
    """The code a run has been trained with, oldest first: ``previous`` (from the checkpoint it
    resumes) with this process's :func:`software` added when it differs from the last entry."""
    history = [dict(s) for s in previous or []]
    if not history or history[-1] != software():
        history.append(software())
    return history


def differences(
    was: Any, now: Any, prefix: str = "", legacy: dict | None = None, ignore: Iterable[str] = ()
) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) of every setting that differs between two configs
    (plain containers). A key missing from the old record is a setting added since: it is compared
    at its ``legacy`` value (the value old work was made with), or not at all when it is not listed
    there. Keys in ``ignore`` (dotted, at any depth) are left out."""
    legacy, ignore = legacy or {}, set(ignore)
    out: list[tuple[str, Any, Any]] = []

    def walk(a: Any, b: Any, key: str) -> None:
        if key in ignore:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in b:
                sub = f"{key}.{k}" if key else str(k)
                if k in a:
                    walk(a[k], b[k], sub)
                elif sub in legacy:
                    walk(legacy[sub], b[k], sub)
            return
        if a != b and not _same_number(a, b):
            out.append((key, a, b))

    walk(was, now, prefix)
    return out


def _same_number(a: Any, b: Any) -> bool:
    """1e-3 recorded as 0.001, 2 as 2.0: the same setting."""
    numbers = (int, float)
    return (
        isinstance(a, numbers)
        and isinstance(b, numbers)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and float(a) == float(b)
    )


def describe(changed: list[tuple[str, Any, Any]], limit: int = 4) -> str:
    """``key: old then, new now, ...`` for a message, the first ``limit`` of them."""
    shown = ", ".join(f"{key}: {then!r} then, {value!r} now" for key, then, value in changed[:limit])
    more = f" (and {len(changed) - limit} more)" if len(changed) > limit else ""
    return shown + more


__all__ = ["PRETRAINING_HOW", "SettingsMismatch", "code_history", "describe", "differences", "software"]


def machine() -> str:
    """The machine in a few words: its GPUs when torch sees any, else the CPU's model, and its core count."""
    import os

    import torch

    cores = os.cpu_count()
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return f"{len(names)} x {names[0]}, {cores} CPU cores" if len(set(names)) == 1 else ", ".join(names)
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU only: {cores} cores of {model}"


ROOT = Path(__file__).resolve().parents[3]  # the checkout (src/pretrainlab/runtime/provenance.py)
ABSOLUTE = re.compile(r"(?<![^\s'\"=(\[,:`])/(?:[\w.+-]+/)+[\w.+-]*")  # /a/b..., at a word's start


def typed_command(command: str, root: Path = ROOT) -> str:
    """``command`` as a user would type it from the repository's root: a path inside the checkout (or
    beside it, ``../shared``) relative to it, a module's ``__main__.py`` as ``-m <module>``, and any
    other absolute path, of one machine only, a placeholder named by its option or key (``--out <out>``,
    ``data.path=<data.path>``, else ``<path>``)."""
    try:
        tokens = shlex.split(command)
    except ValueError:  # unbalanced quotes: leave it as it is
        return command
    out: list[str] = []
    previous = ""
    for token in tokens:
        module = re.fullmatch(r".*?src/pretrainlab/(?:(\w+)/)?__main__\.py", token)
        if module and Path(token).is_absolute():
            out += ["-m", f"pretrainlab.{module[1]}" if module[1] else "pretrainlab"]
            previous = token
            continue
        key = token.split("=", 1)[0] if "=" in token and not token.startswith("-") else None
        name = previous[2:] if previous.startswith("--") and "=" not in previous else key or "path"

        def place(match: re.Match, name: str = name) -> str:
            path = Path(match[0])
            for base in (root, root.parent):
                if path == base or base in path.parents:
                    return os.path.relpath(path, root)
            return f"<{name.lstrip('+~')}>"

        out.append(ABSOLUTE.sub(place, token))
        previous = token
    return shlex.join(out)


def machine_free(text: str, root: Path = ROOT) -> str:
    """``text`` (a report's own words) without the paths of the machine that wrote it: those inside the
    checkout (or beside it) relative to it, the others ``<path>``."""

    def place(match: re.Match) -> str:
        path = Path(match[0])
        for base in (root, root.parent):
            if path == base or base in path.parents:
                return os.path.relpath(path, root)
        return "<path>"

    return ABSOLUTE.sub(place, text)


def absolute_paths(text: str) -> list[str]:
    """The absolute paths in ``text`` (what a published report should not carry)."""
    return sorted(set(ABSOLUTE.findall(text)))


def report_provenance(command: str) -> dict[str, Any]:
    """What a report records of how it was made: the command as a user types it from the repository's
    root (:func:`typed_command`), the code (:func:`software`), the date (UTC) and the machine. Docs that
    cite a report show these beside its numbers."""
    import datetime

    made = software()
    return {
        "command": typed_command(command),
        "commit": made["commit"],
        "dirty": made["dirty"],
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": machine(),
        "software": made,
    }
