"""Stopping a training run on a signal without losing it.

SIGTERM (SLURM preemption or time limit, ``scancel``, ``kill``) and a first Ctrl-C (SIGINT) end a
run the same way: the optimizer step in progress is finished, ``checkpoints/last.ckpt`` is written,
and the process exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT). A second
Ctrl-C stops at once, from the last checkpoint written.

DataLoader worker processes ignore both signals (:func:`worker_init`). ``scancel``, a shell's
``kill -TERM -<group>`` and a terminal's Ctrl-C signal the whole process group; a worker that died
of it first would make the main process fail with "DataLoader worker ... killed by signal" before it
could save. The workers are ended by their DataLoader when the main process is done.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from pretrainlab.runtime.checkpoints import save as save_checkpoint

log = logging.getLogger("pretrainlab")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def worker_init(worker_id: int) -> None:
    """``worker_init_fn`` of every DataLoader: leave SIGTERM and SIGINT to the main process (and
    seed the worker as Lightning would, when ``seed_everything(workers=True)`` asked for it)."""
    import os

    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        from lightning.fabric.utilities.seed import pl_worker_init_function

        pl_worker_init_function(worker_id)


class StepCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` without its end-of-training ``last.ckpt``: the run writes the final state
    itself, and skips it when a signal stopped the run, whose checkpoint is the one to resume from.

    Create it with ``enable_version_counter=False``: a ``last.ckpt`` that this callback did not
    write itself (the one :class:`SaveOnSignal` wrote before the first periodic checkpoint) must be
    replaced, not left behind beside a ``last-v1.ckpt`` for ``ckpt_path=last`` to resume from."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass


class SaveOnSignal(Callback):
    """On SIGTERM or a first SIGINT: finish the optimizer step in progress, save ``last.ckpt``
    (atomically; nothing when ``path`` is None, as in fine-tuning, which has no checkpoints) and stop
    training; ``stopped`` is then true and ``signum`` says which signal.

    During training this replaces Lightning's SIGTERM handler (and Python's SIGINT handler) by one
    that only records the signal; the decision is taken at the end of each optimizer step (under DDP
    all ranks agree on it with one all-reduce), so every rank saves and stops at the same step. The
    checkpoint is written from ``on_train_batch_end``, the point Lightning's own step checkpoints
    are written from, so the resumed run repeats the uninterrupted one exactly, also when that step
    closed an epoch or the signal came in the middle of a gradient accumulation. The ranks agree over
    a CPU (gloo) group, so the check never waits for the GPUs. (Lightning's own
    handler stops right after the micro-batch in which the signal arrived, mid-step under
    accumulation, after the epoch has been closed at an epoch end, and under DDP runs a collective
    inside the signal handler, which can deadlock the ranks.)

    A KeyboardInterrupt that reaches Lightning (a second Ctrl-C, or one outside training) is
    recorded too: ``signum`` is SIGINT and ``stopped`` false (nothing was saved).

    Train with :meth:`fit`; afterwards :meth:`exit_if_stopped` (or :meth:`exit`, with a message of
    the run's own) ends a run a signal stopped, saying how to resume it (``resume_hint``)."""

    def __init__(self, path: Path | None, resume_hint: str = ""):
        self.path = path
        self.resume_hint = resume_hint
        self.signum: int | None = None
        self._step_at_start = -1
        self._previous_sigint: Any = None
        self._group: Any = None
        self.stopped = False

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process a signal ended (once a signal came)."""
        if self.signum is None:
            raise RuntimeError("no signal came: there is no exit code to report")
        return 128 + int(self.signum)

    def _request(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if signum == signal.SIGINT:
            log.warning(
                "Ctrl-C: stopping after this optimizer step and saving %s (Ctrl-C again stops at once)", self.path
            )
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C interrupts

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.received_sigterm:  # a signal before training started
            self.signum = signal.SIGTERM
        self._group = None
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            # the ranks agree on a host-side flag over a CPU (gloo) group: no wait on the GPUs
            self._group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._request)  # Lightning restores its handlers at teardown
            self._previous_sigint = signal.signal(signal.SIGINT, self._request)

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_sigint()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt) and self.signum is None:
            self.signum = signal.SIGINT
        self._restore_sigint()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_at_start = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._step_at_start:
            return  # inside a gradient accumulation: the step is not finished
        stop = self.signum is not None
        if self._group is not None:
            flag = torch.tensor([int(stop)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            stop = bool(flag)
        if stop:
            if self.signum is None:  # another rank was signalled
                self.signum = signal.SIGTERM
            if self.path is not None:
                save_checkpoint(trainer, self.path)
            self.stopped = trainer.should_stop = True  # ends after this step's logging; nothing else is saved

    def fit(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        """``trainer.fit(*args, **kwargs)``; a stop by a signal is left in ``signum`` rather than
        raised. (Lightning raises its ``SIGTERMException``, a ``SystemExit`` with status 0, for a
        SIGTERM that arrives while its own handler is in place, before training starts; and
        ``SystemExit(1)`` after a KeyboardInterrupt it caught, which this callback records.)"""
        try:
            trainer.fit(*args, **kwargs)
        except SIGTERMException:
            self.signum = signal.SIGTERM
        except SystemExit:
            if self.signum is None:
                raise

    def exit(self, message: str) -> NoReturn:
        """Log ``<SIGNAL>: message`` and exit with 128 + the signal's number (once a signal came)."""
        code = self.exit_code  # raises when no signal came
        log.warning("%s: %s", signal_name(code - 128), message)
        raise SystemExit(code)

    def exit_if_stopped(self, trainer: L.Trainer) -> None:
        """After :meth:`fit`: when a signal stopped the run, say which checkpoint to resume from and
        how (``resume_hint``), and exit with 128 + the signal's number; otherwise nothing."""
        if self.signum is None:
            return
        saved = (
            f"checkpoint saved at step {trainer.global_step} to {self.path}"
            if self.stopped and self.path is not None
            else "stopped without saving; the last checkpoint written is the one to resume from"
        )
        self.exit(f"{saved}. Resume with:\n  {self.resume_hint}")


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@contextmanager
def exit_on_signal(what: str, hint: str):
    """While ``what`` (a study, an evaluation suite) runs, a SIGTERM outside the training steps (which
    stop at the end of a step on their own, see :class:`SaveOnSignal`) ends it at once with status
    143 and the command that continues it. Outside the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        log.warning("%s: %s stopped. Continue it with:\n  %s", signal_name(signum), what, hint)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class TimeUp(BaseException):
    """A command's time ran out (:func:`deadline`): raised in the main thread, it stops the work in
    progress as Ctrl-C does (``studies.parallel`` sends every process SIGTERM) and lets the command
    write what finished. ``limit``: the :func:`deadline` that ran out (what it yielded), so that code
    holding a limit of its own inside another's catches its own and lets the other's go on up."""

    def __init__(self, message: str, limit: object = None):
        super().__init__(message)
        self.limit = limit


@contextmanager
def deadline(at: float, message: Callable[[], str]) -> Iterator[object]:
    """Raise :class:`TimeUp` (``message()``, at the moment it is raised) in this thread at ``at``
    (``time.time()``); yields the limit that the error names (``TimeUp.limit``). Deadlines nest: inside
    another, the earlier of the two is raised as its own, and leaving the inner one re-arms the outer
    one for what is left of its time. Without interval timers (Windows) nothing is stopped."""
    limit = object()
    if not hasattr(signal, "setitimer"):
        yield limit
        return
    outer_s, _ = signal.getitimer(signal.ITIMER_REAL)  # an enclosing deadline's time left, 0 when none
    outer_at = time.time() + outer_s if outer_s > 0 else None
    previous = signal.getsignal(signal.SIGALRM)
    outer_fired = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal outer_fired
        if time.time() >= at - 0.005:
            raise TimeUp(message(), limit)
        if outer_at is not None and not outer_fired and callable(previous):
            outer_fired = True  # the enclosing deadline's time came first: its own error, raised once
            previous(signum, frame)
        signal.setitimer(signal.ITIMER_REAL, max(0.01, at - time.time()))  # not ours yet: wait for ours

    signal.signal(signal.SIGALRM, stop)
    first = at if outer_at is None else min(at, outer_at)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, first - time.time()))
    try:
        yield limit
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_at is not None and not outer_fired:  # the enclosing deadline goes on with what is left of its time
            signal.setitimer(signal.ITIMER_REAL, max(0.01, outer_at - time.time()))


__all__ = [
    "STOP_SIGNALS",
    "SaveOnSignal",
    "StepCheckpoint",
    "TimeUp",
    "deadline",
    "exit_on_signal",
    "signal_name",
    "worker_init",
]
