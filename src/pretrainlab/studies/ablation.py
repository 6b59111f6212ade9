"""A whole ablation study from one command: pretrain objectives x seeds, fine-tune every encoder
(and the scratch baseline) on a GLUE suite, compare. Resumable at every level:

    <root>/<study>/pretrain/<objective>-s<seed>/   a pretraining run; skipped once its encoder is
                                                    exported, resumed from last.ckpt if interrupted
        glue/<task>/seed<k>.json                    fine-tuning results; finished pairs are skipped
        glue-scratch/...                            (first run only) the same architecture from scratch
        snapshots/<fraction>/glue/...               with ``snapshots``: the encoder at that fraction of
                                                    the budget, and its GLUE suite
    <root>/<study>/report/                          comparison.md / .csv / .png / .json; curve.png /
                                                    .csv with snapshots; intrinsic.md (held-out metrics)

Every run of the study shares one W&B group: the study's name.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pretrainlab.glue.compare import collect, log_to_wandb, to_markdown, write_report
from pretrainlab.pretraining import run as pretraining
from pretrainlab.pretraining.snapshots import check_fractions, snapshot_dir
from pretrainlab.runtime.hydra import compose, options
from pretrainlab.studies.intrinsic import intrinsic_markdown, intrinsic_report
from pretrainlab.studies.suite import run_suite

log = logging.getLogger("pretrainlab")


def _set_group(cfg: DictConfig, group: str) -> None:
    if cfg.get("logger") and "group" in cfg.logger:
        cfg.logger.group = group


def run_study(cfg: DictConfig) -> dict:
    os.environ.setdefault("WANDB_SILENT", "true")  # dozens of runs: W&B speaks only when something fails
    root = Path(cfg.output_root).expanduser() / cfg.study
    runs = []
    objectives = options("objective") if cfg.objectives == "all" else list(cfg.objectives)
    fractions = check_fractions([f for f in cfg.get("snapshots") or [] if float(f) != 1.0])
    baseline = cfg.get("baseline")
    if baseline is not None and baseline not in [*objectives, *(["scratch"] if cfg.scratch else [])]:
        raise ValueError(f"baseline={baseline!r} is not a row of this study: name one of {', '.join(objectives)}"
                         f"{', scratch' if cfg.scratch else ''} (conf/ablate.yaml or the command line).")
    for objective in objectives:
        for seed in cfg.seeds:
            run_dir = root / "pretrain" / f"{objective}-s{seed}"
            runs.append(run_dir)
            if (run_dir / "encoder" / "config.json").is_file():
                log.info("pretraining %s seed %d: done already (%s)", objective, seed, run_dir)
                continue
            overrides = [f"objective={objective}", f"seed={seed}", *cfg.pretrain,
                         *(cfg.get("objective_overrides") or {}).get(objective, [])]
            if fractions:
                overrides.append(f"snapshots=[{','.join(f'{f:g}' for f in fractions)}]")
            if (run_dir / "checkpoints" / "last.ckpt").is_file():
                overrides.append("ckpt_path=last")
                log.info("pretraining %s seed %d: resuming from %s", objective, seed, run_dir)
            train_cfg, choices = compose("train", overrides)
            _set_group(train_cfg, cfg.study)
            train_cfg.export = True
            pretraining.run(train_cfg, run_dir, choices=choices)

    glue_overrides = [*cfg.glue.overrides]
    encoders = [(r, "pretrained") for r in runs] + ([(runs[0], "scratch")] if cfg.scratch and runs else [])
    for run_dir in runs:
        for fraction in fractions:
            snap = snapshot_dir(run_dir, fraction)
            if (snap / "config.json").is_file():
                encoders.append((snap, "pretrained"))
            else:
                log.warning("%s has no snapshot at %g of its budget (it was pretrained without snapshots=%s): that "
                            "point of the curve is left out", run_dir, fraction, list(fractions))
    for run_dir, init in encoders:
        gcfg, _ = compose("glue", [f"pretrained={run_dir}", f"init={init}", *glue_overrides])
        _set_group(gcfg, cfg.study)
        run_suite(gcfg, list(cfg.glue.tasks), [int(s) for s in cfg.glue.seeds], None,
                  OmegaConf.to_container(gcfg.task_overrides, resolve=True))

    report = root / "report"
    table = write_report(collect([str(root / "pretrain")]), report, baseline=cfg.get("baseline"))
    print(to_markdown(table))
    if cfg.get("intrinsic", True):
        print("\n" + intrinsic_markdown(intrinsic_report(runs, report)))
    log.info("report -> %s (comparison.md, .csv, .png)", report)
    lcfg = compose("train", list(cfg.pretrain))[0].get("logger") or {}
    if str(lcfg.get("_target_", "")).endswith("WandbLogger") and lcfg.get("mode") != "disabled":
        log_to_wandb(table, report, project=lcfg.get("project", "pretrainlab"), mode=lcfg.get("mode", "offline"),
                     group=cfg.study, entity=lcfg.get("entity"))
    return table
