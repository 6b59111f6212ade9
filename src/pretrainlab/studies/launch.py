"""Where a study's work runs, chosen in one place (:func:`launcher`, from the study's ``launcher``): this
machine (:class:`Local`: one run at a time in the study's process, or ``jobs`` processes at once) or a
SLURM cluster (:class:`Slurm`: a job per pretraining run and per encoder's evaluation suite). The study
runs each of its phases through it once: :meth:`Launcher.pretrain` the runs not done yet, then
:meth:`Launcher.evaluate` the encoders' suites not finished (pieces of work of one vocabulary,
``studies.parallel.KINDS``, whichever launcher runs them). Each launcher checks its own settings (``jobs``,
CUDA's MPS, the SLURM resources and cluster) when it is chosen, before any work.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig

from pretrainlab.config import ConfigError, plain
from pretrainlab.pretraining.snapshots import snapshot_dir
from pretrainlab.runtime import mps
from pretrainlab.runtime.settings import uses_cuda
from pretrainlab.runtime.signals import TimeUp, deadline
from pretrainlab.studies.parallel import (
    Work,
    check_jobs,
    pretraining_groups,
    pretraining_work,
    run_parallel,
    suite_work,
)
from pretrainlab.studies.slurm import Planned, SlurmError, SlurmStudy, check_cluster, run_slurm
from pretrainlab.studies.slurm import resources as slurm_resources
from pretrainlab.studies.work import StudyWork, held_out_checks, suite_label

log = logging.getLogger("pretrainlab")

LAUNCHERS = ("local", "slurm")  # where a study's runs run: this machine, or one SLURM job each (studies.slurm)


class Launcher:
    """Runs a study's phases; ``jobs``: how many of its pieces of work run at once on this machine."""

    jobs = 1

    def pretrain(self, study: StudyWork) -> bool:
        """Pretrain the study's runs not done yet; False when they go on elsewhere (a detached SLURM study:
        the same command continues it)."""
        raise NotImplementedError

    def evaluate(self, study: StudyWork, suites: list[Work]) -> None:
        """Run the evaluation suites not finished yet (the study's own process then collects every
        suite's results: ``run_suite`` does what is left, and writes each summary)."""
        raise NotImplementedError

    def fuse(self, study: StudyWork, work: list[Work]) -> None:
        """Train each GLUE task's fine-tunings of every encoder at once (``fuse_finetuning``), before the
        suites; by default nothing (each encoder's suite still fuses its own seeds)."""

    def sharing(self, logs: Path) -> contextlib.AbstractContextManager:
        """What the launcher holds while the study runs (CUDA's MPS for processes sharing one GPU)."""
        return contextlib.nullcontext()


class Local(Launcher):
    """This machine: one piece of work at a time in the study's own process, or ``jobs`` processes at
    once (``studies.parallel``), each pretraining process computing its run's held-out checks."""

    def __init__(self, cfg: DictConfig, study: StudyWork, resume: str):
        self.cfg, self.resume = cfg, resume
        self.jobs = check_jobs(cfg.get("jobs", 1), [c for _, c, _ in study.pending])
        # processes sharing one CUDA GPU (jobs > 1): CUDA's MPS lets their kernels run at once
        self.mps = cfg.get("mps", "auto")
        self.cuda = any(uses_cuda(c) for _, c, _, _ in study.planned)
        mps.check(self.mps, self.jobs, self.cuda)

    @contextlib.contextmanager
    def sharing(self, logs: Path) -> Iterator[None]:
        with mps.shared(self.mps, self.jobs, self.cuda, logs) as daemon:
            if self.jobs > 1:
                log.info("the study's processes share the GPU: %s", daemon.status)
            yield

    def pretrain(self, study: StudyWork) -> bool:
        logs = study.root / "logs"
        minutes = self.cfg.get("minutes")
        # as processes: several at once, or under a time limit (each stopped at the time saves its checkpoint)
        fuse = bool(self.cfg.get("fuse_pretraining", False))
        if study.pending and (minutes or (self.jobs > 1 and len(study.pending) > 1)):
            checks = held_out_checks(self.cfg)
            work = (
                pretraining_groups(study.pending, logs, checks)
                if fuse
                else [pretraining_work(r, c, ch, logs / f"pretrain-{r.name}.log", checks) for r, c, ch in study.pending]
            )
            started = time.time()
            limit = (
                deadline(started + 60 * float(minutes), lambda: f"minutes={float(minutes):g} ran out")
                if minutes
                else contextlib.nullcontext()
            )
            mine = None
            try:
                with limit as mine:
                    run_parallel(work, self.jobs, self.resume)
            except TimeUp as e:
                if mine is None or e.limit is not mine:
                    raise  # an enclosing command's time (a GPU slot's): it stops the whole study
                log.warning(
                    "%s after %.0f s: the pretraining runs were stopped (each saved its checkpoint); the report is "
                    "what they validated, and the same command continues them",
                    e,
                    time.time() - started,
                )
        else:  # in this process; the report computes the held-out checks
            for item in (
                pretraining_groups(study.pending, logs, "none")
                if fuse
                else [pretraining_work(r, c, ch, logs / f"pretrain-{r.name}.log", "none") for r, c, ch in study.pending]
            ):
                item.run(self.resume)
        return True

    def fuse(self, study: StudyWork, work: list[Work]) -> None:
        """A fused group that fails (a bug, a device's error) costs only its speed: the log says so, with
        its error, and each encoder's suite then fine-tunes what it did not finish (a signal or the time
        running out stops the study as ever)."""
        if not work:
            return
        try:
            if self.jobs > 1:
                run_parallel(work, self.jobs, self.resume)
            else:
                for item in work:
                    item.run(self.resume)
        except Exception as error:  # noqa: BLE001 - any failure of the speed-up: the runs are done alone
            log.warning(
                "fused fine-tuning failed (%s: %s); each encoder's suite fine-tunes what it did not finish",
                type(error).__name__,
                error,
                exc_info=True,
            )

    def evaluate(self, study: StudyWork, suites: list[Work]) -> None:
        if self.jobs > 1 and len(suites) > 1:
            run_parallel(suites, self.jobs, self.resume)
        # one at a time: the study's process fine-tunes them as it collects their results


class Slurm(Launcher):
    """A SLURM cluster: every pretraining run not done a job, every encoder's suite not finished a job
    after its encoder's, all submitted (and, unless ``detach``, followed) in the pretraining phase."""

    def __init__(self, cfg: DictConfig, resume: str):
        for kind in ("pretrain", "evaluate"):  # every job's resources, then the cluster, before any work
            slurm_resources(cfg, kind)
        check_cluster()
        self.cfg, self.resume = cfg, resume

    def pretrain(self, study: StudyWork) -> bool:
        if self.cfg.get("fuse_pretraining", False):
            log.info("fuse_pretraining=true is for launcher=local: on SLURM each pretraining run is a job of its own")
        jobs = SlurmStudy(self.cfg, study.root, self.resume, say=log.info)
        return run_slurm(jobs, slurm_jobs(study), bool(self.cfg.get("detach", False)))

    def evaluate(self, study: StudyWork, suites: list[Work]) -> None:
        if suites:  # each was a job of the pretraining phase, and all of them have ended
            raise SlurmError(
                f"{suites[0].name}: its results are unfinished although its SLURM job ended: see "
                f"{study.root / 'slurm'}; continue the study with:\n  {self.resume}"
            )


def launcher(cfg: DictConfig, study: StudyWork, resume: str) -> Launcher:
    """The study's launcher (``launcher`` in conf/ablate.yaml), its settings checked."""
    name = str(cfg.get("launcher", "local"))
    if name not in LAUNCHERS:
        raise ConfigError(f"launcher={name}: choose one of {', '.join(LAUNCHERS)} (conf/ablate.yaml).")
    minutes = cfg.get("minutes")
    if minutes is not None:
        try:
            given = float(minutes)
        except (TypeError, ValueError):
            given = float("nan")
        if not (given > 0 and given != float("inf")):
            raise ConfigError(f"minutes={minutes}: give a positive, finite number of minutes (or minutes=null).")
        if study.tasks or name != "local":
            raise ConfigError(
                f"minutes={minutes} stops a study of pretraining only on this machine and reports what its runs "
                f"validated: set evals=[] and launcher=local, or minutes=null (runs stopped early are no encoders "
                f"to evaluate)."
            )
    return Slurm(cfg, resume) if name == "slurm" else Local(cfg, study, resume)


def slurm_jobs(study: StudyWork) -> list[Planned]:
    """The study's SLURM jobs: each pretraining run not done yet (resuming from its checkpoint when
    the job starts, or starts again after a requeue: ``ckpt_path=auto``), then each encoder's
    evaluation suite not finished yet (the final encoder, its snapshots, the scratch baseline of the
    first run), after its pretraining job."""
    cfg, root = study.cfg, study.root
    checks = held_out_checks(cfg)
    pending = {run_dir for run_dir, _, _ in study.pending}
    planned: list[Planned] = []
    for i, (run_dir, train_cfg, choices, _) in enumerate(study.planned):
        name = f"pretrain-{run_dir.name}"
        if run_dir in pending:
            work_cfg = train_cfg.copy()
            work_cfg.ckpt_path = "auto"
            log_path = root / "logs" / f"{name}.log"
            planned.append(Planned(name, pretraining_work(run_dir, work_cfg, choices, log_path, checks)))
        encoders = [(run_dir, "pretrained"), *((snapshot_dir(run_dir, f), "pretrained") for f in study.fractions)]
        if cfg.scratch and i == 0:
            encoders.append((run_dir, "scratch"))
        if not study.tasks:  # a study of pretraining only (evals=[])
            encoders = []
        for encoder, init in encoders:
            gcfg = study.suite_cfg(encoder, init)
            overrides = plain(gcfg.task_overrides)
            exists = (encoder / "config.json").is_file() or (encoder / "encoder" / "config.json").is_file()
            if exists and study.finished(gcfg):
                continue
            label = suite_label(root, encoder, init)
            work = suite_work(label, gcfg, study.tasks, study.seeds, overrides, root / "logs")
            planned.append(Planned(f"evaluate-{label}", work, name if run_dir in pending else None))
    return planned
