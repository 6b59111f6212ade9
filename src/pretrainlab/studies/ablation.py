"""A whole ablation study from one command: pretrain objectives x seeds, fine-tune every encoder
(and the scratch baseline) on its evaluation suite, compare. Resumable at every level:

    <root>/<study>/pretrain/<objective>-s<seed>/   a pretraining run; skipped once its encoder is
                                                    exported, resumed from its newest checkpoint if
                                                    interrupted
        glue/<task>/seed<k>.json                    fine-tuning results; finished pairs are skipped
        glue-scratch/...                            (first run only) the same architecture from scratch
        snapshots/<fraction>/glue/...               with ``snapshots``: the encoder at that fraction of
                                                    the budget, and its evaluation suite
    <root>/<study>/report/                          comparison.md / .csv / .png / .json; curve.png /
                                                    .csv with snapshots; learning.md (each run's heads
                                                    beside their trivial baselines); learning-curves
                                                    .md / .png (when each head left it); intrinsic.md
                                                    (held-out metrics, the NSP/SOP cross-check);
                                                    cost.md (each run's and evaluation's seconds)

Once pretraining is done, and before any fine-tuning, every run's heads are scored on the held-out
documents beside their trivial baselines (``objectives.learning``): a run still at its baseline is
named in the console then, at the top of comparison.md and in W&B, since comparing it measures
nothing of its objective yet.

Before anything runs, whatever is already there is checked against the study's settings: a
pretraining run made (or started) with other settings (any key of the composed pretraining config
that changes the encoder, the corpus files and the tokenizer included: ``pretraining.record``), and
GLUE results of another encoder, other fine-tuning settings or other data files
(``evaluation.results``), are refused with what differs, instead of being reported as this study's. One
process at a time runs a study: its directory is locked. A signal (SIGTERM, Ctrl-C) stops the study
with a non-zero status and the command that continues it.

Every run of the study shares one W&B group: the study's name.

The study's parts: its arms (``studies.arms``), its work as it stands, checked (``studies.work``), where
that work runs (``studies.launch``: this machine or SLURM, chosen in one place), its report
(``studies.report``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

from omegaconf import DictConfig

from pretrainlab.config import plain
from pretrainlab.pretraining.snapshots import snapshot_dir
from pretrainlab.runtime.rundir import lock, unlock
from pretrainlab.runtime.script import rerun_command
from pretrainlab.runtime.signals import exit_on_signal
from pretrainlab.studies.intrinsic import learning_curves, learning_report
from pretrainlab.studies.launch import Launcher, launcher
from pretrainlab.studies.report import phase_seconds, report_study
from pretrainlab.studies.suite import run_suite
from pretrainlab.studies.work import StudyWork, study_rows

log = logging.getLogger("pretrainlab")


def check_study(cfg: DictConfig) -> None:
    """Every check a study makes before any work (``run_study`` makes them again when it starts):
    its rows, evaluations and their data, the runs and results already in its directory against its
    settings, each pretraining run's settings and its launcher's (``jobs``, SLURM). Writes nothing but
    the evaluations' generated data sets into their cache."""
    root, arms, fractions = study_rows(cfg)
    launcher(cfg, StudyWork(cfg, root, arms, fractions), rerun_command())


def run_study(cfg: DictConfig, timeline: Callable[[str], None] | None = None) -> dict:
    """Run (or continue) the study ``cfg`` describes; returns the comparison table. Every pretraining
    run already there and every finished GLUE result is checked against the study's settings before
    anything runs; a signal stops the study with its command to continue. ``timeline``: told the
    name of each phase as it starts (``pretraining``, ``evaluation``, ``report``) and ``end``."""
    os.environ.setdefault("WANDB_SILENT", "true")  # dozens of runs: W&B speaks only when something fails
    root, arms, fractions = study_rows(cfg)
    resume = rerun_command()
    lock(root, "study")
    try:
        with exit_on_signal(f"the study {cfg.study}", resume):
            study = StudyWork(cfg, root, arms, fractions)
            where = launcher(cfg, study, resume)
            with where.sharing(root / "logs"):
                return _run(study, where, resume, timeline or (lambda phase: None))
    except KeyboardInterrupt:  # its runs' processes got SIGTERM (studies.parallel): each saved its checkpoint
        log.warning(
            "Ctrl-C: the study %s stopped (a run in training saved its checkpoint). Continue it with:\n  %s",
            cfg.study,
            resume,
        )
        raise SystemExit(130) from None
    finally:
        unlock(root)


def _share(done: int, total: int, resumed: bool) -> str:
    """Which part of a phase's work a command does: ``all`` of it, ``none`` (all done already) or a ``part``."""
    if done == total:
        return "none"
    return "all" if done == 0 and not resumed else "part"


def _run(study: StudyWork, where: Launcher, resume: str, timeline: Callable[[str], None]) -> dict:
    """The study's phases, each through its launcher: pretraining, what each run learned, evaluation, report."""
    marks: list[tuple[str, float]] = []

    def mark(phase: str) -> None:  # the study's own wall-clock by phase, for its cost report
        marks.append((phase, time.time()))
        timeline(phase)

    cfg, runs, report = study.cfg, study.runs, study.root / "report"
    # a phase's wall-clock is this command's only where it did all of that phase's work: a command that found
    # it done keeps what the command that did it measured, one that continued it reports none (neither is
    # the phase's duration)
    whole = {
        "pretraining": _share(len(runs) - len(study.pending), len(runs), any(c.ckpt_path for _, c, _ in study.pending))
    }
    mark("pretraining")
    if not where.pretrain(study):
        return {}  # detached: the jobs are on their way, the same command continues

    # what each run learned, before any fine-tuning: a run still at its trivial baseline is named now
    learned = learning_report(runs, report)
    learning_curves(runs, report)
    for run_dir in runs:
        for fraction in study.fractions:
            if not (snapshot_dir(run_dir, fraction) / "config.json").is_file():
                log.warning(
                    "%s has no snapshot at %g of its budget (it was pretrained without snapshots=%s): that "
                    "point of the curve is left out",
                    run_dir,
                    fraction,
                    list(study.fractions),
                )
    if study.tasks:  # none with evals=[]: a study of pretraining only, whose report is what each run learned
        mark("evaluation")
        suites = study.suites()
        whole["evaluation"] = _share(*study.evaluations_done(suites), False)
        where.fuse(study, study.fused_work(suites))  # fuse_finetuning: each GLUE task's runs at once
        where.evaluate(study, study.unfinished(suites))
        for _, gcfg in suites:  # in this process: what is left (all of it with jobs=1), and every summary
            run_suite(gcfg, study.tasks, study.seeds, None, plain(gcfg.task_overrides), resume_hint=resume)

    mark("report")
    earlier = report / "cost.json"  # what the command that did a phase measured of it
    before = (json.loads(earlier.read_text()) if earlier.is_file() else {}).get("wall_s") or {}
    measured = phase_seconds(marks)
    wall = {
        p: measured[p] if share == "all" else before[p]
        for p, share in whole.items()
        if share == "all" or (share == "none" and p in before)
    }
    table = report_study(cfg, runs, report, study.tasks, study.seeds, study.fractions, learned, wall_s=wall)
    mark("end")
    return table
