"""A GLUE suite: one encoder, several tasks and seeds, resumable.

Results go to ``<output_dir>/<task>/seed<k>.json`` (the run's own files, W&B included, to
``<output_dir>/<task>/seed<k>/``). A (task, seed) whose results file exists is not run again, so
an interrupted suite continues where it stopped; a results file written for a different encoder is
refused rather than mixed in. ``summary.json`` / ``summary.md`` aggregate the seeds.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pretrainlab.export import resolve_export_dir
from pretrainlab.glue.tasks import get_task

log = logging.getLogger("pretrainlab")

CONF = Path(__file__).resolve().parents[3] / "conf"


def task_config(name: str, overrides: dict | None = None, conf_dir: Path = CONF) -> DictConfig:
    """conf/task/<name>.yaml with the non-null ``overrides`` applied."""
    path = conf_dir / "task" / f"{get_task(name).name}.yaml"
    cfg = OmegaConf.load(path)
    for k, v in (overrides or {}).items():
        if v is not None:
            cfg[k] = v
    return cfg


def default_output_dir(pretrained: str, init: str) -> Path:
    """``<pretraining run>/glue`` (``glue-scratch`` for init=scratch); for an export directory
    outside a run, ``<export dir>/glue``; for ``hf:<dir>``, ``runs/glue/hf-<name>``."""
    suffix = "glue-scratch" if init == "scratch" else "glue"
    if str(pretrained).startswith("hf:"):
        from pretrainlab.hf import model_name

        name = model_name(Path(str(pretrained)[3:]).expanduser())
        return Path("runs") / "glue" / f"hf-{name}{'-scratch' if init == 'scratch' else ''}"
    export = resolve_export_dir(pretrained)
    run = export.parent if export.name == "encoder" else export
    return run / suffix


def run_suite(cfg: DictConfig, tasks: list[str], seeds: list[int], output_dir: str | Path | None = None,
              task_overrides: dict | None = None) -> list[dict]:
    """Fine-tune ``cfg.pretrained`` on every (task, seed) not yet done; returns all results."""
    from pretrainlab.finetune import run
    from pretrainlab.train import hydra_choices

    output_dir = Path(output_dir) if output_dir else default_output_dir(cfg.pretrained, cfg.init)
    output_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name in tasks:
        task = task_config(name, task_overrides)
        for seed in seeds:
            path = output_dir / task.name / f"seed{seed}.json"
            if path.is_file():
                done = json.loads(path.read_text())
                _check_same_encoder(done, cfg, path)
                log.info("%s seed %d: done already (%s)", task.name, seed, path)
                results.append(done)
                continue
            run_cfg = cfg.copy()
            OmegaConf.set_struct(run_cfg, False)
            run_cfg.task = task
            run_cfg.seed = seed
            for key in ("tasks", "seeds", "output_dir", "task_overrides"):
                run_cfg.pop(key, None)
            choices = {**hydra_choices(), "task": task.name}
            results.append(run(run_cfg, output_dir / task.name / f"seed{seed}", results_path=path, choices=choices))
    write_summary(results, output_dir)
    return results


def _check_same_encoder(done: dict, cfg: DictConfig, path: Path) -> None:
    was = done.get("pretrained") or {}
    same_init = was.get("init") == cfg.init
    if str(cfg.pretrained).startswith("hf:"):
        same_source = (done.get("config") or {}).get("pretrained") == cfg.pretrained
    else:
        same_source = was.get("path") == str(resolve_export_dir(cfg.pretrained).resolve())
    if not (same_init and same_source):
        raise ValueError(
            f"{path} holds results of {was.get('path')} (init={was.get('init')}), not of pretrained={cfg.pretrained} "
            f"init={cfg.init}. Use another output_dir for this encoder."
        )


def write_summary(results: list[dict], output_dir: Path) -> None:
    from pretrainlab.glue.compare import aggregate, to_markdown
    from pretrainlab.data.tokenizer import atomic_write_text

    table = aggregate(results)
    atomic_write_text(output_dir / "summary.json", json.dumps(table, indent=2))
    atomic_write_text(output_dir / "summary.md", to_markdown(table) + "\n")
    log.info("summary -> %s\n%s", output_dir / "summary.md", to_markdown(table))
