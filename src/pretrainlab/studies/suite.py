"""The evaluation suite: one encoder, several tasks and seeds, resumable. A task is any evaluation of
``conf/task/`` (GLUE's nine, named entities, minimal pairs, frozen-feature probes, ...: see
``pretrainlab.evaluation.base``).

Results go to ``<output_dir>/<task>/seed<k>.json`` (the run's own files, W&B included, to
``<output_dir>/<task>/seed<k>/``); by default ``<run>/glue/`` for GLUE's tasks and ``<run>/eval/``
for the others. A (task, seed) whose results file exists is not run again, so an interrupted suite
continues where it stopped; a zero-shot task runs once. Before anything runs, every finished result
is checked (``pretrainlab.evaluation.results``): it must be complete and finite, of this encoder (by the
hash of its weights, not its path: a run directory pretrained again holds another encoder), made
with this suite's settings (the task's recipe, its data settings, the optimizer) and on the same
data files; anything else is refused rather than reported beside new results. ``summary.json`` /
``summary.md`` aggregate the seeds. One suite at a time writes into a directory.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic
from pretrainlab.compare import aggregate, as_final, to_markdown
from pretrainlab.config import plain
from pretrainlab.evaluation import base as evaluations
from pretrainlab.evaluation import run as evaluation
from pretrainlab.evaluation.results import check_data, check_encoder, check_place, check_settings, read_result
from pretrainlab.export import resolve_export_dir
from pretrainlab.export.hf import model_name
from pretrainlab.export.native import CONFIG
from pretrainlab.export.pretrained import encoder_identity
from pretrainlab.runtime import hydra
from pretrainlab.runtime.hydra import CONF, compose
from pretrainlab.runtime.rundir import lock, unlock
from pretrainlab.runtime.script import rerun_command
from pretrainlab.runtime.settings import check_finetuning
from pretrainlab.studies.arms import set_group

log = logging.getLogger("pretrainlab")


def task_config(name: str, overrides: dict | None = None, conf_dir: Path = CONF) -> DictConfig:
    """conf/task/<name>.yaml, with the non-null ``overrides`` applied to a fine-tuned task: a recipe
    override (lr, epochs, ...) is not a probe's or a zero-shot task's."""
    task = evaluations.get(name)
    cfg = cast(DictConfig, OmegaConf.load(conf_dir / "task" / f"{task.name}.yaml"))
    if task.fine_tuned:
        for k, v in (overrides or {}).items():
            if v is not None:
                cfg[k] = v
    return cfg


def default_output_dir(pretrained: str, init: str, family: str = "glue") -> Path:
    """``<pretraining run>/<family>`` (``<family>-scratch`` for init=scratch); for an export directory
    outside a run, ``<export dir>/<family>``; for ``hf:<dir>``, ``runs/<family>/hf-<name>``. The family
    is the evaluation's (``Evaluation.family``: ``glue`` for GLUE's tasks, ``eval`` for the others)."""
    suffix = f"{family}-scratch" if init == "scratch" else family
    if str(pretrained).startswith("hf:"):
        name = model_name(Path(str(pretrained)[3:]).expanduser())
        return Path("runs") / family / f"hf-{name}{'-scratch' if init == 'scratch' else ''}"
    export = resolve_export_dir(pretrained)
    run = export.parent if export.name == "encoder" else export
    return run / suffix


def output_dir_of(task: evaluations.Evaluation, cfg: DictConfig, output_dir: str | Path | None) -> Path:
    """Where ``task``'s results go: ``output_dir`` when given, else the encoder's default for its family."""
    if output_dir:
        return Path(output_dir)
    return default_output_dir(cfg.pretrained, cfg.init, task.family)


@dataclass
class Job:
    """One (task, seed) of a suite: its config, where it runs and writes, and its result if done."""

    cfg: DictConfig
    run_dir: Path
    path: Path
    done: dict | None


def plan_suite(
    cfg: DictConfig,
    tasks: list[str],
    seeds: list[int],
    output_dir: str | Path | None = None,
    task_overrides: dict | None = None,
) -> tuple[list[Path], list[Job]]:
    """The suite's output directories and its jobs, every setting and every finished result checked
    (nothing is run or written but the synthetic data's cache). A task that is not seeded (zero-shot)
    runs once, with the first seed."""
    identity = encoder_identity(cfg.pretrained, cfg.init)
    tasks = list(dict.fromkeys(evaluations.get(t).name for t in tasks))  # each (task, seed) once
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    for name in tasks:  # every task's settings are checked before the first one runs
        check_finetuning(OmegaConf.create({"task": task_config(name, task_overrides)}))
    jobs, dirs = [], []
    for name in tasks:
        task = evaluations.with_data(name, cfg)
        task_cfg = task_config(name, task_overrides)
        evaluation.check_language(
            str(cfg.pretrained), task
        )  # before any task runs: a synthetic set of another language
        out = output_dir_of(task, cfg, output_dir)
        dirs.append(out)
        digests = None
        for seed in seeds if task.seeded else seeds[:1]:
            path = out / task.name / f"seed{seed}.json"
            run_cfg = cfg.copy()
            OmegaConf.set_struct(run_cfg, False)
            run_cfg.task = task_cfg
            run_cfg.seed = seed
            for key in ("tasks", "seeds", "output_dir", "task_overrides"):
                run_cfg.pop(key, None)
            done = None
            if path.exists():
                done = read_result(path)
                check_place(done, task.name, seed, path)
                check_encoder(done, identity, cfg.init, path)
                check_settings(done, plain(run_cfg), path)
                if digests is None:
                    digests = task.digests() or {}
                check_data(done, digests, path)
                done = _relabel(done, identity, path)
            jobs.append(Job(run_cfg, out / task.name / f"seed{seed}", path, done))
    return list(dict.fromkeys(dirs)), jobs


def _relabel(done: dict, identity: dict, path: Path) -> dict:
    """A finished result of this encoder whose record of where the encoder sits in its run's budget
    (``fraction``, ``pretrain_flops``) is out of date (the run's budget was extended since, and its
    snapshots relabelled): the record is brought up to date, in the file too."""
    was = done.get("pretrained") or {}
    if was.get("fraction") is None or was["fraction"] == identity["fraction"]:
        return done
    fresh = {k: identity[k] for k in ("fraction", "pretrain_flops") if was.get(k) != identity[k]}
    log.info(
        "%s: the encoder's place in its run's budget changed since (%s); its result is relabelled",
        path,
        ", ".join(f"{k} {was.get(k)} -> {v}" for k, v in fresh.items()),
    )
    done = {**done, "pretrained": {**was, **fresh}}
    atomic.write_json(path, done)
    return done


def run_suite(
    cfg: DictConfig,
    tasks: list[str],
    seeds: list[int],
    output_dir: str | Path | None = None,
    task_overrides: dict | None = None,
    resume_hint: str | None = None,
) -> list[dict]:
    """Run every (task, seed) on ``cfg.pretrained`` that is not done yet; returns all results.
    ``resume_hint``: the command that continues the suite after a signal stops it (by default
    this process's command line)."""
    resume_hint = resume_hint or rerun_command()
    dirs = list(dict.fromkeys(output_dir_of(evaluations.get(t), cfg, output_dir) for t in tasks))
    for d in dirs:
        lock(d, "evaluation suite")
    try:
        dirs, jobs = plan_suite(cfg, tasks, seeds, output_dir, task_overrides)
        results: dict[Path, list[dict]] = {}
        fused = _fuse(jobs, resume_hint) if cfg.get("fuse_seeds", False) else {}
        for job in jobs:
            out = job.path.parents[1]
            if job.done is not None:
                log.info("%s seed %d: done already (%s)", job.cfg.task.name, job.cfg.seed, job.path)
                results.setdefault(out, []).append(job.done)
                continue
            if job.path in fused:
                results.setdefault(out, []).append(fused[job.path])
                continue
            results.setdefault(out, []).append(
                evaluation.run(
                    job.cfg, job.run_dir, results_path=job.path, choices=_choices(job), resume_hint=resume_hint
                )
            )
        for out, rs in results.items():
            write_summary(rs, out)
    finally:
        for d in dirs:
            unlock(d)
    return [r for rs in results.values() for r in rs]


def suite_overrides(cfg: DictConfig) -> list[str]:
    """What a study's every evaluation suite is composed with (conf/suite.yaml): ``suite.overrides``, the
    data folders, and whether a suite fuses a task's seeds (``fuse_finetuning``)."""
    return [
        *cfg.suite.overrides,
        *(f'{block}.data_dir="{path}"' for block, path in (cfg.get("data_dirs") or {}).items() if path is not None),
        f"fuse_seeds={str(bool(cfg.get('fuse_finetuning', False))).lower()}",
    ]


def suite_config(cfg: DictConfig, encoder: Path, init: str) -> DictConfig:
    """The evaluation suite of ``encoder`` (``init``: pretrained or scratch) in study ``cfg``."""
    gcfg, _ = compose("suite", [f"pretrained={encoder}", f"init={init}", *suite_overrides(cfg)])
    set_group(gcfg, cfg.study)
    return gcfg


def _choices(job: Job) -> dict[str, str]:
    return {**hydra.choices(), "task": job.cfg.task.name}


def _shape(pretrained: str) -> str | None:
    """The encoder config of an export (the shape its fine-tunings share when fused); None for ``hf:``."""
    if str(pretrained).startswith("hf:"):
        return None
    try:
        return json.dumps(json.loads((resolve_export_dir(pretrained) / CONFIG).read_text())["encoder"], sort_keys=True)
    except (OSError, ValueError, KeyError):
        return None


def _fuse(jobs: list[Job], resume_hint: str) -> dict[Path, dict]:
    """The unfinished fine-tunings among ``jobs`` of each fusable task (GLUE's) and encoder shape trained at
    once, as one model (``evaluation.fused``); their results by path. A group whose runs cannot be fused is
    left to run one at a time (the log says why)."""
    pending = [job for job in jobs if job.done is None]
    fusable = {name: evaluations.get(name).fusable for name in {job.cfg.task.name for job in pending}}
    shapes = {p: _shape(p) for p in {str(job.cfg.pretrained) for job in pending}}  # one read per encoder
    groups: dict[tuple[str, str], list[Job]] = {}
    for job in pending:
        shape = shapes[str(job.cfg.pretrained)]
        if fusable[job.cfg.task.name] and shape is not None:
            groups.setdefault((job.cfg.task.name, shape), []).append(job)
    out: dict[Path, dict] = {}
    for group in groups.values():
        if len(group) < 2:
            continue
        members = [(job.cfg, job.run_dir, job.path, _choices(job)) for job in group]
        results = evaluation.run_fused(members, resume_hint)
        if results is not None:
            out.update({job.path: result for job, result in zip(group, results, strict=True)})
    return out


def fuse_task(suites: list[DictConfig], task: str, seeds: list[int], resume_hint: str | None = None) -> int:
    """The unfinished fine-tunings of ``task`` in every suite of ``suites`` (one per encoder), trained at
    once: one group per encoder shape (``evaluation.run_fused``). Returns how many were trained; what
    cannot be fused is left to each encoder's suite (``run_suite``), which also writes the summaries."""
    resume_hint = resume_hint or rerun_command()
    named = evaluations.get(task)
    # the task's folder of each encoder's results (the other tasks' are another process's, at once)
    dirs = list(dict.fromkeys(output_dir_of(named, g, None) / named.name for g in suites))
    for d in dirs:
        lock(d, "evaluation suite")
    try:
        jobs = [job for g in suites for job in plan_suite(g, [task], seeds, None, plain(g.task_overrides))[1]]
        return len(_fuse(jobs, resume_hint))
    finally:
        for d in dirs:
            unlock(d)


def write_summary(results: list[dict], output_dir: Path) -> None:
    table = aggregate([as_final(r) for r in results])  # one encoder, a snapshot's included
    atomic.write_text(output_dir / "summary.json", atomic.json_text(table))
    atomic.write_text(output_dir / "summary.md", to_markdown(table) + "\n")
    log.info("evaluation suite summary -> %s", output_dir / "summary.md")
