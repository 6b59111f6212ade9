"""Several pretraining runs, or evaluation suites, of a study at once (``jobs`` in conf/ablate.yaml),
each in its own process with an equal share of the CPU cores.

A small encoder does not keep two cores busy: on a 2-core CPU two ``model=tiny`` runs with a core
each train faster together than one run with both cores, one after the other (docs/studies.md). Each
run is the same as it would be one at a time (its config, directory, checkpoints, export; an
evaluation suite its results), except that its arithmetic uses fewer threads, which moves CPU results
within their noise.

Each process writes its console output to ``<study>/logs/pretrain-<run>.log`` or
``evaluate-<encoder>.log``. One that fails stops the study once those in progress have finished,
naming it, its exit status and its log. A SIGTERM or Ctrl-C to the study is passed on to every
process as one SIGTERM: a pretraining run finishes its optimizer step, saves its checkpoint and
exits, a fine-tuning run stops without results; the study exits with the command that continues
it. The processes are started in their own sessions, so that a terminal's Ctrl-C reaches them only
through the study, once. On Linux they are forked from a server that imported torch, Lightning and
this package once (``studies.forkserver``): each starts in a fraction of a second instead of ten.

    python -m pretrainlab.studies.parallel <spec.yaml>   # one piece of work (what the study starts)
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

import pretrainlab.runtime.hydra  # noqa: F401  (the resolvers the configs use)
from pretrainlab import atomic
from pretrainlab.config import ConfigError, plain
from pretrainlab.pretraining import run as pretraining
from pretrainlab.studies.arms import run_label
from pretrainlab.studies.forkserver import Forked, shared
from pretrainlab.studies.intrinsic import held_out, intrinsic_row
from pretrainlab.studies.suite import fuse_task, run_suite, suite_config
from pretrainlab.studies.throughput import measure

log = logging.getLogger("pretrainlab")


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_jobs(jobs: int, configs: list[DictConfig]) -> int:
    """``jobs``, checked: a positive integer, and 1 for runs that train on several devices (each such
    run is already parallel, and several of them would compete for the same devices)."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ConfigError(f"jobs={jobs!r}: give the number of runs to train at once, 1 or more.")
    several = [c for c in configs if str(c.trainer.get("devices", 1)) not in ("1", "auto")]
    if jobs > 1 and several:
        raise ConfigError(
            f"jobs={jobs} with trainer.devices={several[0].trainer.devices}: a run on several devices is "
            f"parallel already; set jobs=1 (conf/ablate.yaml or the command line)."
        )
    return jobs


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# the kinds of work a study does, in a process of its own (run_parallel), a SLURM job (studies.slurm) or
# its own process (studies.launch): what each is told is in its spec
KINDS = ("pretrain", "pretrain-group", "evaluate", "measure", "fuse")


@dataclass
class Work:
    """One piece of a study's work: a pretraining run (``kind="pretrain"``: cfg, run_dir, choices; then
    its held-out checks, and a file saying it is done when asked), an encoder's evaluation suite
    (``kind="evaluate"``: cfg, tasks, seeds, task_overrides), pretraining runs that differ only in their seed
    trained as one fused group (``kind="pretrain-group"``: cfg, each run's seed, checkpoint, run_dir and
    choices; ``pretraining.group``), or a pretraining run's throughput timed in a coordinator's windows (``kind="measure"``: ``studies.throughput.measure``'s arguments), or a GLUE task's
    fine-tunings of several encoders at once (``kind="fuse"``: the study's cfg, task, encoders, seeds)."""

    name: str  # what the console calls it: "pretraining roberta seed 0", "evaluating roberta-s0"
    kind: str
    cfg: DictConfig
    spec: dict
    log: Path

    def save(self, path: Path, resume_hint: str) -> Path:
        """Write the spec that :func:`run_work` runs (``path``) and its config beside it
        (``<path>.cfg.yaml``: in a file of its own, its interpolations, ``${task.lr}``..., start at
        its root); returns ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        cfg = path.with_name(path.name + ".cfg.yaml")
        OmegaConf.save(self.cfg, cfg)
        OmegaConf.save(OmegaConf.create({**self.spec, "kind": self.kind, "cfg": str(cfg), "resume": resume_hint}), path)
        return path

    def run(self, resume_hint: str) -> None:
        """Do it in this process."""
        do(self.kind, self.cfg, OmegaConf.create({**self.spec, "resume": resume_hint}))


CHECKS = ("intrinsic", "held-out", "none")


def pretraining_work(
    run_dir: Path,
    cfg: DictConfig,
    choices: dict,
    log: Path,
    checks: str = "intrinsic",
    done: str | None = None,
    name: str | None = None,
) -> Work:
    """Pretrain ``run_dir``, then compute its held-out checks in the same process, on its device
    (``studies.intrinsic``, where the study reads them back instead of computing every run's one after
    another): ``checks`` is ``intrinsic`` (what it learned and the NSP/SOP cross-check), ``held-out`` (what
    it learned) or ``none``. ``done``: a file of ``run_dir`` written when the run has ended (its last step)."""
    if checks not in CHECKS:
        raise ValueError(f"checks={checks!r}: one of {', '.join(CHECKS)}")
    spec = {"run_dir": str(run_dir), "choices": dict(choices), "checks": checks, "done": done}
    return Work(name or f"pretraining {run_label(cfg)}", "pretrain", cfg, spec, log)


def _as_member(template: DictConfig, seed: int, ckpt_path: str | None) -> DictConfig:
    """``template`` (a group's config) with one run's seed and checkpoint: that run's config."""
    cfg = template.copy()
    cfg.seed, cfg.ckpt_path = seed, ckpt_path
    return cfg


def _group_key(cfg: DictConfig) -> str:
    return json.dumps(
        {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in ("seed", "ckpt_path")},  # type: ignore[union-attr]
        sort_keys=True,
        default=str,
    )


def pretraining_groups(
    pending: list[tuple[Path, DictConfig, dict]], logs: Path, checks: str = "intrinsic", done: str | None = None
) -> list[Work]:
    """``fuse_pretraining=true``: the work of ``pending`` runs (run directory, config, choices), the runs
    that differ only in their seed trained as one fused group each (``pretraining.group``: each run the run
    alone in every output), the others one by one, each with the reason in the log."""
    from pretrainlab.pretraining.group import why_not

    groups: dict[str, list[tuple[Path, DictConfig, dict]]] = {}
    alone: list[tuple[Path, DictConfig, dict]] = []
    for run_dir, cfg, choices in pending:
        reason = why_not(cfg)
        if reason is None:
            groups.setdefault(_group_key(cfg), []).append((run_dir, cfg, choices))
        else:
            log.info("pretraining %s alone, not fused: %s", run_dir.name, reason)
            alone.append((run_dir, cfg, choices))
    work = []
    for runs in groups.values():
        template = runs[0][1]
        same = all(
            OmegaConf.to_container(_as_member(template, int(c.seed), c.ckpt_path), resolve=True)
            == OmegaConf.to_container(c, resolve=True)
            for _, c, _ in runs
        )
        if len(runs) < 2 or not same:
            alone.extend(runs)
            continue
        spec = {
            "runs": [
                {"run_dir": str(r), "choices": dict(ch), "seed": int(c.seed), "ckpt_path": c.ckpt_path}
                for r, c, ch in runs
            ],
            "checks": checks,
            "done": done,
        }
        name = f"pretraining {run_label(template)} seeds {', '.join(str(c.seed) for _, c, _ in runs)}, fused"
        work.append(Work(name, "pretrain-group", template, spec, logs / f"pretrain-{runs[0][0].name}-group.log"))
    first = {str(r): i for i, (r, _, _) in enumerate(pending)}  # the study's order: groups by their first run
    work.sort(key=lambda w: first[w.spec["runs"][0]["run_dir"]])
    singles = [pretraining_work(r, c, ch, logs / f"pretrain-{r.name}.log", checks, done) for r, c, ch in alone]
    return [*work, *sorted(singles, key=lambda w: first[w.spec["run_dir"]])]


def measure_work(name: str, cfg: DictConfig, kwargs: dict, log_path: Path) -> Work:
    """Time ``cfg``'s pretraining run in a coordinator's windows (``studies.throughput.measure`` with
    ``kwargs``) in a process of its own."""
    return Work(name, "measure", cfg, {"kwargs": dict(kwargs)}, log_path)


def suite_work(label: str, cfg: DictConfig, tasks: list[str], seeds: list[int], overrides: dict, logs: Path) -> Work:
    spec = {"tasks": list(tasks), "seeds": list(seeds), "task_overrides": overrides}
    return Work(f"evaluating {label}", "evaluate", cfg, spec, logs / f"evaluate-{label}.log")


def run_parallel(
    work: list[Work], jobs: int, resume_hint: str, tick: Callable[[list[str]], None] | None = None
) -> None:
    """Do every piece of ``work``, ``jobs`` processes at a time, each with ``cores() // jobs``
    threads (at least one), forked from a server that has imported what they need
    (``studies.forkserver``; on Linux, unless ``PRETRAINLAB_FORK_SERVER=0``) or started fresh. ``tick``: called about
    twice a second with the names of the work in progress (a coordinator's hook: ``studies.throughput.Windows``)."""
    threads = max(1, cores() // jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    queue = list(work)
    running: dict[subprocess.Popen | Forked, Work] = {}
    failed: list[tuple[Work, int]] = []
    forked = sys.platform == "linux" and os.environ.get("PRETRAINLAB_FORK_SERVER", "1") != "0"
    server = shared() if forked else None  # one per process, for every phase (studies.forkserver.shared)
    with tempfile.TemporaryDirectory(prefix="pretrainlab-study-") as tmp:
        try:
            while queue or running:
                while queue and len(running) < jobs and not failed:
                    item = queue.pop(0)
                    spec = item.save(Path(tmp) / f"{len(queue)}.yaml", resume_hint)
                    item.log.parent.mkdir(parents=True, exist_ok=True)
                    args = ["-m", "pretrainlab.studies.parallel", str(spec)]
                    proc: subprocess.Popen | Forked
                    if server is not None:
                        proc = server.popen(args, item.log, env, os.getcwd())
                    else:
                        with open(item.log, "ab") as out:
                            proc = subprocess.Popen(
                                [sys.executable, *args],
                                stdout=out,
                                stderr=subprocess.STDOUT,
                                env=env,
                                start_new_session=True,
                            )
                    running[proc] = item
                    log.info("%s: started, %d thread(s) (log: %s)", item.name, threads, item.log)
                time.sleep(0.5)
                for proc in [p for p in running if p.poll() is not None]:
                    item, code = running.pop(proc), int(proc.returncode or 0)
                    if code == 0:
                        log.info("%s: done", item.name)
                    else:
                        failed.append((item, code))
                        log.error("%s failed (exit status %d): see %s", item.name, code, item.log)
                if failed and not running:
                    break
                if tick is not None:
                    tick([item.name for item in running.values()])
        except BaseException:  # the study's SIGTERM (SystemExit) or Ctrl-C: every process saves and stops
            for proc in running:
                proc.send_signal(signal.SIGTERM)
            for proc, item in running.items():
                proc.wait()
                log.warning("%s: stopped (exit status %d; log: %s)", item.name, proc.returncode, item.log)
            raise
    if failed:
        item, code = failed[0]
        raise RuntimeError(
            f"{item.name} failed with exit status {code}; the end of {item.log}:\n{_tail(item.log)}\n"
            f"Fix what it names, then continue the study with:\n  {resume_hint}"
        )


def run_work(spec_path: str | Path) -> None:
    """Do the piece of work a spec (:meth:`Work.save`) describes, in this process: what every process
    of :func:`run_parallel` and every SLURM job of a study (``studies.slurm``) runs."""
    spec = cast(DictConfig, OmegaConf.load(spec_path))
    kind = "evaluate" if spec.kind == "suite" else str(spec.kind)  # "suite": the specs of earlier versions
    if kind not in KINDS:
        raise ValueError(f"{spec_path}: work of kind {spec.kind!r} ({', '.join(KINDS)})")
    do(kind, cast(DictConfig, OmegaConf.load(spec.cfg)), spec)


def do(kind: str, cfg: DictConfig, spec: DictConfig) -> None:
    """A piece of work of ``kind`` (:data:`KINDS`) with ``cfg`` and what its ``spec`` says."""
    if kind == "pretrain":
        result = pretraining.run(cfg, spec.run_dir, choices=dict(spec.choices), resume_hint=spec.resume)
        _after_pretraining(Path(spec.run_dir), spec, result)
    elif kind == "pretrain-group":
        from pretrainlab.pretraining.group import Member, run_together

        members = [
            Member(_as_member(cfg, int(r.seed), r.ckpt_path), Path(r.run_dir), dict(r.choices), spec.resume)
            for r in spec.runs
        ]
        results = run_together(members)
        for member, result in zip(members, results, strict=True):
            _after_pretraining(member.run_dir, spec, result)
    elif kind == "measure":
        measure(cfg, **plain(spec.kwargs))
    elif kind == "evaluate":
        run_suite(cfg, list(spec.tasks), list(spec.seeds), None, plain(spec.task_overrides), resume_hint=spec.resume)
    elif kind == "fuse":
        suites = [suite_config(cfg, Path(encoder), str(init)) for encoder, init in spec.encoders]
        fuse_task(suites, str(spec.task), [int(s) for s in spec.seeds], spec.resume)
    else:
        raise ValueError(f"work of kind {kind!r} ({', '.join(KINDS)})")


def _after_pretraining(run_dir: Path, spec: DictConfig, result: dict) -> None:
    """A pretraining run's held-out checks (``spec.checks``) and the file saying it is done (``spec.done``)."""
    checks = spec.get("checks") or ("intrinsic" if spec.get("intrinsic", True) else "held-out")  # older specs
    if checks != "none":
        (intrinsic_row if checks == "intrinsic" else held_out)(run_dir)
        log.info("held-out checks -> %s", run_dir / "intrinsic.json")
    if spec.get("done"):
        atomic.write_text(run_dir / spec.done, json.dumps({"global_step": result.get("global_step")}))


def _main(spec_path: str) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    run_work(spec_path)


if __name__ == "__main__":
    _main(sys.argv[1])
