"""Runs trained together: several pretraining runs of one encoder shape in one process, their steps made
as one stacked model (``pretraining.fused.FusedGroup``), each a run of its own in every output.

Small encoders leave a GPU mostly idle; runs that train together fill more of it with the same kernels
(``model.stacked``). Each run is still the run it is alone: its directory, config, ``train.log``,
checkpoints (and exact resume, alone or together), export, snapshots, ``learning.csv``, W&B run, budget
and stop. How:

    prepare   each run is prepared as it is alone (``pretraining.run.prepare``: data, budget, module,
              trainer, logger), one after the other in this thread, so each is seeded and built as alone
    bind      their encoders are stacked; each run's encoder parameters become views of its slice of the
              stacked ones, their gradients views of the stacked gradients
    train     each run trains in a thread of its own (``pretraining.run.train``: its own trainer,
              AdamW, clipping, schedule, callbacks), and where its step reaches the encoder it meets the
              others (:class:`Fuser`):
                forward   a run's batch waits for every run's; the last to come makes every run's
                          encoder call at once, then each run's loss on its output (its own heads)
                backward  once every run's loss has come, one backward of their sum: in each run's
                          slice of the stacked parameters, that run's own gradient

A run that stops (its budget, a signal, an error) leaves the group and the others go on: its slice of the
stack is fed its last batch, its loss left out. A SIGTERM or Ctrl-C reaches every run, each of which
saves its checkpoint at the end of its step and exits as alone (status 128 + the signal's number).

What fuses (:func:`check_runs`, before any run starts): objectives that name their encoder call
(``Objective.encoder_call``: not ELECTRA, XLNet), encoders of one config without shared layers (not
ALBERT's), one device, float32 or bf16-mixed, no dropout (a run alone draws its dropout from its own
seed; the group would draw it from one generator), no gradient accumulation, ``on_nonfinite=stop``,
batches of one shape (``static_shapes=true``). The group's step runs eager: ``compile`` is set aside
with a line in the log.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from pretrainlab.config import ConfigError
from pretrainlab.model.encoder import Dropout, EncoderConfig
from pretrainlab.model.stacked import _plain_name
from pretrainlab.objectives.base import Batch, Objective, ObjectiveOutput
from pretrainlab.pretraining import run as pretraining
from pretrainlab.pretraining.assembly import build_encoder
from pretrainlab.pretraining.fused import FusedGroup
from pretrainlab.pretraining.module import PretrainModule
from pretrainlab.runtime.rundir import checkpoint_to_resume, claim, release
from pretrainlab.runtime.script import RunScript
from pretrainlab.runtime.settings import Devices

log = logging.getLogger("pretrainlab")

PRECISIONS = ("32", "32-true", "bf16-mixed")


@dataclass
class Member:
    """One run of a group: its config and directory as :func:`pretraining.run.run` takes them."""

    cfg: DictConfig
    run_dir: Path
    choices: dict[str, str] | None = None
    resume_hint: str | None = None


def why_not(cfg: DictConfig, devices: Devices | None = None) -> str | None:
    """Why the run ``cfg`` cannot train in a group (the setting and how to change it), or None."""
    devices = devices or Devices.of(cfg, cfg.batch_size, cfg.get("device_batch_size"))
    precision = str(cfg.trainer.get("precision", "32-true"))
    if devices.world > 1:
        return f"it trains on {devices.world} devices (trainer.devices): a group trains on one"
    if devices.accumulate > 1:
        return f"it accumulates {devices.accumulate} micro-batches per step (device_batch_size): set device_batch_size=null"
    if precision not in PRECISIONS:
        return f"trainer.precision={precision}: a group trains in {' or '.join(PRECISIONS[1:])}"
    if cfg.get("on_nonfinite", "stop") != "stop":
        return "on_nonfinite=skip leaves batches out run by run: set on_nonfinite=stop"
    if not devices.static_shapes:
        return "its batches change shape (static_shapes=false): set static_shapes=true"
    encoder_config, objective = pretraining.meta_model(cfg)
    if type(objective).encoder_call is Objective.encoder_call:
        return (
            f"objective={objective.name} needs more than one encoder call per step (Objective.encoder_call): "
            f"it trains alone"
        )
    if encoder_config.share_layers:
        return "model.share_layers=true (ALBERT's shared layers) cannot be stacked"
    with torch.device("meta"):
        modules = [build_encoder(encoder_config, objective), objective]
    dropping = [
        f"{name or type(module).__name__} (p={module.p})"
        for part in modules
        for name, module in part.named_modules()
        if isinstance(module, Dropout | nn.Dropout) and module.p > 0
    ]
    if dropping:
        return (
            f"it has dropout ({dropping[0]}): set model.hidden_dropout=0 model.attention_dropout=0 (and the "
            f"objective's own)"
        )
    return None


def check_runs(members: Sequence[Member]) -> list[tuple[EncoderConfig, Devices]]:
    """Each member's :func:`pretraining.run.validate`, then what a group needs of them (:func:`why_not`;
    one encoder config, one precision and accelerator): a ConfigError naming the run and the fix."""
    checked = [pretraining.validate(m.cfg) for m in members]
    for m, (_, devices) in zip(members, checked, strict=True):
        reason = why_not(m.cfg, devices)
        if reason is not None:
            raise ConfigError(f"run {m.run_dir} cannot train in a fused group: {reason}.")
    first = members[0]
    for m, (config, _) in zip(members[1:], checked[1:], strict=True):
        for key in ("trainer.precision", "trainer.accelerator"):
            mine, theirs = OmegaConf.select(first.cfg, key), OmegaConf.select(m.cfg, key)
            if mine != theirs:
                raise ConfigError(
                    f"runs {first.run_dir} and {m.run_dir} cannot train in one fused group: {key} is {mine} in "
                    f"one and {theirs} in the other. Group runs of one {key}."
                )
        diff = [k for k, v in checked[0][0].to_dict().items() if k != "vocab_size" and config.to_dict()[k] != v]
        if diff:
            raise ConfigError(
                f"runs {first.run_dir} and {m.run_dir} cannot train in one fused group: model.{diff[0]} differs. "
                f"Group runs of one model config (their objectives and seeds may differ)."
            )
    return checked


class FusedGroupError(RuntimeError):
    """The group's step failed; every run of it stops with this error."""


class _Meeting:
    """One kind of meeting (forward or backward): what each run brought to this round, what it gets back."""

    def __init__(self) -> None:
        self.brought: dict[int, Any] = {}
        self.results: dict[int, Any] = {}
        self.round = 0


class Fuser:
    """Where the runs of a group meet in each step (the module docstring): ``forward`` and ``backward``
    are called by each run's ``PretrainModule`` from its own thread; ``leave`` when its training ends."""

    def __init__(self, group: FusedGroup, modules: Sequence[PretrainModule]):
        self.group = group
        self.index = {id(module): i for i, module in enumerate(modules)}
        self.active = set(range(len(modules)))
        self.last: list[Batch | None] = [None] * len(modules)
        self.lock = threading.Condition()
        self.forwards, self.backwards = _Meeting(), _Meeting()
        self.error: BaseException | None = None
        # each run's trained encoder parameters and the stacked parameter it is a slice of
        self.grads: list[list[tuple[nn.Parameter, nn.Parameter]]] = [[] for _ in modules]
        for name, stacked in group.stacked.encoder.named_parameters():
            for m, module in enumerate(modules):
                own = module.encoder.get_parameter(_plain_name(name))
                if own.requires_grad:
                    self.grads[m].append((own, stacked))

    def forward(self, module: PretrainModule, batch: Batch) -> ObjectiveOutput:
        return self._meet(self.forwards, self.index[id(module)], batch, self._forward)

    def backward(self, module: PretrainModule, loss: torch.Tensor) -> None:
        self._meet(self.backwards, self.index[id(module)], loss, self._backward)

    def leave(self, module: PretrainModule) -> None:
        """This run takes no more steps: the others stop waiting for it."""
        with self.lock:
            self.active.discard(self.index[id(module)])
            self.lock.notify_all()

    def _meet(self, meeting: _Meeting, m: int, item: Any, make: Callable[[dict[int, Any]], dict[int, Any]]) -> Any:
        with self.lock:
            if m not in self.active:
                raise RuntimeError("a run that has left its fused group took another step")
            meeting.brought[m] = item
            mine = meeting.round
            while True:
                if meeting.round != mine:
                    return meeting.results.pop(m)
                if self.error is not None:
                    raise FusedGroupError(f"the fused group's step failed: {self.error!r}") from self.error
                if self.active <= set(meeting.brought):  # every run still training is here: this one makes the step
                    brought, meeting.brought = meeting.brought, {}
                    try:
                        meeting.results.update(make(brought))
                    except BaseException as error:
                        self.error = error
                        self.lock.notify_all()
                        raise
                    meeting.round += 1
                    self.lock.notify_all()
                    return meeting.results.pop(m)
                self.lock.wait()

    def _forward(self, batches: dict[int, Batch]) -> dict[int, ObjectiveOutput]:
        for m, batch in batches.items():
            self.last[m] = batch
        stand_in = next(iter(batches.values()))
        outs = self.group([batches.get(m, self.last[m] or stand_in) for m in range(self.group.runs)])
        return {m: outs[m] for m in batches}

    def _backward(self, losses: dict[int, torch.Tensor]) -> dict[int, None]:
        stacked = list(self.group.stacked.parameters())
        for p in stacked:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()
        torch.stack([loss.float() for loss in losses.values()]).sum().backward()
        for m in losses:  # each run's encoder gradient: its slice of the stacked one, for its own optimizer
            for own, p in self.grads[m]:
                own.grad = p.grad[m]  # type: ignore[index]
        return dict.fromkeys(losses)


def _copy_out(module: nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
    """A run's encoder state holds its own tensors, not views of the whole stack (a checkpoint or export
    would save every run's weights)."""
    for key in [k for k in state if k.startswith(prefix)]:
        if isinstance(state[key], torch.Tensor):
            state[key] = state[key].clone()


def bind(modules: Sequence[PretrainModule], device: torch.device) -> FusedGroup:
    """Stack the runs' encoders on ``device`` and make each run's encoder parameters views of its slice of
    the stack (their gradients are, after each backward: :class:`Fuser`); returns the group, whose step each run's module now takes."""
    for module in modules:
        module.to(device)
    group = FusedGroup([module.encoder for module in modules], [module.objective for module in modules])
    for name, stacked in group.stacked.encoder.named_parameters():
        for m, module in enumerate(modules):
            module.encoder.get_parameter(_plain_name(name)).data = stacked.data[m]
    fuser = Fuser(group, modules)
    for module in modules:
        module.encoder._register_state_dict_hook(_copy_out)
        module.fuser = fuser
    return group


class _Current(threading.local):
    run_dir: Path | None = None


_current = _Current()


class _OnlyThisRun(logging.Filter):
    """A run's ``train.log`` takes the records of its own thread (the root logger is every run's)."""

    def __init__(self, run_dir: Path):
        super().__init__()
        self.run_dir = run_dir

    def filter(self, record: logging.LogRecord) -> bool:
        return _current.run_dir == self.run_dir


def run_together(members: Sequence[Member]) -> list[dict[str, Any]]:
    """Pretrain every member as one fused group (the module docstring); returns each run's result, as
    :func:`pretraining.run.run` returns it. A run that fails fails the group once every run has ended
    (a signal's stop: ``SystemExit`` with its status; an error: a RuntimeError naming each run)."""
    if not members:
        return []
    checked = check_runs(members)
    scripts = [RunScript.of(m.cfg, m.run_dir, m.choices) for m in members]
    for script in scripts:
        script.concurrent = True
    resumes = [checkpoint_to_resume(m.cfg.ckpt_path, s.dir) for m, s in zip(members, scripts, strict=True)]
    claimed: list[Path] = []
    try:
        for m, script, resume in zip(members, scripts, resumes, strict=True):
            claim(script.dir, resume, overwrite=bool(m.cfg.get("overwrite", False)))
            claimed.append(script.dir)
        runs = []
        for m, script, (provisional, devices), resume in zip(members, scripts, checked, resumes, strict=True):
            _current.run_dir = script.dir
            hint = m.resume_hint or pretraining.resume_command(script.dir)
            runs.append(pretraining.prepare(m.cfg, script, provisional, devices, resume, hint))
            if script._file_handler is not None:
                script._file_handler.addFilter(_OnlyThisRun(script.dir))
            _current.run_dir = None
        return _train(runs)
    finally:
        _current.run_dir = None
        for run_dir in claimed:
            release(run_dir)


def _train(runs: list[pretraining.Prepared]) -> list[dict[str, Any]]:
    modules = [run.module for run in runs]
    for run in runs:
        if run.module.compile_options is not None:
            log.info("%s: the fused group's step runs eager (compile is set aside)", run.script.dir.name)
            run.module.compile_options = None
    device = runs[0].trainer.strategy.root_device
    group = bind(modules, device)
    log.info(
        "fused group of %d runs on %s: %s",
        group.runs,
        device,
        ", ".join(run.script.dir.name for run in runs),
    )
    outcomes: list[Any] = [None] * len(runs)

    def train(i: int) -> None:
        run = runs[i]
        _current.run_dir = run.script.dir
        try:
            outcomes[i] = pretraining.train(run)
        except BaseException as error:  # noqa: BLE001 - reported for every run once all have ended
            outcomes[i] = error
        finally:
            assert run.module.fuser is not None
            run.module.fuser.leave(run.module)

    threads = [
        threading.Thread(target=train, args=(i,), name=f"run-{run.script.dir.name}") for i, run in enumerate(runs)
    ]
    with _signals_to(runs):
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
    return _results(runs, outcomes)


class _signals_to:
    """While the group trains: a SIGTERM or first Ctrl-C to this process reaches every run's stopper (each
    saves at the end of its step and stops); a second Ctrl-C ends the process at once (status 130), from
    the checkpoints last written."""

    def __init__(self, runs: list[pretraining.Prepared]):
        self.runs = runs
        self.previous: dict[int, Any] = {}
        self.count = 0

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            self.count += 1
            if self.count > 1:
                log.warning("Ctrl-C again: stopping at once")
                os._exit(130)
        log.warning("%s: every run of the group saves at the end of its step and stops", signal.Signals(signum).name)
        for run in self.runs:
            if run.stopper.signum is None:
                run.stopper.signum = signum

    def __enter__(self) -> _signals_to:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self.previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def _results(runs: list[pretraining.Prepared], outcomes: list[Any]) -> list[dict[str, Any]]:
    errors = [(run, o) for run, o in zip(runs, outcomes, strict=True) if isinstance(o, BaseException)]
    stops = [o for _, o in errors if isinstance(o, SystemExit)]
    failures = [(run, o) for run, o in errors if not isinstance(o, SystemExit)]
    if failures:
        named = "; ".join(f"{run.script.dir}: {type(o).__name__}: {o}" for run, o in failures)
        raise RuntimeError(f"{len(failures)} run(s) of the fused group failed: {named}") from failures[0][1]
    if stops:
        raise SystemExit(stops[0].code)
    return list(outcomes)


__all__ = ["FusedGroupError", "Fuser", "Member", "bind", "check_runs", "run_together", "why_not"]
