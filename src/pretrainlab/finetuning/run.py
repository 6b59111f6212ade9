"""Fine-tune and evaluate one GLUE task. ``finetune.py`` at the repository root is the Hydra
entry point; the GLUE suite (``pretrainlab.studies.suite``) calls :func:`run` once per (task, seed).

``pretrained`` is a pretraining run directory, an exported encoder directory (``<run>/encoder``)
or ``hf:<dir>``; ``init=scratch`` keeps its architecture and tokenizer but starts from random
weights (``encoders.py``).

The result (``results.json``) reports the dev metrics after the **last** epoch, never the best
epoch picked on the same dev set (which would flatter every model); every epoch's metrics are kept
in ``history``.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic
from pretrainlab.finetuning.encoders import load_pretrained
from pretrainlab.finetuning.module import FinetuneModule
from pretrainlab.glue.data import (
    EncodedDataset, EncodedSplit, LengthGroupedSampler, collate, data_digests, encode, load_task,
)
from pretrainlab.glue.metrics import no_skill
from pretrainlab.glue.tasks import get_task, task_score
from pretrainlab.model.encoder import ConfigError
from pretrainlab.runtime.devices import check_precision, compile_options, world_size
from pretrainlab.runtime.rundir import claim_results, release
from pretrainlab.runtime.script import RunScript, rerun_command
from pretrainlab.runtime.settings import check_finetuning
from pretrainlab.runtime.signals import SaveOnSignal, fit, signal_name, worker_init

log = logging.getLogger("pretrainlab")


def eval_loader(split: EncodedSplit, batch_size: int, pad_id: int, num_workers: int = 0,
                multiple: int = 1) -> torch.utils.data.DataLoader:
    """A dev set's batches, its examples in order of length: each batch is padded to its longest,
    so little padding is computed. Predictions are matched to examples by index, so the order
    changes no metric."""
    return torch.utils.data.DataLoader(
        EncodedDataset(split), batch_size=batch_size, sampler=sorted(range(len(split)), key=lambda i: len(split.ids[i])),
        collate_fn=functools.partial(collate, pad_id=pad_id, multiple=multiple), num_workers=num_workers,
        worker_init_fn=worker_init)


def run(cfg: DictConfig, run_dir: str | Path | None = None, results_path: str | Path | None = None,
        choices: dict[str, str] | None = None, resume_hint: str | None = None) -> dict[str, Any]:
    """Fine-tune ``cfg.pretrained`` on ``cfg.task``; write and return the results. ``resume_hint``:
    the command to run after a signal stops it (a suite's or a study's; by default this process's)."""
    script = RunScript.of(cfg, run_dir, choices)
    run_dir = script.dir
    results_path = Path(results_path) if results_path else run_dir / "results.json"
    if OmegaConf.is_missing(cfg, "pretrained"):
        raise ConfigError("pretrained=<pretraining run directory | exported encoder directory | hf:<dir>> is required.")
    check_finetuning(cfg)
    check_precision(cfg)
    spec = get_task(cfg.task.name)
    world = world_size(cfg)
    if cfg.task.batch_size % world:
        raise ConfigError(f"task.batch_size={cfg.task.batch_size} is not divisible by the {world} devices.")
    optim = instantiate(cfg.optim)
    claim_results(run_dir, results_path, overwrite=bool(cfg.get("overwrite", False)))
    try:
        return _run(cfg, script, spec, optim, results_path, resume_hint or rerun_command())
    finally:
        release(run_dir)


def _run(cfg: DictConfig, script: RunScript, spec, optim, results_path: Path, resume_hint: str) -> dict[str, Any]:
    run_dir = script.dir
    script.start()
    model = load_pretrained(cfg.pretrained, cfg.init, cfg.seed)
    max_pos = model.encoder.config.max_position_embeddings
    if cfg.task.max_seq_len > max_pos:
        raise ConfigError(f"task.max_seq_len={cfg.task.max_seq_len} exceeds the encoder's {max_pos} positions; "
                          f"lower task.max_seq_len.")

    t0 = time.time()
    glue = cfg.glue
    synthetic = OmegaConf.to_container(glue.synthetic, resolve=True) if glue.get("synthetic") else None
    splits = load_task(spec, glue.source, glue.data_dir, cfg.cache_dir, synthetic)
    digests = data_digests(spec, glue.source, glue.data_dir, cfg.cache_dir, synthetic)
    train_split = splits["train"].head(glue.get("max_train_examples"))
    eval_names = list(spec.eval_splits)
    encoded_train = encode(train_split, model.tokenizer, model.tokens, cfg.task.max_seq_len)
    encoded_eval = [encode(splits[s].head(glue.get("max_eval_examples")), model.tokenizer, model.tokens,
                           cfg.task.max_seq_len) for s in eval_names]
    log.info("%s: %d train, %s dev examples (%d truncated to %d tokens), loaded in %.1fs", spec.name,
             len(encoded_train), "/".join(str(len(e)) for e in encoded_eval), encoded_train.truncated,
             cfg.task.max_seq_len, time.time() - t0)

    per_device = cfg.task.batch_size // world_size(cfg)
    pad = model.tokens.pad_id
    gen = torch.Generator().manual_seed(cfg.seed)
    compile_ = compile_options(cfg)
    multiple = 8 if compile_ else 1  # compiled: lengths in steps of 8, fewer shapes to compile for
    collate_fn = functools.partial(collate, pad_id=pad, multiple=multiple)
    order = (dict(sampler=LengthGroupedSampler([len(x) for x in encoded_train.ids], cfg.task.batch_size, gen))
             if glue.get("group_by_length") else dict(shuffle=True, generator=gen))
    train_loader = torch.utils.data.DataLoader(
        EncodedDataset(encoded_train), batch_size=per_device, drop_last=False, collate_fn=collate_fn,
        num_workers=cfg.num_workers, worker_init_fn=worker_init, **order)
    eval_loaders = [eval_loader(e, per_device * 2, pad, cfg.num_workers, multiple) for e in encoded_eval]
    steps_per_epoch = math.ceil(len(encoded_train) / cfg.task.batch_size)
    total_steps = steps_per_epoch * cfg.task.epochs
    module = FinetuneModule(model.encoder, spec, optim, total_steps, cfg.task.classifier_dropout, eval_names,
                            compile=compile_)

    script.save_config()
    logger = script.build_logger(
        name=f"{spec.name}-{model.label}-s{cfg.seed}", group=model.source.get("wandb_group") or model.label,
        job_type="finetune",
        extra={f"pretrained.{k}": v for k, v in model.source.items()} | {"encoder_label": model.label}
        | {f"eval_examples.{s}": len(e) for s, e in zip(eval_names, encoded_eval)},
    )
    stopper = SaveOnSignal(None)
    trainer: L.Trainer = instantiate(
        cfg.trainer, max_epochs=cfg.task.epochs, default_root_dir=str(run_dir), logger=logger,
        callbacks=[stopper, *script.callbacks()],
        limit_val_batches=1.0, num_sanity_val_steps=0, check_val_every_n_epoch=1, enable_checkpointing=False,
        gradient_clip_val=optim.grad_clip, log_every_n_steps=min(cfg.trainer.get("log_every_n_steps", 10),
                                                                 steps_per_epoch),
    )
    try:
        fit(trainer, stopper, module, train_dataloaders=train_loader, val_dataloaders=eval_loaders)
        if stopper.stopped or (stopper.signum is not None and len(module.history) < cfg.task.epochs):
            script.exit_code = stopper.exit_code
            log.warning("%s: fine-tuning of %s (seed %d) stopped at step %d of %d; no results were written. Continue "
                        "with:\n  %s", signal_name(stopper.signum), spec.name, cfg.seed, trainer.global_step,
                        total_steps, resume_hint)
            raise SystemExit(script.exit_code)
        if not module.history:
            raise RuntimeError("fine-tuning finished without an evaluation; is task.epochs at least 1?")
        final = module.history[-1]["metrics"]
        diverged = {k: v for k, v in final.items() if not math.isfinite(v)}
        if diverged:
            raise FloatingPointError(
                f"{spec.name} seed {cfg.seed}: the dev metrics are not finite ({', '.join(f'{k}={v}' for k, v in diverged.items())}"
                f"): fine-tuning diverged. No results were written; lower task.lr (it is {cfg.task.lr}) or check the "
                f"encoder.")
        result = {
            "task": spec.name, "seed": cfg.seed, "label": model.label, "metrics": final,
            "score": task_score(final), "reported_epoch": "last", "history": module.history,
            "pretrained": model.source, "train_examples": len(encoded_train),
            "eval_examples": {s: len(e) for s, e in zip(eval_names, encoded_eval)},
            "no_skill": {f"{m}{suffix}": v for (_, suffix), e in zip(spec.eval_splits.values(), encoded_eval)
                         for m, v in no_skill(list(spec.metrics), encoded_train.labels, e.labels,
                                              spec.is_regression).items()},
            "data": {"source": glue.source, "files": digests},
            "steps": trainer.global_step, "runtime_s": round(time.time() - t0, 2),
            "config": OmegaConf.to_container(cfg, resolve=True), "run_dir": str(run_dir),
        }
        if trainer.is_global_zero:
            atomic.write_json(results_path, result)
            if logger:
                _log_summary(logger, result)
        log.info("%s %s seed %d: %s (score %.2f)", spec.name, model.label, cfg.seed,
                 ", ".join(f"{k} {v:.4f}" for k, v in final.items()), result["score"])
        script.exit_code = 0
    finally:
        script.finish()
    if stopper.signum is not None:  # the signal came during the last evaluation: the results are complete
        log.warning("%s: fine-tuning of %s (seed %d) had finished; its results are written. Stopping.",
                    signal_name(stopper.signum), spec.name, cfg.seed)
        raise SystemExit(stopper.exit_code)
    return result


def _log_summary(logger, result: dict) -> None:
    from lightning.pytorch.loggers import WandbLogger

    if isinstance(logger, WandbLogger):
        summary = logger.experiment.summary
        for k, v in result["metrics"].items():
            summary[f"glue/{result['task']}/{k}"] = v
        summary[f"glue/{result['task']}/score"] = result["score"]
        summary["glue/score"] = result["score"]  # one key for every task: the metric of sweeps/glue.yaml


__all__ = ["run"]
