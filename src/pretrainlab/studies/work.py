"""A study's work as it stands, every part of it checked before any of it runs (:class:`StudyWork`): its
pretraining runs (done, to run, or to resume from their checkpoints), the evaluation suites of its encoders,
its tasks and seeds. What is already in the study's directory is checked against the study's settings
(a run made with other settings, results of an encoder that is gone), and so is every evaluation's data,
before the first pretraining run starts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from pretrainlab.config import ConfigError, plain
from pretrainlab.evaluation import base as evaluations
from pretrainlab.evaluation.base import resolve
from pretrainlab.evaluation.results import ResultError, is_results_file
from pretrainlab.pretraining import run as pretraining
from pretrainlab.pretraining.record import check_same_run
from pretrainlab.pretraining.snapshots import check_fractions, snapshot_dir
from pretrainlab.runtime.provenance import PRETRAINING_HOW, differences
from pretrainlab.runtime.rundir import LOCK, latest_checkpoint
from pretrainlab.studies.arms import pretraining_config, run_label, run_name, study_arms
from pretrainlab.studies.parallel import Work, suite_work
from pretrainlab.studies.suite import plan_suite, suite_config, task_config

log = logging.getLogger("pretrainlab")


# a study's evaluation suite was once its ``glue`` block: {old key: its name in ``suite``}
OLD_SUITE_KEYS = {"tasks": "glue_tasks", "seeds": "seeds", "overrides": "overrides"}


def settle_suite(cfg: DictConfig) -> DictConfig:
    """The study's evaluation suite in its ``suite`` block. The block's old name, ``glue`` (``glue.tasks``,
    ``glue.seeds``, ``glue.overrides``; in a config file, a command line or the settings of an earlier slot)
    is still read: its values take the place of suite's, with a warning naming the new keys, and the old
    block is dropped. Idempotent; ``cfg`` is changed in place and returned."""
    old = cfg.get("glue")
    if old is None and "suite" in cfg:
        return cfg
    given = {key: old.get(key) for key in OLD_SUITE_KEYS} if old is not None else {}
    given = {key: value for key, value in given.items() if value is not None}
    with open_dict(cfg):
        if "suite" not in cfg or cfg.suite is None:
            cfg.suite = {"glue_tasks": [], "seeds": [0], "overrides": []}
        for key, value in given.items():
            cfg.suite[OLD_SUITE_KEYS[key]] = value
        cfg.pop("glue", None)
    if given:
        log.warning(
            "%s: a study's glue block is now its suite block (the evaluation suite is more than GLUE); read as %s. "
            "The old names will be removed.",
            ", ".join(f"glue.{key}" for key in given),
            ", ".join(f"suite.{OLD_SUITE_KEYS[key]}" for key in given),
        )
    return cfg


def study_tasks(cfg: DictConfig) -> list[str]:
    """The evaluation tasks of the study: every entry of ``evals`` (a group of evaluations, ``glue``
    standing for the tasks of ``suite.glue_tasks``, or a task of ``conf/task/``: ``evaluation.base.resolve``);
    none for ``evals=[]``, a study that pretrains only (no ``evals`` key: GLUE's)."""
    evals = cfg.get("evals")
    return resolve(["glue"] if evals is None else list(evals), list(settle_suite(cfg).suite.glue_tasks))


def check_evaluation_inputs(suite: DictConfig, tasks: list[str]) -> None:
    """Every evaluation's settings and data files, as its runs will read them (synthetic sets generated
    into the cache), before the first pretraining run: a missing or mistyped data folder ends the study
    now, not after hours of pretraining."""
    for name in tasks:
        run_cfg = suite.copy()
        OmegaConf.set_struct(run_cfg, False)
        run_cfg.task = task_config(name, plain(suite.task_overrides))
        task = evaluations.of(run_cfg)
        try:
            task.check()
            files = task.data_files()
            if files is not None and not files:
                where = task.data.data_dir
                raise FileNotFoundError(f"no data file of {name} in {where or 'the folder its config names'}")
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"evaluation {name} of the study (checked before any pretraining): {e} "
                f"(its data folder: data_dirs.{task.data_block} in conf/ablate.yaml or the command line)"
            ) from None


def held_out_checks(cfg: DictConfig) -> str:
    """Which held-out checks a study's pretraining job computes after its run (``studies.parallel``):
    with the NSP/SOP cross-check (``intrinsic=true``, the default) or without."""
    return "intrinsic" if cfg.get("intrinsic", True) else "held-out"


def suite_label(root: Path, encoder: Path, init: str) -> str:
    """A study's name for an encoder's evaluation: roberta-s0, roberta-s0-scratch, roberta-s0-snapshot-0.5."""
    parts = encoder.relative_to(root / "pretrain").parts
    label = parts[0] if len(parts) == 1 else f"{parts[0]}-snapshot-{parts[-1]}"
    return f"{label}-scratch" if init == "scratch" else label


# what a study makes in its directory: its runs, report, logs (Hydra's too), SLURM jobs, merged slots, its lock,
# and in a GPU slot (pretrainlab.slot) the calibration and the budget it planned
STUDY_ENTRIES = ("pretrain", "report", "logs", "slurm", "slots", LOCK, "calibration", "plan.json")


def check_study_dir(root: Path) -> None:
    """``<output_root>/<study>``, before anything is written into it: a new folder, or one a study made
    (nothing in it but what a study makes: :data:`STUDY_ENTRIES`), never a file or a folder of other files."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} is a file: give the study a folder (study=<name> or output_root=<dir>).")
    if not root.is_dir():
        return
    foreign = sorted(p.name for p in root.iterdir() if p.name not in STUDY_ENTRIES)
    if foreign:
        raise ConfigError(
            f"{root} holds files a study did not make ({', '.join(foreign[:5])}): give the study another name "
            f"(study=<name>) or output_root=<dir>, so that nothing there is overwritten."
        )


def study_rows(cfg: DictConfig) -> tuple[Path, dict[str, list[str]], list[float]]:
    """The study's directory, arms and snapshot fractions, checked: every arm's objective one of
    ``conf/objective/``, the baseline one of the rows, every evaluation known."""
    settle_suite(cfg)
    root = Path(cfg.output_root).expanduser() / cfg.study
    check_study_dir(root)
    arms = study_arms(cfg)
    fractions = check_fractions([f for f in cfg.get("snapshots") or [] if float(f) != 1.0])
    baseline = cfg.get("baseline")
    if baseline is not None and baseline not in [*arms, *(["scratch"] if cfg.scratch else [])]:
        raise ConfigError(
            f"baseline={baseline!r} is not a row of this study: name one of {', '.join(arms)}"
            f"{', scratch' if cfg.scratch else ''} (conf/ablate.yaml or the command line)."
        )
    study_tasks(cfg)  # an unknown evaluation is refused before anything runs
    return root, arms, fractions


def pretraining_runs(cfg: DictConfig, root: Path, arms: dict[str, list[str]], fractions: list[float]) -> list[tuple]:
    """(run directory, composed config, choices, done) of every pretraining run of the study; a run
    already there (finished or interrupted) is checked against the config composed now. Two arms that
    compose the same pretraining config are refused, naming both."""
    planned = []
    composed: dict[str, Any] = {}
    for arm in arms:
        for seed in dict.fromkeys(int(s) for s in cfg.seeds):
            run_dir = root / "pretrain" / run_name(arm, seed)
            train_cfg, choices = pretraining_config(cfg, arm, seed, fractions)
            if arm not in composed:
                mine = OmegaConf.to_container(train_cfg, resolve=True)
                same = [a for a, c in composed.items() if not differences(c, mine, ignore=(*PRETRAINING_HOW, "arm"))]
                if same:
                    raise ConfigError(
                        f"arms {same[0]} and {arm} compose the same pretraining run ({' '.join(arms[arm])}): the "
                        f"comparison would test an arm against itself. Give {arm} the override it is meant to change "
                        f"(arms in conf/ablate.yaml or the command line)."
                    )
                composed[arm] = mine
            check_same_run(run_dir, train_cfg)
            done = (run_dir / "encoder" / "config.json").is_file()
            orphans = (
                []
                if done
                else [p for d in evaluations.result_dirs() for p in (run_dir / d).rglob("*.json") if is_results_file(p)]
            )
            if orphans:  # results of an encoder that is gone: the new one's suite would refuse them, later
                raise ResultError(
                    f"{run_dir} holds evaluation results ({orphans[0]}, ...) but no encoder: they are of "
                    f"an encoder that is gone, and would be refused beside the one pretrained now. Move "
                    f"{orphans[0].parents[1]} away (and the run's other glue*/ and eval*/ folders) to "
                    f"pretrain and evaluate again."
                )
            checkpoint = None if done else latest_checkpoint(run_dir)
            if checkpoint is not None:
                train_cfg.ckpt_path = str(checkpoint)
            planned.append((run_dir, train_cfg, choices, done))
    return planned


def _config_file() -> str:
    """The study's config file as the command line named it (``--config-name``), where Hydra ran it."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return f"conf/{HydraConfig.get().job.config_name}.yaml"
    except ValueError:  # composed in a process (a slot, a test), not by a Hydra command
        return "the study's config"


class StudyWork:
    """A study's work as it stands, every part of it checked before any of it runs: the pretraining
    runs (those done, those to run or resume), the evaluation suites' configs, the tasks and seeds."""

    def __init__(self, cfg: DictConfig, root: Path, arms: dict[str, list[str]], fractions: list[float]):
        self.cfg, self.root, self.fractions = cfg, root, fractions
        self.planned = pretraining_runs(cfg, root, arms, fractions)
        self.runs = [run_dir for run_dir, *_ in self.planned]
        self.tasks, self.seeds = study_tasks(cfg), [int(s) for s in cfg.suite.seeds]
        probe = self.suite_cfg(root / "pretrain" / "encoder-to-come", "pretrained")
        for block, path in (cfg.get("data_dirs") or {}).items():
            if path is not None and str((probe.get(block) or {}).get("source")) == "synthetic":
                raise ConfigError(
                    f"data_dirs.{block}={path}, but this study reads {block} from its synthetic set ({block}.source="
                    f"synthetic in the suite.overrides of {_config_file()}): the folder would be ignored. Drop "
                    f"data_dirs.{block}, or add {block}.source=local to suite.overrides to read it."
                )
        check_evaluation_inputs(probe, self.tasks)
        # the finished GLUE results already there are checked before any pretraining or fine-tuning starts
        for encoder, init in self.encoders():
            gcfg = self.suite_cfg(encoder, init)
            plan_suite(gcfg, self.tasks, self.seeds, None, plain(gcfg.task_overrides))
        self.pending = []
        for run_dir, train_cfg, choices, done in self.planned:
            name = run_label(train_cfg)
            if done:
                log.info("pretraining %s: done already (%s)", name, run_dir)
                continue
            if train_cfg.ckpt_path:
                log.info("pretraining %s: resuming from %s", name, train_cfg.ckpt_path)
            self.pending.append((run_dir, train_cfg, choices))
        for run_dir, train_cfg, _ in self.pending:  # every run's settings are checked before the first one starts
            try:
                pretraining.validate(train_cfg)
            except ValueError as e:
                raise ConfigError(f"pretraining run {run_dir.name} of the study: {e}") from None

    def suite_cfg(self, encoder: Path, init: str) -> DictConfig:
        return suite_config(self.cfg, encoder, init)

    def fused_work(self, suites: list[tuple[str, DictConfig]]) -> list[Work]:
        """``fuse_finetuning=true``: for each fusable task (GLUE's) with two or more fine-tunings not done, the
        work that trains them at once, every encoder's (``studies.suite.fuse_task``; a process per task)."""
        if not self.cfg.get("fuse_finetuning", False):
            return []
        fusable = [task.name for task in map(evaluations.get, self.tasks) if task.fusable]
        pending: dict[str, dict[tuple[str, str], int]] = {name: {} for name in fusable}
        for _, g in suites if fusable else []:  # one plan per suite, every fusable task in it
            for job in plan_suite(g, fusable, self.seeds, None, plain(g.task_overrides))[1]:
                if job.done is None:
                    counts = pending[job.cfg.task.name]
                    key = (str(g.pretrained), str(g.init))
                    counts[key] = counts.get(key, 0) + 1
        out = []
        for name, counts in pending.items():
            if sum(counts.values()) >= 2:
                spec = {"task": name, "encoders": [list(key) for key in counts], "seeds": list(self.seeds)}
                out.append(
                    Work(f"fine-tuning {name}, fused", "fuse", self.cfg, spec, self.root / "logs" / f"fuse-{name}.log")
                )
        return out

    def suites(self) -> list[tuple[str, DictConfig]]:
        """The evaluation suite of every encoder there is now (:meth:`encoders`): its label and config."""
        return [
            (suite_label(self.root, encoder, init), self.suite_cfg(encoder, init)) for encoder, init in self.encoders()
        ]

    def finished(self, suite: DictConfig) -> bool:
        """Whether every (task, seed) of an encoder's suite has its result."""
        return all(
            job.done is not None
            for job in plan_suite(suite, self.tasks, self.seeds, None, plain(suite.task_overrides))[1]
        )

    def evaluations_done(self, suites: list[tuple[str, DictConfig]]) -> tuple[int, int]:
        """How many (encoder, task, seed) evaluations of ``suites`` have their result, of how many."""
        jobs = [
            job for _, g in suites for job in plan_suite(g, self.tasks, self.seeds, None, plain(g.task_overrides))[1]
        ]
        return sum(job.done is not None for job in jobs), len(jobs)

    def unfinished(self, suites: list[tuple[str, DictConfig]]) -> list[Work]:
        """The work of each of ``suites`` with a (task, seed) not done yet."""
        return [
            suite_work(label, g, self.tasks, self.seeds, plain(g.task_overrides), self.root / "logs")
            for label, g in suites
            if not self.finished(g)
        ]

    def encoders(self) -> list[tuple[Path, str]]:
        """Every encoder to fine-tune that exists now: final encoders, scratch, snapshots."""
        found = [(r, "pretrained") for r in self.runs if (r / "encoder" / "config.json").is_file()]
        if self.cfg.scratch and found and found[0][0] == self.runs[0]:
            found.append((self.runs[0], "scratch"))
        for run_dir in self.runs:
            for fraction in self.fractions:
                if (snapshot_dir(run_dir, fraction) / "config.json").is_file():
                    found.append((snapshot_dir(run_dir, fraction), "pretrained"))
        return found
