"""A study's report, from what its runs hold: the comparison of the results the study asks for, opened by
the runs still at their trivial baselines; the held-out checks, the cost, the provenance and the W&B table.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig

from pretrainlab import atomic
from pretrainlab.compare import collect, is_final, to_markdown, write_report
from pretrainlab.runtime import wandb_runs
from pretrainlab.runtime.hydra import compose
from pretrainlab.runtime.provenance import report_provenance
from pretrainlab.runtime.script import rerun_command
from pretrainlab.studies.arms import arm_of, arm_overrides, arms_preface, study_arms
from pretrainlab.studies.cost import cost_report
from pretrainlab.studies.intrinsic import at_baseline, intrinsic_markdown, intrinsic_report, learning_preface
from pretrainlab.studies.recipe import write_recipe_report

log = logging.getLogger("pretrainlab")


def phase_seconds(marks: list[tuple[str, float]]) -> dict[str, float]:
    """Each phase's wall-clock seconds, from the times its start and the next phase's were marked."""
    return {phase: round(end - start, 1) for (phase, start), (_, end) in zip(marks, marks[1:], strict=False)}


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
    are read, not computed. Returns the comparison table; a study of pretraining only (no ``tasks``:
    ``evals=[]``) has no comparison, and returns ``{"tasks": [], "learning": learned}``."""
    if not tasks:
        return _report_pretraining(cfg, runs, report, learned, recorded, wall_s)
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
    _checks_cost_provenance(
        cfg, runs, report, learned, recorded, wall_s, "the comparison measures nothing of their objectives yet"
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


def _report_pretraining(
    cfg: DictConfig, runs: list[Path], report: Path, learned: dict, recorded: bool, wall_s: dict[str, float] | None
) -> dict:
    """The report of a study that pretrains only: what each run learned (``learning.md`` and
    ``learning-curves.md``, written already), when each head left its baseline (``studies.recipe``), its
    held-out checks, cost and provenance."""
    by_arm = {arm: arm_overrides(cfg, arm) for arm in study_arms(cfg)}
    own = {run.name: by_arm[arm_of(run.name)] for run in runs if arm_of(run.name) in by_arm}
    write_recipe_report(runs, report, own, list(cfg.pretrain), str(cfg.get("about") or ""))
    _checks_cost_provenance(
        cfg, runs, report, learned, recorded, wall_s, "they have learned nothing of their objectives yet"
    )
    log.info("report -> %s (report.md, learning.md, learning-curves.md: a study of pretraining only, evals=[])", report)
    return {"tasks": [], "learning": learned}


def _checks_cost_provenance(
    cfg: DictConfig,
    runs: list[Path],
    report: Path,
    learned: dict,
    recorded: bool,
    wall_s: dict[str, float] | None,
    meaning: str,
) -> None:
    """What every study's report ends with: the runs still at their trivial baseline named (``meaning``:
    what that means for this report), the held-out checks, the cost and the provenance."""
    if flagged := at_baseline(learned):
        log.warning(
            "%d of %d pretraining runs are still at their trivial baseline (%s): %s; see %s",
            len(flagged),
            len(learned),
            ", ".join(sorted(flagged)),
            meaning,
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
