"""A GLUE suite: one encoder, several tasks and seeds, resumable.

Results go to ``<output_dir>/<task>/seed<k>.json`` (the run's own files, W&B included, to
``<output_dir>/<task>/seed<k>/``). A (task, seed) whose results file exists is not run again, so
an interrupted suite continues where it stopped. Results are keyed by the encoder's identity (the
hash of its weights, see ``finetune.encoder_identity``), not by its path: a results file written
for another encoder, such as the earlier encoder of a run directory pretrained again, is refused
rather than reported as this one's; so is one written with other fine-tuning settings (the task's
recipe, the data, the optimizer), which would mix two experiments in one table. ``summary.json`` /
``summary.md`` aggregate the seeds.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic
from pretrainlab.export import resolve_export_dir
from pretrainlab.export.hf import model_name
from pretrainlab.finetuning import run as finetuning
from pretrainlab.finetuning.encoders import encoder_identity
from pretrainlab.glue.compare import aggregate, as_final, to_markdown
from pretrainlab.glue.tasks import get_task
from pretrainlab.runtime import hydra
from pretrainlab.runtime.hydra import CONF
from pretrainlab.runtime.settings import check_finetuning

log = logging.getLogger("pretrainlab")


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
        name = model_name(Path(str(pretrained)[3:]).expanduser())
        return Path("runs") / "glue" / f"hf-{name}{'-scratch' if init == 'scratch' else ''}"
    export = resolve_export_dir(pretrained)
    run = export.parent if export.name == "encoder" else export
    return run / suffix


def run_suite(cfg: DictConfig, tasks: list[str], seeds: list[int], output_dir: str | Path | None = None,
              task_overrides: dict | None = None) -> list[dict]:
    """Fine-tune ``cfg.pretrained`` on every (task, seed) not yet done; returns all results."""
    output_dir = Path(output_dir) if output_dir else default_output_dir(cfg.pretrained, cfg.init)
    identity = encoder_identity(cfg.pretrained, cfg.init)
    for name in tasks:  # every task's settings are checked before the first one runs
        check_finetuning(OmegaConf.create({"task": task_config(name, task_overrides)}))
    output_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name in tasks:
        task = task_config(name, task_overrides)
        for seed in seeds:
            path = output_dir / task.name / f"seed{seed}.json"
            run_cfg = cfg.copy()
            OmegaConf.set_struct(run_cfg, False)
            run_cfg.task = task
            run_cfg.seed = seed
            for key in ("tasks", "seeds", "output_dir", "task_overrides"):
                run_cfg.pop(key, None)
            if path.is_file():
                done = json.loads(path.read_text())
                _check_same_encoder(done, identity, cfg, path)
                _check_same_settings(done, run_cfg, path)
                log.info("%s seed %d: done already (%s)", task.name, seed, path)
                results.append(done)
                continue
            choices = {**hydra.choices(), "task": task.name}
            results.append(finetuning.run(run_cfg, output_dir / task.name / f"seed{seed}", results_path=path,
                                          choices=choices))
    write_summary(results, output_dir)
    return results


def _check_same_encoder(done: dict, identity: dict, cfg: DictConfig, path: Path) -> None:
    was = done.get("pretrained") or {}
    if was.get("encoder_id") == identity["encoder_id"] and was.get("init") == cfg.init:
        return
    if "encoder_id" not in was:
        why = "was written before results recorded their encoder's hash, so it cannot be matched to this encoder"
    elif was.get("init") != cfg.init:
        why = f"holds init={was.get('init')} results, and this suite is init={cfg.init}"
    else:
        why = (f"holds results of another encoder (weights {str(was.get('weights_sha256'))[:12]}, this one's are "
               f"{identity['weights_sha256'][:12]}: the encoder was pretrained again or replaced)")
    raise ValueError(f"{path} {why}. Use another output_dir for this encoder, or move the old results away to run "
                     f"them again.")


# what a result depends on, beyond the encoder and the seed (trainer, logger and compile settings change
# how it runs, not what it computes)
RESULT_SETTINGS = ("task", "glue", "optim")


def _check_same_settings(done: dict, run_cfg: DictConfig, path: Path) -> None:
    was, now = done.get("config"), OmegaConf.to_container(run_cfg, resolve=True)
    if not was:
        return
    changed = [d for group in RESULT_SETTINGS for d in _flat_diff(was.get(group), now.get(group), group)]
    if changed:
        shown = ", ".join(f"{key}: {then!r} then, {value!r} now" for key, then, value in changed[:4])
        more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
        raise ValueError(f"{path} was fine-tuned with other settings ({shown}{more}): reporting it beside this "
                         f"suite's results would mix two experiments. Use another output_dir for these settings, "
                         f"or move the old results away to run them again.")


# settings added since results were first written, with the value that results without them were made with
LEGACY = {"glue.group_by_length": False, "glue.synthetic.unseen_words": 0.0}


def _flat_diff(was, now, prefix: str) -> list[tuple[str, object, object]]:
    """(dotted key, old value, new value) of every setting that differs. A key missing from the old
    results is a setting added since: it is compared at its ``LEGACY`` value, or not at all when it
    changes nothing."""
    if isinstance(was, dict) and isinstance(now, dict):
        keys = [k for k in now if k in was or f"{prefix}.{k}" in LEGACY]
        return [d for k in keys for d in _flat_diff(was.get(k, LEGACY.get(f"{prefix}.{k}")), now[k], f"{prefix}.{k}")]
    return [] if was == now else [(prefix, was, now)]


def write_summary(results: list[dict], output_dir: Path) -> None:
    table = aggregate([as_final(r) for r in results])  # one encoder, a snapshot's included
    atomic.write_text(output_dir / "summary.json", json.dumps(table, indent=2))
    atomic.write_text(output_dir / "summary.md", to_markdown(table) + "\n")
    log.info("GLUE suite summary -> %s", output_dir / "summary.md")
