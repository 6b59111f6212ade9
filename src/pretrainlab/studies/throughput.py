"""Throughput of a study's pretraining runs trained at once, measured in windows a coordinator announces:
every run started as the study starts it, each in a process of its own (``studies.parallel``, work of kind
``measure``), trained until it is warm, then timed.

Each job (:func:`measure`) builds its run exactly as pretraining does (``pretraining.run.assemble``: its
corpus, examples, model, optimizer, compile settings and trainer precision), trains until it is warm
(``warmup_steps``: the compile and its recompiles behind it), says so (``ready-<job>.json`` in the
exchange directory) and keeps training. A validation step before the first training step (as every
run of the study has) compiles the evaluation graph too. When every job is warm the coordinator
(:class:`Windows`, the ``tick`` of ``run_parallel``) writes ``windows.json``: one window in which all of
them train at once, then one window per job in turn, in which it trains alone while the others wait. Each
job counts the steps, tokens and FLOPs it finishes inside its windows (waiting for the device at their
edges only, so the count is the device's), writes ``rate-<job>.json`` and stops. Nothing it trains is kept;
the compile caches it filled are. The slot plans its budget from these counts (``slot.calibrate``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig

from pretrainlab import atomic
from pretrainlab.optim import Budget
from pretrainlab.pretraining import run as pretraining
from pretrainlab.runtime.script import RunScript

log = logging.getLogger("pretrainlab")

WINDOWS = "windows.json"


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Counting(Callback):
    """Follows the coordinator's windows from inside a training run: marks when the run is warm,
    counts what it finishes inside each window, stops the run after its last window."""

    def __init__(self, job: str, exchange: Path, warmup_steps: int, timeout_s: float, spawned_at: float):
        self.job, self.exchange = job, exchange
        self.warmup_steps, self.timeout_s, self.spawned_at = warmup_steps, timeout_s, spawned_at
        self.first_step_at: float | None = None
        self.ready_at: float | None = None
        self.windows: dict | None = None
        self.marks: dict[str, dict[str, dict[str, float]]] = {}
        self.sanity_from, self.sanity_s = 0.0, 0.0  # the validation step run (and compiled) before training

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.sanity_from = time.time()

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.sanity_s = time.time() - self.sanity_from

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def _mark(self, window: str, edge: str, module: Any, trainer: L.Trainer) -> None:
        _sync()
        self.marks.setdefault(window, {})[edge] = {
            "time": time.time(),
            "steps": float(trainer.global_step),
            "tokens": float(module.tokens_trained),
            "flops": float(module.flops),
        }

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.time()
        if self.ready_at is None:
            if trainer.global_step < self.warmup_steps:
                return
            _sync()
            self.ready_at = time.time()
            atomic.write_json(
                self.exchange / f"ready-{self.job}.json",
                {"at": self.ready_at, "setup_s": self.setup_s(now)},
            )
        if self.windows is None:
            path = self.exchange / WINDOWS
            if not path.is_file():
                if now - self.ready_at > self.timeout_s:
                    raise TimeoutError(
                        f"{self.job}: no windows from the coordinator {self.timeout_s:.0f} s after this job was warm "
                        f"({path}); another job may have failed to start."
                    )
                return
            self.windows = json.loads(path.read_text())
        assert self.windows is not None
        mine = [("together", self.windows["together"])]
        if self.job in self.windows["alone"]:
            mine.append(("alone", self.windows["alone"][self.job]))
        for window, (start, end) in mine:
            edges = self.marks.get(window, {})
            if "start" not in edges:
                if window == "alone" and now < start:  # wait, idle, for this job's turn
                    _sync()
                    time.sleep(max(0.0, start - time.time()))
                    self._mark(window, "start", pl_module, trainer)
                elif now >= start:
                    self._mark(window, "start", pl_module, trainer)
                return
            if "end" not in edges:
                if now >= end:
                    self._mark(window, "end", pl_module, trainer)
                    continue
                return
        if self.job not in self.windows["alone"]:  # not timed alone: idle until the others' turns are over
            _sync()
            last = max((end for _, end in self.windows["alone"].values()), default=0.0)
            time.sleep(max(0.0, last - time.time()))
        trainer.should_stop = True

    def setup_s(self, now: float | None = None) -> float:
        """From the process's start to its first training step, less the validation step before it:
        imports, data, examples, model (what a run of the study pays again, its compiles aside)."""
        return (self.first_step_at or now or time.time()) - self.spawned_at - self.sanity_s

    def rates(self) -> dict:
        """What each window counted: seconds, steps, tokens, FLOPs."""
        out: dict[str, Any] = {}
        for window, edges in self.marks.items():
            if "end" in edges:
                out[window] = {k: edges["end"][k] - edges["start"][k] for k in ("time", "steps", "tokens", "flops")}
                out[window]["seconds"] = out[window].pop("time")
        return out


def measure(
    cfg: DictConfig, job: str, exchange: str, warmup_steps: int, timeout_s: float, spawned_at: float, run_dir: str
) -> None:
    """Train ``cfg``'s run (a study's pretraining config) through the coordinator's windows and write
    what it counted to ``<exchange>/rate-<job>.json``. Runs in a process of its own (``studies.parallel``)."""
    exchange_dir = Path(exchange)
    steps = 10**9
    cfg.max_steps = steps
    cfg.budget.flops = cfg.budget.tokens = cfg.budget.minutes = None
    script = RunScript.of(cfg, run_dir, {})
    provisional, devices = pretraining.validate(cfg)
    script.start()
    built = pretraining.assemble(cfg, devices, budget=Budget("steps", steps))  # the run it times is the run it trains
    module, objective, flops_per_token = built.module, built.model.objective, built.flops_per_token
    counting = Counting(job, exchange_dir, warmup_steps, timeout_s, spawned_at)
    trainer = instantiate(
        cfg.trainer,
        max_steps=steps,
        max_epochs=-1,
        default_root_dir=str(script.dir),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[counting],
        # one validation step before training, as a study's run has (eager, in a compiled run too)
        limit_val_batches=1,
        num_sanity_val_steps=1,
        val_check_interval=steps,
        check_val_every_n_epoch=None,
        gradient_clip_val=module.optim.grad_clip,
        use_distributed_sampler=False,
        accumulate_grad_batches=devices.accumulate,
    )
    trainer.fit(module, datamodule=built.datamodule)
    counted = counting.rates()
    if "together" not in counted:
        raise RuntimeError(f"{job}: the run stopped before its windows were counted")
    atomic.write_json(
        exchange_dir / f"rate-{job}.json",
        {
            "job": job,
            "objective": objective.name,
            "flops_per_token": flops_per_token,
            "tokens_per_step": cfg.batch_size * cfg.max_seq_len,
            "setup_s": counting.setup_s(),
            "sanity_s": counting.sanity_s,
            "warm_after_s": (counting.ready_at or 0.0) - (counting.first_step_at or 0.0),
            **counted,
        },
    )
    script.finish()


class Windows:
    """The coordinator's side (a ``studies.parallel.run_parallel`` tick): once every job in progress
    is warm, writes the windows: ``together_s`` seconds all at once, starting ``lead_s`` from now, then
    ``alone_s`` seconds each, one after another, ``gap_s`` apart: every job's, or those of ``alone``
    only (the others idle through them: a run of another seed trains as fast alone as its first seed's)."""

    def __init__(
        self,
        exchange: Path,
        jobs: dict[str, str],
        together_s: float,
        alone_s: float,
        gap_s: float = 1.0,
        alone: set[str] | None = None,
    ):
        self.exchange, self.jobs = exchange, jobs  # work name -> job name
        self.alone = alone
        self.together_s, self.alone_s, self.gap_s = together_s, alone_s, gap_s
        self.written: dict | None = None

    def __call__(self, running: list[str]) -> None:
        if self.written is not None or not running:
            return
        jobs = [self.jobs[name] for name in running if name in self.jobs]
        if not all((self.exchange / f"ready-{job}.json").is_file() for job in jobs):
            return
        t = time.time() + 2 * self.gap_s
        windows: dict[str, Any] = {"together": [t, t + self.together_s], "alone": {}}
        t += self.together_s + self.gap_s
        for job in sorted(jobs):  # the jobs in progress (one that failed to start is named by run_parallel)
            if self.alone is not None and job not in self.alone:
                continue
            windows["alone"][job] = [t, t + self.alone_s]
            t += self.alone_s + self.gap_s
        atomic.write_json(self.exchange / WINDOWS, windows)
        self.written = windows
        log.info(
            "calibration: %d jobs warm; timing them together for %.0f s, then %d of them alone for %.0f s each",
            len(jobs),
            self.together_s,
            len(windows["alone"]),
            self.alone_s,
        )


def read_rates(exchange: Path, jobs: list[str]) -> dict[str, dict]:
    """Every job's ``rate-<job>.json``."""
    out = {}
    for job in jobs:
        path = exchange / f"rate-{job}.json"
        if not path.is_file():
            raise RuntimeError(f"calibration: {job} wrote no {path.name}; see its log")
        out[job] = json.loads(path.read_text())
    return out


__all__ = ["Counting", "WINDOWS", "Windows", "measure", "read_rates"]
