"""A whole ablation study from one command: pretrain objectives x seeds, fine-tune every encoder
(and the scratch baseline) on a GLUE suite, compare. Resumable at every level:

    <root>/<study>/pretrain/<objective>-s<seed>/   a pretraining run; skipped once its encoder is
                                                    exported, resumed from its newest checkpoint if
                                                    interrupted
        glue/<task>/seed<k>.json                    fine-tuning results; finished pairs are skipped
        glue-scratch/...                            (first run only) the same architecture from scratch
        snapshots/<fraction>/glue/...               with ``snapshots``: the encoder at that fraction of
                                                    the budget, and its GLUE suite
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
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic
from pretrainlab.compare import collect, is_final, to_markdown, write_report
from pretrainlab.config import ConfigError, plain
from pretrainlab.evaluation import base as evaluations
from pretrainlab.evaluation.base import resolve
from pretrainlab.evaluation.results import ResultError, is_results_file
from pretrainlab.pretraining import run as pretraining
from pretrainlab.pretraining.record import check_same_run
from pretrainlab.pretraining.snapshots import check_fractions, snapshot_dir
from pretrainlab.runtime import mps, wandb_runs
from pretrainlab.runtime.hydra import compose, options
from pretrainlab.runtime.provenance import PRETRAINING_HOW, differences, report_provenance
from pretrainlab.runtime.rundir import latest_checkpoint, lock, unlock
from pretrainlab.runtime.script import rerun_command
from pretrainlab.runtime.settings import uses_cuda
from pretrainlab.runtime.signals import exit_on_signal
from pretrainlab.studies.cost import cost_report
from pretrainlab.studies.intrinsic import (
    at_baseline,
    intrinsic_markdown,
    intrinsic_report,
    learning_curves,
    learning_preface,
    learning_report,
)
from pretrainlab.studies.parallel import check_jobs, pretraining_work, run_parallel, suite_work
from pretrainlab.studies.slurm import Planned, SlurmError, SlurmStudy, check_cluster, run_slurm
from pretrainlab.studies.slurm import resources as slurm_resources
from pretrainlab.studies.suite import plan_suite, run_suite, task_config

log = logging.getLogger("pretrainlab")

LAUNCHERS = ("local", "slurm")  # where a study's runs run: this machine, or one SLURM job each (studies.slurm)


def study_tasks(cfg: DictConfig) -> list[str]:
    """The evaluation tasks of the study: every entry of ``evals`` (a group of evaluations, ``glue``
    standing for the tasks of ``glue.tasks``, or a task of ``conf/task/``: ``evaluation.base.resolve``)."""
    return resolve(list(cfg.get("evals") or ["glue"]), list(cfg.glue.tasks))


def check_evaluation_inputs(suite: DictConfig, tasks: list[str]) -> None:
    """Every evaluation's settings and data files, as its runs will read them (synthetic sets generated
    into the cache), before the first pretraining run: a missing or mistyped data folder ends the study
    now, not after hours of pretraining."""
    from omegaconf import OmegaConf

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


def _set_group(cfg: DictConfig, group: str) -> None:
    if cfg.get("logger") and "group" in cfg.logger:
        cfg.logger.group = group


ARM_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")
MAX_ARM_NAME = 64  # a W&B tag's length


def study_arms(cfg: DictConfig) -> dict[str, list[str]]:
    """The study's rows: each arm's name and the pretraining overrides that make it, its
    ``objective=<name>`` first. ``arms`` lists them (``{bert-nsp0: [objective=bert,
    objective.pair_weight=0]}``); without it, ``objectives`` is the shorthand for one arm per objective,
    named after it. Refused, naming the cause: an objective that is not one of ``conf/objective/``, an
    arm whose name is not one safe folder name (or is ``scratch``), whose overrides are not a list of
    ``key=value`` strings or that does not name its objective exactly once."""
    known = options("objective")
    arms = cfg.get("arms")
    written = OmegaConf.to_container(cfg, resolve=False)  # the keys as written (their values may interpolate)
    assert isinstance(written, dict)
    check_not_owned(list(written.get("pretrain") or []), "pretrain", every_run=True)
    for objective, overrides in (written.get("objective_overrides") or {}).items():
        check_not_owned(list(overrides), f"objective_overrides.{objective}")
    if arms is not None and len(arms) == 0:
        raise ConfigError(
            "arms={} names no arm: give the arms ({name: [objective=..., ...]}), or leave arms out for one row per "
            "objective (objectives)."
        )
    if arms is None:
        objectives = list(dict.fromkeys(known if cfg.objectives == "all" else cfg.objectives))
        unknown = [str(o) for o in objectives if o not in known]
        if unknown:
            raise ConfigError(
                f"objectives: {', '.join(unknown)} {'is not an objective' if len(unknown) == 1 else 'are not objectives'}"
                f" of conf/objective/ ({', '.join(known)}); or objectives=all (conf/ablate.yaml or the command line)."
            )
        return {o: [f"objective={o}"] for o in objectives}
    if not isinstance(arms, DictConfig | dict):
        raise ConfigError(
            "arms: a mapping of each arm's name to its pretraining overrides, e.g. "
            "{bert: [objective=bert], bert-nsp0: [objective=bert, objective.pair_weight=0]}."
        )
    out: dict[str, list[str]] = {}
    for name, overrides in arms.items():
        name = str(name)
        if not ARM_NAME.fullmatch(name) or ".." in name or name == "scratch" or len(name) > MAX_ARM_NAME:
            raise ConfigError(
                f"arms: {name!r} cannot name an arm: its runs are folders <arm>-s<seed> and W&B runs tagged with it, "
                f"so a name is 1 to {MAX_ARM_NAME} letters, digits, '-', '_' or '.', starting with a letter or digit "
                f"(and not 'scratch', the baseline's row)."
            )
        items = list(overrides) if isinstance(overrides, list | tuple) or OmegaConf.is_list(overrides) else None
        if items is None or not all(isinstance(o, str) and "=" in o for o in items):
            raise ConfigError(
                f"arms.{name}: a list of train.py overrides (key=value), e.g. [objective=bert], got {overrides!r}."
            )
        objective = [o.split("=", 1)[1] for o in items if o.split("=", 1)[0] == "objective"]
        if len(objective) != 1:
            raise ConfigError(
                f"arms.{name}: name the arm's objective once (objective=<one of {', '.join(known)}>); "
                f"it names {len(objective)}."
            )
        if objective[0] not in known:
            raise ConfigError(
                f"arms.{name}: objective={objective[0]} is not one of conf/objective/ ({', '.join(known)})."
            )
        check_not_owned(items, f"arms.{name}")
        out[name] = [f"objective={objective[0]}", *(o for o in items if o.split("=", 1)[0] != "objective")]
    return out


# what the study decides for every run, and an override of a run must not: which seed (the run's folder
# and row name it), how long (budget_flops), where its files go
OWNED = {
    "seed": "the study's seeds (seeds=[...]) name and seed every run",
    "budget": "the study's budget (budget_flops) is every run's",
    "max_steps": "the study's budget (budget_flops) decides every run's length",
    "ckpt_path": "the study resumes its own runs",
    "overwrite": "the study never overwrites a run",
    "hydra": "the study decides where every run's files go",
    "arm": "the study names every run's row after its arm",
}


def check_not_owned(overrides: list[str], where: str, every_run: bool = False) -> None:
    """Refuse, in an arm's or an objective's overrides, a setting the study owns (:data:`OWNED`); in
    those of every run (``pretrain``, where the study's own config sets its length), the seed and the places."""
    for override in overrides:
        key = str(override).split("=", 1)[0].lstrip("+~")
        owner = OWNED.get(key.split(".", 1)[0])
        if owner is not None and not (every_run and key.split(".", 1)[0] in ("budget", "max_steps")):
            raise ConfigError(
                f"{where}: {override!r} sets {key}, which the study owns: {owner}. Drop it from {where}"
                + (" (seeds=[...] gives the study several seeds)." if key == "seed" else ".")
            )


def check_arm_names(overrides: list[str]) -> None:
    """Refuse an ``arms={...}`` command-line override that names one arm twice: Hydra's grammar keeps
    the last of them without a word (a config file's YAML refuses a repeated key itself); and rows given
    twice, ``objectives=`` beside ``arms=`` or ``+ablation=`` (the arms would be the rows, and the
    objectives left out without a word)."""
    keys = {o.partition("=")[0].lstrip("+~") for o in overrides}
    if "objectives" in keys and keys & {"arms", "ablation"}:
        arms = next(o for o in overrides if o.partition("=")[0].lstrip("+~") in ("arms", "ablation"))
        raise ConfigError(
            f"objectives=... and {arms.split('=', 1)[0]}=... both name the study's rows: the arms would be the rows "
            f"and objectives would be ignored. Give one of them (an arm names its objective: [objective=bert, ...])."
        )
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") != "arms" or not value.strip().startswith("{"):
            continue
        names, depth, quote, start = [], 0, "", 0
        for i, c in enumerate(value):
            if quote:
                quote = "" if c == quote else quote
            elif c in "\"'":
                quote = c
            elif c in "{[":
                depth += 1
                start = i + 1 if depth == 1 else start
            elif c in "}]":
                depth -= 1
            elif c == "," and depth == 1:
                start = i + 1
            elif c == ":" and depth == 1 and start >= 0:
                names.append(value[start:i].strip().strip("\"'"))
                start = -1
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"arms: {', '.join(twice)} named twice in {override!r}: give each arm one name.")


def arm_objective(overrides: list[str]) -> str:
    """The objective an arm's overrides (``study_arms``) pretrain."""
    return overrides[0].split("=", 1)[1]


def _rows(cfg: DictConfig) -> tuple[Path, dict[str, list[str]], list[float]]:
    """The study's directory, arms and snapshot fractions, checked: every arm's objective one of
    ``conf/objective/``, the baseline one of the rows, every evaluation known."""
    root = Path(cfg.output_root).expanduser() / cfg.study
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


def check_study(cfg: DictConfig) -> None:
    """Every check a study makes before any work (``run_study`` makes them again when it starts):
    its rows, evaluations and their data, the runs and results already in its directory against its
    settings, each pretraining run's settings and ``jobs``. Writes nothing but the evaluations'
    generated data sets into their cache."""
    root, arms, fractions = _rows(cfg)
    _Prepared(cfg, root, arms, fractions)


def run_study(cfg: DictConfig, timeline: Callable[[str], None] | None = None) -> dict:
    """Run (or continue) the study ``cfg`` describes; returns the comparison table. Every pretraining
    run already there and every finished GLUE result is checked against the study's settings before
    anything runs; a signal stops the study with its command to continue. ``timeline``: told the
    name of each phase as it starts (``pretraining``, ``evaluation``, ``report``) and ``end``."""
    os.environ.setdefault("WANDB_SILENT", "true")  # dozens of runs: W&B speaks only when something fails
    root, arms, fractions = _rows(cfg)
    resume = rerun_command()
    lock(root, "study")
    try:
        with exit_on_signal(f"the study {cfg.study}", resume):
            return _run_study(cfg, root, arms, fractions, resume, timeline or (lambda phase: None))
    finally:
        unlock(root)


def arm_overrides(cfg: DictConfig, arm: str) -> list[str]:
    """What makes ``arm`` differ from the study's other arms: its ``objective=<name>``, that objective's
    ``objective_overrides`` (the recipe every run of it shares), then the arm's own (which win)."""
    own = study_arms(cfg)[arm]
    return [own[0], *(cfg.get("objective_overrides") or {}).get(arm_objective(own), []), *own[1:]]


def pretraining_config(
    cfg: DictConfig, arm: str, seed: int, fractions: list[float] | None = None
) -> tuple[DictConfig, dict[str, str]]:
    """The composed config (and group choices) of the study's pretraining run of ``arm`` and ``seed``:
    the arm's objective, the seed, ``pretrain``'s overrides, the rest of ``arm_overrides``, the arm's
    name when it is not its objective's (recorded in the encoder's export: its row in every
    comparison), snapshots."""
    own = arm_overrides(cfg, arm)
    objective = arm_objective(own)
    named = [f"arm={arm}"] if arm != objective else []
    overrides = [own[0], f"seed={seed}", *cfg.pretrain, *own[1:], *named]
    if fractions:
        overrides.append(f"snapshots=[{','.join(f'{f:g}' for f in fractions)}]")
    train_cfg, choices = compose("train", overrides)
    _set_group(train_cfg, cfg.study)
    logger = train_cfg.get("logger")
    if arm != objective and logger and "name" in logger and "tags" in logger:  # W&B: the run by its arm, tagged
        logger.name = f"{arm}-s{seed}"
        logger.tags = [*(logger.get("tags") or []), arm]
    train_cfg.export = True
    return train_cfg, choices


def arm_changes(cfg: DictConfig, arms: list[str], against: str) -> dict[str, list[tuple[str, Any, Any]]]:
    """What each of ``arms`` changes beside the arm ``against``: (dotted key, its value there, the
    arm's) of every setting of their pretraining configs that differs. Composed from what differs
    between arms (the objective, its ``objective_overrides``, the arm's own), without the study's
    ``pretrain`` overrides every arm shares, so that a study merged from slots (whose record keeps no
    paths) says it too. An arm of another objective changes ``objective`` (the two names), and its
    objective's settings are given beside that objective's defaults (``conf/objective/<name>.yaml``),
    since the two objectives' settings are not the same keys."""

    def composed(overrides: list[str]) -> Any:
        return OmegaConf.to_container(compose("train", overrides)[0], resolve=True)

    base = composed(arm_overrides(cfg, against))
    changes = {}
    for arm in arms:
        if arm == against:
            continue
        overrides = arm_overrides(cfg, arm)
        mine = composed(overrides)
        changed = differences(base, mine, ignore=PRETRAINING_HOW)
        if mine["objective"]["name"] != base["objective"]["name"]:
            defaults = composed(overrides[:1])["objective"]
            changed = [
                ("objective", base["objective"]["name"], mine["objective"]["name"]),
                *(c for c in changed if not c[0].startswith("objective.")),
                *differences(defaults, mine["objective"], prefix="objective", ignore=PRETRAINING_HOW),
            ]
        changes[arm] = changed
    return changes


def _pretraining_runs(cfg: DictConfig, root: Path, arms: dict[str, list[str]], fractions: list[float]) -> list[tuple]:
    """(run directory, composed config, choices, done) of every pretraining run of the study; a run
    already there (finished or interrupted) is checked against the config composed now. Two arms that
    compose the same pretraining config are refused, naming both."""
    planned = []
    composed: dict[str, Any] = {}
    for arm in arms:
        for seed in dict.fromkeys(int(s) for s in cfg.seeds):
            run_dir = root / "pretrain" / f"{arm}-s{seed}"
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


class _Prepared:
    """A study's work as it stands, every part of it checked before any of it runs: the pretraining
    runs (those done, those to run or resume), the evaluation suites' configs, the tasks and seeds."""

    def __init__(self, cfg: DictConfig, root: Path, arms: dict[str, list[str]], fractions: list[float]):
        self.cfg, self.root, self.fractions = cfg, root, fractions
        self.planned = _pretraining_runs(cfg, root, arms, fractions)
        self.runs = [run_dir for run_dir, *_ in self.planned]
        self.glue_overrides = [
            *cfg.glue.overrides,
            *(f'{block}.data_dir="{path}"' for block, path in (cfg.get("data_dirs") or {}).items() if path is not None),
        ]
        self.tasks, self.seeds = study_tasks(cfg), [int(s) for s in cfg.glue.seeds]
        probe = self.suite_cfg(root / "pretrain" / "encoder-to-come", "pretrained")
        for block, path in (cfg.get("data_dirs") or {}).items():
            if path is not None and str((probe.get(block) or {}).get("source")) == "synthetic":
                raise ConfigError(
                    f"data_dirs.{block}={path}, but this study reads {block} from its synthetic set ({block}.source="
                    f"synthetic in the glue.overrides of {_config_file()}): the folder would be ignored. Drop "
                    f"data_dirs.{block}, or add {block}.source=local to glue.overrides to read it."
                )
        check_evaluation_inputs(probe, self.tasks)
        # the finished GLUE results already there are checked before any pretraining or fine-tuning starts
        for encoder, init in self.encoders():
            gcfg = self.suite_cfg(encoder, init)
            plan_suite(gcfg, self.tasks, self.seeds, None, plain(gcfg.task_overrides))
        self.pending = []
        for run_dir, train_cfg, choices, done in self.planned:
            name = f"{train_cfg.objective.name} seed {train_cfg.seed}"
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
        self.launcher = str(cfg.get("launcher", "local"))
        if self.launcher not in LAUNCHERS:
            raise ConfigError(f"launcher={self.launcher}: choose one of {', '.join(LAUNCHERS)} (conf/ablate.yaml).")
        if self.launcher == "slurm":  # every job's resources, then the cluster, before any work
            for kind in ("pretrain", "evaluate"):
                slurm_resources(cfg, kind)
            check_cluster()
        self.jobs = check_jobs(cfg.get("jobs", 1), [c for _, c, _ in self.pending]) if self.launcher == "local" else 1
        # processes sharing one CUDA GPU (jobs > 1): CUDA's MPS lets their kernels run at once
        self.mps = cfg.get("mps", "auto")
        self.cuda = any(uses_cuda(c) for _, c, _, _ in self.planned)
        mps.check(self.mps, self.jobs, self.cuda)

    def suite_cfg(self, encoder: Path, init: str) -> DictConfig:
        gcfg, _ = compose("glue", [f"pretrained={encoder}", f"init={init}", *self.glue_overrides])
        _set_group(gcfg, self.cfg.study)
        return gcfg

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


def slurm_jobs(prepared: _Prepared) -> list[Planned]:
    """The study's SLURM jobs: each pretraining run not done yet (resuming from its checkpoint when
    the job starts, or starts again after a requeue: ``ckpt_path=auto``), then each encoder's
    evaluation suite not finished yet (the final encoder, its snapshots, the scratch baseline of the
    first run), after its pretraining job."""
    cfg, root = prepared.cfg, prepared.root
    checks = held_out_checks(cfg)
    pending = {run_dir for run_dir, _, _ in prepared.pending}
    planned: list[Planned] = []
    for i, (run_dir, train_cfg, choices, _) in enumerate(prepared.planned):
        name = f"pretrain-{run_dir.name}"
        if run_dir in pending:
            work_cfg = train_cfg.copy()
            work_cfg.ckpt_path = "auto"
            log_path = root / "logs" / f"{name}.log"
            planned.append(Planned(name, pretraining_work(run_dir, work_cfg, choices, log_path, checks)))
        encoders = [(run_dir, "pretrained"), *((snapshot_dir(run_dir, f), "pretrained") for f in prepared.fractions)]
        if cfg.scratch and i == 0:
            encoders.append((run_dir, "scratch"))
        if not prepared.tasks:  # a study of pretraining only (evals=[])
            encoders = []
        for encoder, init in encoders:
            gcfg = prepared.suite_cfg(encoder, init)
            overrides = plain(gcfg.task_overrides)
            if (encoder / "config.json").is_file() or (encoder / "encoder" / "config.json").is_file():
                if all(
                    job.done is not None for job in plan_suite(gcfg, prepared.tasks, prepared.seeds, None, overrides)[1]
                ):
                    continue
            label = suite_label(root, encoder, init)
            work = suite_work(label, gcfg, prepared.tasks, prepared.seeds, overrides, root / "logs")
            planned.append(Planned(f"evaluate-{label}", work, name if run_dir in pending else None))
    return planned


def _run_study(
    cfg: DictConfig,
    root: Path,
    arms: dict[str, list[str]],
    fractions: list[float],
    resume: str,
    timeline: Callable[[str], None],
) -> dict:
    prepared = _Prepared(cfg, root, arms, fractions)
    marks: list[tuple[str, float]] = []

    def mark(phase: str) -> None:  # the study's own wall-clock by phase, for its cost report
        marks.append((phase, time.time()))
        timeline(phase)

    with mps.shared(prepared.mps, prepared.jobs, prepared.cuda, root / "logs") as daemon:
        if prepared.jobs > 1 and prepared.launcher == "local":
            log.info("the study's processes share the GPU: %s", daemon.status)
        return _run_prepared(prepared, cfg, root, fractions, resume, mark, marks)


def phase_seconds(marks: list[tuple[str, float]]) -> dict[str, float]:
    """Each phase's wall-clock seconds, from the times its start and the next phase's were marked."""
    return {phase: round(end - start, 1) for (phase, start), (_, end) in zip(marks, marks[1:], strict=False)}


def _run_prepared(
    prepared: _Prepared,
    cfg: DictConfig,
    root: Path,
    fractions: list[float],
    resume: str,
    timeline: Callable[[str], None],
    marks: list[tuple[str, float]],
) -> dict:
    runs, pending, jobs, tasks, seeds = prepared.runs, prepared.pending, prepared.jobs, prepared.tasks, prepared.seeds
    suite_cfg, encoders = prepared.suite_cfg, prepared.encoders
    timeline("pretraining")
    on_slurm = prepared.launcher == "slurm"
    if on_slurm:
        study = SlurmStudy(cfg, root, resume, say=log.info)
        if not run_slurm(study, slurm_jobs(prepared), bool(cfg.get("detach", False))):
            return {}  # detached: the jobs are on their way, the same command continues
        pending = []
    elif jobs > 1 and len(pending) > 1:
        checks = held_out_checks(cfg)
        logs = root / "logs"
        work = [pretraining_work(r, c, ch, logs / f"pretrain-{r.name}.log", checks) for r, c, ch in pending]
        run_parallel(work, jobs, resume)
    else:
        for run_dir, train_cfg, choices in pending:
            pretraining.run(train_cfg, run_dir, choices=choices, resume_hint=resume)

    # what each run learned, before any fine-tuning: a run still at its trivial baseline is named now
    report = root / "report"
    learned = learning_report(runs, report)
    learning_curves(runs, report)
    for run_dir in runs:
        for fraction in fractions:
            if not (snapshot_dir(run_dir, fraction) / "config.json").is_file():
                log.warning(
                    "%s has no snapshot at %g of its budget (it was pretrained without snapshots=%s): that "
                    "point of the curve is left out",
                    run_dir,
                    fraction,
                    list(fractions),
                )
    timeline("evaluation")
    suites = [(encoder, init, suite_cfg(encoder, init)) for encoder, init in encoders()]
    unfinished = [
        (encoder, init, gcfg)
        for encoder, init, gcfg in suites
        if any(job.done is None for job in plan_suite(gcfg, tasks, seeds, None, plain(gcfg.task_overrides))[1])
    ]
    if on_slurm and unfinished:
        label = suite_label(root, unfinished[0][0], unfinished[0][1])
        raise SlurmError(
            f"the evaluation of {label} has unfinished results although its SLURM job ended: see {root / 'slurm'}; "
            f"continue the study with:\n  {resume}"
        )
    if jobs > 1 and len(unfinished) > 1:
        work = [
            suite_work(suite_label(root, encoder, init), g, tasks, seeds, plain(g.task_overrides), root / "logs")
            for encoder, init, g in unfinished
        ]
        run_parallel(work, jobs, resume)
    for _, _, gcfg in suites:  # in this process: what is left (all of it with jobs=1), and every summary
        run_suite(gcfg, tasks, seeds, None, plain(gcfg.task_overrides), resume_hint=resume)

    timeline("report")
    wall = {p: s for p, s in phase_seconds(marks).items() if p in ("pretraining", "evaluation")}
    table = report_study(cfg, runs, report, tasks, seeds, fractions, learned, wall_s=wall)
    timeline("end")
    return table


def arms_preface(cfg: DictConfig) -> str:
    """comparison.md's opening for a study of arms: what each arm changes beside the baseline arm (the
    settings of their pretraining runs that differ), or each arm's overrides when the baseline is not
    an arm."""
    arms = study_arms(cfg)
    baseline = cfg.get("baseline")
    if baseline in arms:
        lines = [
            f"Arms: what each changes beside {baseline} (its pretraining settings that differ, {baseline}'s then the "
            f"arm's; an arm of another objective: its objective's settings beside that objective's defaults):"
        ]
        for arm, changed in arm_changes(cfg, list(arms), baseline).items():
            shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed) or "nothing"
            lines.append(f"- **{arm}**: {shown}")
    else:
        lines = ["Arms: each arm's pretraining overrides beside the study's own:"]
        lines += [f"- **{arm}**: {' '.join(o)}" for arm, o in arms.items()]
    return "\n".join(lines)


def report_study(
    cfg: DictConfig,
    runs: list[Path],
    report: Path,
    tasks: list[str],
    seeds: list[int],
    fractions: list[float],
    learned: dict,
    recorded: bool = False,
    wall_s: dict[str, float] | None = None,
) -> dict:
    """The study's report in ``report``, from what its runs hold: the comparison of the results the
    study asks for (its tasks, seeds and snapshots, not results an earlier version of the study left
    in its directories), opened by the runs still at their trivial baselines (``learned``:
    ``intrinsic.learning_report``); the held-out checks (``intrinsic``), the cost, and the W&B table.
    ``recorded``: runs brought back without their weights (``pretrainlab.slot``), whose held-out checks
    are read, not computed. Returns the comparison table."""
    wanted_tasks = set(tasks)

    def asked(r: dict) -> bool:
        fraction = (r.get("pretrained") or {}).get("fraction")
        return (
            r["task"] in wanted_tasks
            and r["seed"] in seeds
            and (is_final(r) or (fraction is not None and any(abs(float(fraction) - f) < 1e-9 for f in fractions)))
        )

    explicit = bool(cfg.get("arms"))
    preface = "\n\n".join(p for p in (learning_preface(learned), arms_preface(cfg) if explicit else "") if p)
    table = write_report(
        collect([str(r) for r in runs], keep=asked),
        report,
        baseline=cfg.get("baseline"),
        preface=preface,
        learning=learned,
    )
    print(to_markdown(table))
    if flagged := at_baseline(learned):
        log.warning(
            "%d of %d pretraining runs are still at their trivial baseline (%s): the comparison measures "
            "nothing of their objectives yet; see %s",
            len(flagged),
            len(learned),
            ", ".join(sorted(flagged)),
            report / "learning.md",
        )
    if cfg.get("intrinsic", True):
        print("\n" + intrinsic_markdown(intrinsic_report(runs, report, recorded)))
    cost = cost_report(runs, report, jobs=int(cfg.get("jobs", 1)), wall_s=wall_s)
    atomic.write_text(report / "provenance.json", json.dumps(report_provenance(rerun_command()), indent=2))
    log.info(
        "process time, summed over the runs: pretraining %.0f s, evaluation %.0f s (report/cost.md)",
        cost["pretraining_s"],
        cost["evaluation_s"],
    )
    log.info("report -> %s (comparison.md, .csv, .png)", report)
    if recorded:  # brought back from elsewhere: its runs logged where they ran
        return table
    lcfg = compose("train", list(cfg.pretrain))[0].get("logger") or {}
    if wandb_runs.enabled(lcfg):
        wandb_runs.log_comparison(
            table,
            report,
            project=lcfg.get("project", "pretrainlab"),
            mode=lcfg.get("mode", "offline"),
            group=cfg.study,
            entity=lcfg.get("entity"),
        )
    return table
