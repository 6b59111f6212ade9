"""Run one evaluation task on one encoder: fine-tune it (GLUE, NER), score it zero-shot (BLiMP) or
probe its frozen features, as the task's kind says (``pretrainlab.evaluation.tasks``), and write
its results file. ``finetune.py`` at the repository root is the Hydra entry point; the evaluation
suite (``pretrainlab.studies.suite``) calls :func:`run` once per (task, seed).

``pretrained`` is a pretraining run directory, an exported encoder directory (``<run>/encoder``)
or ``hf:<dir>``; ``init=scratch`` keeps its architecture and tokenizer but starts from random
weights (``encoders.py``).

A fine-tuned task's result (``results.json``) reports the dev metrics after the **last** epoch,
never the best epoch picked on the same dev set (which would flatter every model); every epoch's
metrics are kept in ``history``.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic
from pretrainlab.config import ConfigError, plain_or_none
from pretrainlab.evaluation import tasks as evaluations
from pretrainlab.finetuning.encoders import Pretrained, load_pretrained
from pretrainlab.finetuning.module import FinetuneModule, Trainable
from pretrainlab.glue.data import (
    EncodedDataset,
    EncodedSplit,
    LengthGroupedSampler,
    collate,
    data_digests,
    encode,
    load_task,
)
from pretrainlab.glue.metrics import no_skill
from pretrainlab.glue.tasks import get_task, task_score
from pretrainlab.runtime import wandb_runs
from pretrainlab.runtime.devices import DevicePlan, check_precision
from pretrainlab.runtime.rundir import claim_results, release
from pretrainlab.runtime.script import RunScript, rerun_command
from pretrainlab.runtime.settings import check_finetuning
from pretrainlab.runtime.signals import SaveOnSignal, exit_on_signal, worker_init

log = logging.getLogger("pretrainlab")


def eval_loader(
    split: EncodedSplit, batch_size: int, pad_id: int, num_workers: int = 0, multiple: int = 1
) -> torch.utils.data.DataLoader:
    """A dev set's batches, its examples in order of length: each batch is padded to its longest,
    so little padding is computed. Predictions are matched to examples by index, so the order
    changes no metric."""
    return torch.utils.data.DataLoader(
        EncodedDataset(split),
        batch_size=batch_size,
        sampler=sorted(range(len(split)), key=lambda i: len(split.ids[i])),
        collate_fn=functools.partial(collate, pad_id=pad_id, multiple=multiple),
        num_workers=num_workers,
        worker_init_fn=worker_init,
    )


def run(
    cfg: DictConfig,
    run_dir: str | Path | None = None,
    results_path: str | Path | None = None,
    choices: dict[str, str] | None = None,
    resume_hint: str | None = None,
) -> dict[str, Any]:
    """Run ``cfg.task`` on ``cfg.pretrained``; write and return the results. ``resume_hint``: the
    command to run after a signal stops it (a suite's or a study's; by default this process's)."""
    script = RunScript.of(cfg, run_dir, choices)
    run_dir = script.dir
    results_path = Path(results_path) if results_path else run_dir / "results.json"
    if OmegaConf.is_missing(cfg, "pretrained"):
        raise ConfigError("pretrained=<pretraining run directory | exported encoder directory | hf:<dir>> is required.")
    task = evaluations.get(cfg.task.name)
    check_finetuning(cfg)
    check_precision(cfg)
    plan = DevicePlan.of(cfg, cfg.task.batch_size, setting="task.batch_size") if task.fine_tuned else None
    optim = instantiate(cfg.optim) if task.fine_tuned else None
    claim_results(run_dir, results_path, overwrite=bool(cfg.get("overwrite", False)))
    try:
        return _run(cfg, script, task, optim, plan, results_path, resume_hint or rerun_command())
    finally:
        release(run_dir)


@dataclass
class Job:
    """What a fine-tuned task brings to the shared training loop."""

    module: Trainable
    train_loader: torch.utils.data.DataLoader
    eval_loaders: list[torch.utils.data.DataLoader]
    steps_per_epoch: int
    eval_examples: dict[str, int]
    fields: dict = field(default_factory=dict)  # what its results add: examples, the no-skill level, the data


def glue_examples(cfg: DictConfig, model: Pretrained) -> tuple[EncodedSplit, dict[str, EncodedSplit]]:
    """``cfg.task``'s training examples and each of its dev splits (by name), read and tokenized as
    fine-tuning trains and evaluates on them: ``glue.max_train_examples`` / ``max_eval_examples``,
    ``task.max_seq_len``, ``model``'s tokenizer and special tokens."""
    spec = get_task(cfg.task.name)
    glue = cfg.glue
    splits = load_task(spec, glue.source, glue.data_dir, cfg.cache_dir, plain_or_none(glue.get("synthetic")))

    def encoded(name: str, limit: int | None) -> EncodedSplit:
        return encode(splits[name].head(limit), model.tokenizer, model.tokens, cfg.task.max_seq_len)

    return encoded("train", glue.get("max_train_examples")), {
        name: encoded(name, glue.get("max_eval_examples")) for name in spec.eval_splits
    }


def _glue_job(cfg: DictConfig, model: Pretrained, optim, plan: DevicePlan) -> Job:
    spec = get_task(cfg.task.name)
    t0 = time.time()
    glue = cfg.glue
    digests = data_digests(spec, glue.source, glue.data_dir, cfg.cache_dir, plain_or_none(glue.get("synthetic")))
    encoded_train, evals = glue_examples(cfg, model)
    eval_names, encoded_eval = list(evals), list(evals.values())
    log.info(
        "%s: %d train, %s dev examples (%d truncated to %d tokens), loaded in %.1fs",
        spec.name,
        len(encoded_train),
        "/".join(str(len(e)) for e in encoded_eval),
        encoded_train.truncated,
        cfg.task.max_seq_len,
        time.time() - t0,
    )

    per_device = plan.micro_batch
    pad = model.tokens.pad_id
    gen = torch.Generator().manual_seed(cfg.seed)
    multiple = 8 if plan.compile else 1  # compiled: lengths in steps of 8, fewer shapes to compile for
    collate_fn = functools.partial(collate, pad_id=pad, multiple=multiple)
    order = (
        dict(sampler=LengthGroupedSampler([len(x) for x in encoded_train.ids], cfg.task.batch_size, gen))
        if glue.get("group_by_length")
        else dict(shuffle=True, generator=gen)
    )
    train_loader = torch.utils.data.DataLoader(
        EncodedDataset(encoded_train),
        batch_size=per_device,
        drop_last=False,
        collate_fn=collate_fn,
        num_workers=cfg.num_workers,
        worker_init_fn=worker_init,
        **order,
    )
    eval_loaders = [eval_loader(e, per_device * 2, pad, cfg.num_workers, multiple) for e in encoded_eval]
    steps_per_epoch = math.ceil(len(encoded_train) / cfg.task.batch_size)
    module = FinetuneModule(
        model.encoder,
        spec,
        optim,
        steps_per_epoch * cfg.task.epochs,
        cfg.task.classifier_dropout,
        eval_names,
        compile=plan.compile,
    )
    return Job(
        module,
        train_loader,
        eval_loaders,
        steps_per_epoch,
        {s: len(e) for s, e in zip(eval_names, encoded_eval)},
        {
            "train_examples": len(encoded_train),
            "no_skill": {
                f"{m}{suffix}": v
                for (_, suffix), e in zip(spec.eval_splits.values(), encoded_eval)
                for m, v in no_skill(list(spec.metrics), encoded_train.labels, e.labels, spec.is_regression).items()
            },
            "data": {"source": glue.source, "files": digests},
        },
    )


def _ner_job(cfg: DictConfig, model: Pretrained, optim, plan: DevicePlan) -> Job:
    from pretrainlab.evaluation import ner
    from pretrainlab.evaluation.tagging import TokenTagger, WordsDataset, collate_words, encode_words, label_set

    t0 = time.time()
    n = cfg.ner
    synthetic = plain_or_none(n.get("synthetic"))
    splits, digests = ner.load(
        n.source, n.data_dir, cfg.cache_dir, synthetic, n.get("max_train_examples"), n.get("max_eval_examples")
    )
    labels = label_set(splits["train"])
    label_ids = {label: i for i, label in enumerate(labels)}
    train = encode_words(splits["train"], model.tokenizer, model.tokens, cfg.task.max_seq_len, label_ids)
    dev = encode_words(splits["validation"], model.tokenizer, model.tokens, cfg.task.max_seq_len)
    gold = [tags for _, tags in splits["validation"]]
    log.info(
        "ner: %d train sentences (%d pieces), %d dev sentences (%d pieces), %d labels, loaded in %.1fs",
        len(splits["train"]),
        len(train),
        len(gold),
        len(dev),
        len(labels),
        time.time() - t0,
    )
    per_device = plan.micro_batch
    pad = model.tokens.pad_id
    gen = torch.Generator().manual_seed(cfg.seed)
    multiple = 8 if plan.compile else 1
    train_loader = torch.utils.data.DataLoader(
        WordsDataset(train),
        batch_size=per_device,
        shuffle=True,
        generator=gen,
        num_workers=cfg.num_workers,
        worker_init_fn=worker_init,
        collate_fn=functools.partial(collate_words, pad_id=pad, multiple=multiple),
    )
    # under DDP every rank's predictions are gathered: one width for all
    width = cfg.task.max_seq_len if plan.world > 1 else None
    eval_loader_ = torch.utils.data.DataLoader(
        WordsDataset(dev),
        batch_size=per_device * 2,
        sampler=sorted(range(len(dev)), key=lambda i: len(dev.ids[i])),
        num_workers=cfg.num_workers,
        worker_init_fn=worker_init,
        collate_fn=functools.partial(collate_words, pad_id=pad, length=width, multiple=multiple),
    )
    steps_per_epoch = math.ceil(len(train) / cfg.task.batch_size)
    module = TokenTagger(
        model.encoder,
        labels,
        optim,
        steps_per_epoch * cfg.task.epochs,
        dev,
        gold,
        cfg.task.classifier_dropout,
        compile=plan.compile,
    )
    return Job(
        module,
        train_loader,
        [eval_loader_],
        steps_per_epoch,
        {"validation": len(gold)},
        {
            "train_examples": len(splits["train"]),
            "labels": labels,
            "no_skill": {"f1": 0.0},
            "data": {"source": n.source, "files": digests},
        },
    )


def _run(
    cfg: DictConfig,
    script: RunScript,
    task: evaluations.Evaluation,
    optim,
    plan: DevicePlan | None,
    results_path: Path,
    resume_hint: str,
) -> dict[str, Any]:
    run_dir = script.dir
    script.start()
    model = load_pretrained(cfg.pretrained, cfg.init, cfg.seed)
    max_pos = model.encoder.config.max_position_embeddings
    if cfg.task.max_seq_len > max_pos:
        raise ConfigError(
            f"task.max_seq_len={cfg.task.max_seq_len} exceeds the encoder's {max_pos} positions; "
            f"lower task.max_seq_len."
        )
    t0 = time.time()
    if not task.fine_tuned:
        return _run_frozen(cfg, script, task, model, results_path, resume_hint, t0)

    assert plan is not None  # a fine-tuned task has one
    job = (_glue_job if task.kind == "glue" else _ner_job)(cfg, model, optim, plan)
    module = job.module
    total_steps = job.steps_per_epoch * cfg.task.epochs
    script.save_config()
    logger = _logger(script, task, model, cfg.seed, job.eval_examples)
    stopper = SaveOnSignal(None)
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        max_epochs=cfg.task.epochs,
        default_root_dir=str(run_dir),
        logger=logger,
        callbacks=[stopper, *script.callbacks()],
        limit_val_batches=1.0,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=1,
        enable_checkpointing=False,
        gradient_clip_val=optim.grad_clip,
        log_every_n_steps=min(cfg.trainer.get("log_every_n_steps", 10), job.steps_per_epoch),
    )
    try:
        stopper.fit(trainer, module, train_dataloaders=job.train_loader, val_dataloaders=job.eval_loaders)
        if stopper.stopped or (stopper.signum is not None and len(module.history) < cfg.task.epochs):
            script.exit_code = stopper.exit_code  # stopping is always for a signal: signum is set
            stopper.exit(
                f"fine-tuning of {task.name} (seed {cfg.seed}) stopped at step {trainer.global_step} of "
                f"{total_steps}; no results were written. Continue with:\n  {resume_hint}"
            )
        if not module.history:
            raise RuntimeError("fine-tuning finished without an evaluation; is task.epochs at least 1?")
        final = module.history[-1]["metrics"]
        diverged = {k: v for k, v in final.items() if not math.isfinite(v)}
        if diverged:
            raise FloatingPointError(
                f"{task.name} seed {cfg.seed}: the dev metrics are not finite ({', '.join(f'{k}={v}' for k, v in diverged.items())}"
                f"): fine-tuning diverged. No results were written; lower task.lr (it is {cfg.task.lr}) or check the "
                f"encoder."
            )
        result = _result(
            cfg,
            task,
            model,
            final,
            t0,
            run_dir,
            {
                "reported_epoch": "last",
                "history": module.history,
                "eval_examples": job.eval_examples,
                **job.fields,
                **({"detail": module.detail} if getattr(module, "detail", None) else {}),
                "steps": trainer.global_step,
            },
        )
        if trainer.is_global_zero:
            atomic.write_json(results_path, result)
            if logger:
                wandb_runs.log_finetune_summary(logger, result)
        log.info(
            "%s %s seed %d: %s (score %.2f)",
            task.name,
            model.label,
            cfg.seed,
            ", ".join(f"{k} {v:.4f}" for k, v in final.items()),
            result["score"],
        )
        script.exit_code = 0
    finally:
        script.finish()
    if stopper.signum is not None:  # the signal came during the last evaluation: the results are complete
        stopper.exit(f"fine-tuning of {task.name} (seed {cfg.seed}) had finished; its results are written. Stopping.")
    return result


def _run_frozen(
    cfg: DictConfig,
    script: RunScript,
    task: evaluations.Evaluation,
    model: Pretrained,
    results_path: Path,
    resume_hint: str,
    t0: float,
) -> dict[str, Any]:
    """A task that trains nothing of the encoder: zero-shot minimal pairs, frozen-feature probes."""
    script.save_config()
    try:
        with exit_on_signal(f"{task.name} on {model.label}", resume_hint):
            if task.kind == "blimp":
                from pretrainlab.evaluation.blimp import run_task
            else:
                from pretrainlab.evaluation.probes import run_task
            fields = run_task(cfg, model)
        result = _result(cfg, task, model, fields.pop("metrics"), t0, script.dir, fields)
        logger = _logger(script, task, model, cfg.seed, fields.get("eval_examples") or {})
        if logger:
            logger.log_metrics({f"val/{k}": v for k, v in result["metrics"].items()})
            wandb_runs.log_finetune_summary(logger, result)
        atomic.write_json(results_path, result)
        log.info(
            "%s %s: %s (score %.2f)",
            task.name,
            model.label,
            ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()),
            result["score"],
        )
        script.exit_code = 0
    finally:
        script.finish()
    return result


def _logger(script: RunScript, task: evaluations.Evaluation, model: Pretrained, seed: int, eval_examples: dict):
    return script.build_logger(
        name=f"{task.name}-{model.label}-s{seed}",
        group=model.source.get("wandb_group") or model.label,
        job_type="finetune",
        extra={f"pretrained.{k}": v for k, v in model.source.items()}
        | {"encoder_label": model.label}
        | {f"eval_examples.{s}": n for s, n in eval_examples.items()},
    )


def _result(
    cfg: DictConfig,
    task: evaluations.Evaluation,
    model: Pretrained,
    metrics: dict,
    t0: float,
    run_dir: Path,
    fields: dict,
) -> dict[str, Any]:
    return {
        "task": task.name,
        "seed": cfg.seed,
        "label": model.label,
        "metrics": metrics,
        "score": task_score(metrics),
        **fields,
        "pretrained": model.source,
        "runtime_s": round(time.time() - t0, 2),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "run_dir": str(run_dir),
    }


__all__ = ["glue_examples", "run"]
