"""A whole ablation study from one command: pretrain objectives x seeds, fine-tune every encoder
(and the scratch baseline) on a GLUE suite, compare. Resumable at every level:

    <root>/<study>/pretrain/<objective>-s<seed>/   a pretraining run; skipped once its encoder is
                                                    exported, resumed from last.ckpt if interrupted
        glue/<task>/seed<k>.json                    fine-tuning results; finished pairs are skipped
        glue-scratch/...                            (first run only) the same architecture from scratch
    <root>/<study>/report/                          comparison.md / .csv / .png / .json

Every run of the study shares one W&B group: the study's name.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("pretrainlab")

CONF = Path(__file__).resolve().parents[2] / "conf"


def compose(name: str, overrides: list[str]) -> tuple[DictConfig, dict[str, str]]:
    """A config composed as the CLI would compose it, and its group choices."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def _compose():
        cfg = hydra_compose(name, overrides=list(overrides), return_hydra_config=True)
        choices = {k: str(v) for k, v in cfg.hydra.runtime.choices.items()
                   if not k.startswith("hydra") and v is not None}
        OmegaConf.set_struct(cfg, False)
        cfg.pop("hydra")
        return cfg, choices

    if GlobalHydra.instance().is_initialized():
        return _compose()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return _compose()


def _set_group(cfg: DictConfig, group: str) -> None:
    if cfg.get("logger") and "group" in cfg.logger:
        cfg.logger.group = group


def run_study(cfg: DictConfig) -> dict:
    from pretrainlab.glue.compare import collect, log_to_wandb, to_markdown, write_report
    from pretrainlab.glue.suite import run_suite
    from pretrainlab.train import run as pretrain

    root = Path(cfg.output_root).expanduser() / cfg.study
    runs = []
    for objective in cfg.objectives:
        for seed in cfg.seeds:
            run_dir = root / "pretrain" / f"{objective}-s{seed}"
            runs.append(run_dir)
            if (run_dir / "encoder" / "config.json").is_file():
                log.info("pretraining %s seed %d: done already (%s)", objective, seed, run_dir)
                continue
            overrides = [f"objective={objective}", f"seed={seed}", *cfg.pretrain]
            if (run_dir / "checkpoints" / "last.ckpt").is_file():
                overrides.append("ckpt_path=last")
                log.info("pretraining %s seed %d: resuming from %s", objective, seed, run_dir)
            train_cfg, choices = compose("train", overrides)
            _set_group(train_cfg, cfg.study)
            train_cfg.export = True
            pretrain(train_cfg, run_dir, choices=choices)

    glue_overrides = [*cfg.glue.overrides]
    encoders = [(r, "pretrained") for r in runs] + ([(runs[0], "scratch")] if cfg.scratch and runs else [])
    for run_dir, init in encoders:
        gcfg, _ = compose("glue", [f"pretrained={run_dir}", f"init={init}", *glue_overrides])
        _set_group(gcfg, cfg.study)
        run_suite(gcfg, list(cfg.glue.tasks), [int(s) for s in cfg.glue.seeds], None,
                  OmegaConf.to_container(gcfg.task_overrides, resolve=True))

    report = root / "report"
    table = write_report(collect([str(root / "pretrain")]), report)
    print(to_markdown(table))
    log.info("report -> %s (comparison.md, .csv, .png)", report)
    lcfg = compose("train", list(cfg.pretrain))[0].get("logger") or {}
    if str(lcfg.get("_target_", "")).endswith("WandbLogger") and lcfg.get("mode") != "disabled":
        log_to_wandb(table, report, project=lcfg.get("project", "pretrainlab"), mode=lcfg.get("mode", "offline"),
                     group=cfg.study, entity=lcfg.get("entity"))
    return table
