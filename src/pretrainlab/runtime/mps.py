"""CUDA's Multi-Process Service for several runs on one GPU.

Without it, the processes of a study that share a GPU take turns on it: one process's kernels at a
time. The MPS control daemon lets their kernels run at once. ``mps(directory)`` starts a daemon of
its own (its pipe and log folders in ``directory``, so that it neither needs nor disturbs a
machine-wide one), gives the environment that its clients must be started with, and stops it when
the block ends, whatever happens; where the device has no MPS (no CUDA, no control binary, a daemon
that does not start), it says why and the block runs without it.

    with mps(work / "mps") as daemon:
        env = {**os.environ, **daemon.env}       # empty when daemon.running is False
        log.info(daemon.status)                  # "MPS: running (...)" or "MPS: not used: <why>"

A study's processes share one through ``shared(setting, jobs, cuda, logs)``, the ``mps`` setting of
conf/ablate.yaml (and of the slot): ``auto`` starts a daemon where several of the study's processes share
one CUDA GPU and the device has MPS, and says why not otherwise; ``true`` refuses (``check``, before any
work) where that cannot be; ``false`` never starts one. Within the block the environment of this
process carries the daemon's folders, so that every process it starts is a client; a daemon started
before (``CUDA_MPS_PIPE_DIRECTORY`` already set: a slot around its study, or the machine's own) is
used as it is. On the slot's nine ``model=mini`` runs on an H200 it raised their aggregate throughput
more than any other lever (docs/speed.md, "Many small runs on one GPU").
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pretrainlab.config import ConfigError

log = logging.getLogger("pretrainlab")

CONTROL = "nvidia-cuda-mps-control"


@dataclass
class Daemon:
    """Whether an MPS daemon runs for this block (``running``), why not (``reason``), and the
    environment its clients need (``env``: the pipe and log folders)."""

    running: bool
    reason: str = ""
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None  # the daemon's log folder (one it started)

    @property
    def status(self) -> str:
        if self.running:
            return f"MPS: running ({self.reason or 'a daemon of its own'})"
        return f"MPS: not used: {self.reason}"


def _cuda_visible() -> str | None:
    """Why there is no CUDA device to share, or None."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA driver here (nvidia-smi not found)"
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"
    if out.returncode != 0 or "GPU" not in out.stdout:
        return f"no GPU listed by nvidia-smi -L ({(out.stderr or out.stdout).strip()[:200]})"
    return None


def _control(env: dict[str, str], command: str | None, timeout: float = 20.0) -> subprocess.CompletedProcess:
    args = [CONTROL] if command is not None else [CONTROL, "-d"]
    return subprocess.run(
        args, input=command, capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout
    )


@contextmanager
def mps(directory: Path, wanted: bool = True) -> Iterator[Daemon]:
    """An MPS control daemon of this block's own, in ``directory`` (see the module docstring)."""
    if not wanted:
        yield Daemon(False, "not asked for")
        return
    why = _cuda_visible()
    if why is None and shutil.which(CONTROL) is None:
        why = f"{CONTROL} not found on PATH (the CUDA driver's MPS binaries are not installed here)"
    if why is not None:
        log.warning("MPS: not used: %s", why)
        yield Daemon(False, why)
        return
    pipe, logs = Path(directory) / "pipe", Path(directory) / "log"
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    try:
        started = _control(env, None)
    except (OSError, subprocess.TimeoutExpired) as e:
        yield Daemon(False, f"{CONTROL} -d failed: {e}")
        return
    if started.returncode != 0:
        why = f"{CONTROL} -d exited with {started.returncode}: {(started.stderr or started.stdout).strip()[:300]}"
        log.warning("MPS: not used: %s", why)
        yield Daemon(False, why)
        return
    time.sleep(0.5)
    daemon = Daemon(True, env=env)
    log.info("%s", daemon.status)
    try:
        yield daemon
    finally:
        try:
            _control(env, "quit\n")
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("MPS: stopping the daemon failed: %s (log: %s)", e, logs)


SETTINGS = ("auto", True, False)


def check(setting: object, jobs: int, cuda: bool) -> None:
    """Refuse, before any work, ``mps=true`` where it cannot work: one process at a time, or runs
    that are not on a CUDA GPU (``setting`` is the study's ``mps``)."""
    if setting not in SETTINGS:
        raise ConfigError(f"mps={setting!r}: choose auto (where the GPU has it), true or false (conf/ablate.yaml).")
    if setting is True and jobs <= 1:
        raise ConfigError(
            "mps=true with jobs=1: CUDA's MPS lets several processes share a GPU, and this study runs one at a "
            "time. Set jobs to the runs to train at once, or mps=auto."
        )
    if setting is True and not cuda:
        raise ConfigError(
            "mps=true, but the study's runs are not on a CUDA GPU (trainer.accelerator, or no GPU here): MPS "
            "shares a CUDA device between processes. Set mps=auto or mps=false, or train on a GPU."
        )


@contextmanager
def shared(setting: object, jobs: int, cuda: bool, logs: Path) -> Iterator[Daemon]:
    """The daemon a study's processes share (see the module docstring); ``logs``: its log folder. Its
    pipe folder is a short temporary one (a socket's path has a length limit)."""
    check(setting, jobs, cuda)
    inherited = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if setting is False or jobs <= 1 or not cuda:
        why = (
            "mps=false"
            if setting is False
            else "one process at a time"
            if jobs <= 1
            else "the runs are not on a CUDA GPU"
        )
        yield Daemon(False, why)
        return
    if inherited:
        yield Daemon(True, env={"CUDA_MPS_PIPE_DIRECTORY": inherited}, reason="started before this block")
        return
    pipe = Path(tempfile.mkdtemp(prefix="mps-"))
    try:
        with mps(pipe) as daemon:
            if not daemon.running and setting is True:
                raise ConfigError(f"mps=true, but {daemon.reason}. Set mps=auto to go on without it.")
            if daemon.running:
                logs.mkdir(parents=True, exist_ok=True)
                daemon.log = pipe / "log"
            saved = {k: os.environ.get(k) for k in daemon.env}
            os.environ.update(daemon.env)
            try:
                yield daemon
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                if daemon.running:  # the daemon's log beside the study's
                    shutil.copytree(pipe / "log", logs / "mps", dirs_exist_ok=True)
    finally:
        shutil.rmtree(pipe, ignore_errors=True)


def daemon_log(directory: Path, lines: int = 20) -> str:
    """The end of the control daemon's log (what a client that could not connect finds there)."""
    path = Path(directory) / "log" / "control.log"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no MPS log)"


__all__ = ["CONTROL", "SETTINGS", "Daemon", "check", "daemon_log", "mps", "shared"]
