"""Fine-tune and evaluate one GLUE task. ``finetune.py`` at the repository root is the Hydra
entry point; the GLUE suite (``experiments/glue.py``) calls :func:`run` once per (task, seed).

``pretrained`` is a pretraining run directory or an exported encoder directory (``<run>/encoder``);
``init=scratch`` keeps its architecture and tokenizer but starts from random weights: the
baseline that shows what pretraining bought.

The result (``results.json``) reports the dev metrics after the **last** epoch, never the best
epoch picked on the same dev set (which would flatter every model); every epoch's metrics are kept
in ``history``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import TQDMProgressBar
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from pretrainlab import atomic
from pretrainlab.data.tokenizer import special_tokens
from pretrainlab.export import load_encoder, resolve_export_dir
from pretrainlab.glue.data import EncodedDataset, collate, encode, load_task
from pretrainlab.glue.tasks import get_task
from pretrainlab.lit.finetune import FinetuneModule
from pretrainlab.lit.pretrain import OptimConfig
from pretrainlab.loggers import build_logger, finish_logger
from pretrainlab.memory import keep_freed_memory
from pretrainlab.preemption import worker_init
from pretrainlab.settings import check_finetuning
from pretrainlab.model.encoder import ConfigError, Encoder
from pretrainlab.tokens import SpecialTokens
from pretrainlab.train import _world_size, hydra_choices, validate_precision

log = logging.getLogger("pretrainlab")


@dataclass
class Pretrained:
    """An encoder to fine-tune, its tokenizer, and where it came from."""

    encoder: Encoder
    tokenizer: Tokenizer
    tokens: SpecialTokens
    label: str          # the row name in comparisons: objective, "scratch", "hf:<name>"
    source: dict        # provenance: path, objective, pretraining run, W&B id


def shape_name(cfg) -> str:
    """An encoder's shape in a few characters (L2-H128, L12-H768-E128-shared), for encoders whose
    model preset is not recorded."""
    name = f"L{cfg.num_layers}-H{cfg.hidden_size}"
    if cfg.embedding_size != cfg.hidden_size:
        name += f"-E{cfg.embedding_size}"
    return name + ("-shared" if cfg.share_layers else "")


def encoder_identity(pretrained: str, init: str = "pretrained") -> dict:
    """What identifies the encoder ``pretrained`` names, without loading it: ``encoder_id`` (the
    sha256 of its weights file; for ``init=scratch``, a hash of its architecture and tokenizer),
    ``weights_sha256``, ``model`` (the model preset it was pretrained with, or its shape) and
    ``pretrain_seed``. Finished GLUE results are keyed by ``encoder_id``: a run directory
    pretrained again holds another encoder, whatever its path."""
    from pretrainlab.data.hashing import file_digest, fingerprint
    from pretrainlab.export import CONFIG, TOKENIZER, WEIGHTS

    if init not in ("pretrained", "scratch"):
        raise ConfigError(f"init={init!r}: expected pretrained or scratch.")
    if not pretrained or pretrained == "???":
        raise ConfigError("pretrained=<run directory or exported encoder> is required.")
    if str(pretrained).startswith("hf:"):
        from pretrainlab.hf import encoder_config_from_hf, model_name

        d = Path(os.path.expanduser(str(pretrained)[3:]))
        weights = next((d / f for f in ("model.safetensors", "pytorch_model.bin") if (d / f).is_file()), None)
        if weights is None or not (d / "config.json").is_file():
            raise FileNotFoundError(f"hf:{d}: expected a transformers directory (config.json and model.safetensors or "
                                    f"pytorch_model.bin).")
        cfg, _ = encoder_config_from_hf(json.loads((d / "config.json").read_text()))
        tokenizer = next((d / f for f in ("tokenizer.json", "vocab.txt") if (d / f).is_file()), None)
        model, seed = model_name(d), None
    else:
        d = resolve_export_dir(pretrained)
        meta = json.loads((d / CONFIG).read_text())
        from pretrainlab.model.encoder import EncoderConfig

        cfg = EncoderConfig.from_dict(meta["encoder"])
        pre = meta.get("pretraining") or {}
        weights, tokenizer = d / WEIGHTS, d / TOKENIZER
        model = (pre.get("choices") or {}).get("model") or shape_name(cfg)
        seed = (pre.get("config") or {}).get("seed")
    digest = file_digest(weights)
    identity = {"weights_sha256": digest, "model": model, "pretrain_seed": seed, "encoder_id": digest}
    if init == "scratch":
        identity["encoder_id"] = fingerprint({"scratch": cfg.to_dict(),
                                              "tokenizer": file_digest(tokenizer) if tokenizer else None})
        identity["pretrain_seed"] = None
    return identity


def load_pretrained(pretrained: str, init: str = "pretrained", seed: int = 0) -> Pretrained:
    identity = encoder_identity(pretrained, init)
    if str(pretrained).startswith("hf:"):
        from pretrainlab.hf import load_hf_encoder

        encoder, tokenizer, tokens, source = load_hf_encoder(str(pretrained)[3:])
        label = f"hf:{source['name']}"
    else:
        path = resolve_export_dir(pretrained)
        encoder, tokenizer, meta = load_encoder(path)
        names = {role: tokenizer.id_to_token(i) for role, i in meta["special_tokens"].items()}
        tokens = special_tokens(tokenizer, names)
        pre = meta.get("pretraining", {})
        run_dir = pre.get("run_dir")
        wandb_id = None
        if run_dir and (Path(run_dir) / ".wandb_id").is_file():
            wandb_id = (Path(run_dir) / ".wandb_id").read_text().strip()
        wandb_group = ((pre.get("config") or {}).get("logger") or {}).get("group") or pre.get("objective")
        source = {"path": str(path.resolve()), "objective": pre.get("objective"), "run_dir": run_dir,
                  "global_step": pre.get("global_step"), "tokens_seen": pre.get("tokens_seen"),
                  "wandb_id": wandb_id, "wandb_group": wandb_group}
        label = pre.get("objective") or path.name
    if init == "scratch":
        torch.manual_seed(seed)
        encoder = Encoder(encoder.config)
        label = "scratch"
    source.update(identity, init=init)
    return Pretrained(encoder, tokenizer, tokens, label, source)


def task_score(metrics: dict[str, float]) -> float:
    """A task's single number: the mean of its metrics, x 100 (GLUE's convention)."""
    return 100.0 * sum(metrics.values()) / len(metrics)


def run(cfg: DictConfig, run_dir: str | Path | None = None, results_path: str | Path | None = None,
        choices: dict[str, str] | None = None) -> dict[str, Any]:
    """Fine-tune ``cfg.pretrained`` on ``cfg.task``; write and return the results."""
    if run_dir is None:
        from hydra.core.hydra_config import HydraConfig

        run_dir = HydraConfig.get().runtime.output_dir
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    results_path = Path(results_path) if results_path else run_dir / "results.json"
    if OmegaConf.is_missing(cfg, "pretrained"):
        raise ConfigError("pretrained=<pretraining run directory | exported encoder directory | hf:<dir>> is required.")
    check_finetuning(cfg)
    validate_precision(cfg)
    if cfg.get("keep_freed_memory", True):
        keep_freed_memory()
    spec = get_task(cfg.task.name)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    model = load_pretrained(cfg.pretrained, cfg.init, cfg.seed)
    max_pos = model.encoder.config.max_position_embeddings
    if cfg.task.max_seq_len > max_pos:
        raise ConfigError(f"task.max_seq_len={cfg.task.max_seq_len} exceeds the encoder's {max_pos} positions; "
                          f"lower task.max_seq_len.")

    t0 = time.time()
    glue = cfg.glue
    splits = load_task(spec, glue.source, glue.data_dir, cfg.cache_dir,
                       OmegaConf.to_container(glue.synthetic, resolve=True) if glue.get("synthetic") else None)
    train_split = splits["train"].head(glue.get("max_train_examples"))
    eval_names = list(spec.eval_splits)
    encoded_train = encode(train_split, model.tokenizer, model.tokens, cfg.task.max_seq_len)
    encoded_eval = [encode(splits[s].head(glue.get("max_eval_examples")), model.tokenizer, model.tokens,
                           cfg.task.max_seq_len) for s in eval_names]
    log.info("%s: %d train, %s dev examples (%d truncated to %d tokens), loaded in %.1fs", spec.name,
             len(encoded_train), "/".join(str(len(e)) for e in encoded_eval), encoded_train.truncated,
             cfg.task.max_seq_len, time.time() - t0)

    world = _world_size(cfg)
    if cfg.task.batch_size % world:
        raise ConfigError(f"task.batch_size={cfg.task.batch_size} is not divisible by the {world} devices.")
    per_device = cfg.task.batch_size // world
    pad = model.tokens.pad_id
    gen = torch.Generator().manual_seed(cfg.seed)
    collate_fn = functools.partial(collate, pad_id=pad)
    train_loader = torch.utils.data.DataLoader(
        EncodedDataset(encoded_train), batch_size=per_device, shuffle=True, generator=gen, drop_last=False,
        collate_fn=collate_fn, num_workers=cfg.num_workers, worker_init_fn=worker_init)
    eval_loaders = [torch.utils.data.DataLoader(EncodedDataset(e), batch_size=per_device * 2, shuffle=False,
                                                collate_fn=collate_fn, num_workers=cfg.num_workers,
                                                worker_init_fn=worker_init) for e in encoded_eval]
    steps_per_epoch = math.ceil(len(encoded_train) / cfg.task.batch_size)
    total_steps = steps_per_epoch * cfg.task.epochs
    optim = OptimConfig(lr=cfg.task.lr, weight_decay=cfg.task.weight_decay, warmup=cfg.task.warmup,
                        betas=tuple(cfg.task.get("betas", (0.9, 0.999))), eps=cfg.task.get("eps", 1e-6),
                        grad_clip=cfg.task.get("grad_clip", 1.0))
    module = FinetuneModule(model.encoder, spec, optim, total_steps, cfg.task.classifier_dropout, eval_names)

    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    logger = build_logger(
        cfg, run_dir, hydra_choices() if choices is None else choices, name=f"{spec.name}-{model.label}-s{cfg.seed}",
        group=model.source.get("wandb_group") or model.label, job_type="finetune",
        extra={f"pretrained.{k}": v for k, v in model.source.items()} | {"encoder_label": model.label}
        | {f"eval_examples.{s}": len(e) for s, e in zip(eval_names, encoded_eval)},
    )
    callbacks = []
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(TQDMProgressBar(refresh_rate=cfg.progress_refresh_rate))
    trainer: L.Trainer = instantiate(
        cfg.trainer, max_epochs=cfg.task.epochs, default_root_dir=str(run_dir), logger=logger, callbacks=callbacks,
        limit_val_batches=1.0, num_sanity_val_steps=0, check_val_every_n_epoch=1, enable_checkpointing=False,
        gradient_clip_val=optim.grad_clip, log_every_n_steps=min(cfg.trainer.get("log_every_n_steps", 10),
                                                                 steps_per_epoch),
    )
    exit_code = 1
    try:
        trainer.fit(module, train_dataloaders=train_loader, val_dataloaders=eval_loaders)
        if not module.history:
            raise RuntimeError("fine-tuning finished without an evaluation; is task.epochs at least 1?")
        final = module.history[-1]["metrics"]
        result = {
            "task": spec.name, "seed": cfg.seed, "label": model.label, "metrics": final,
            "score": task_score(final), "reported_epoch": "last", "history": module.history,
            "pretrained": model.source, "train_examples": len(encoded_train),
            "eval_examples": {s: len(e) for s, e in zip(eval_names, encoded_eval)},
            "steps": trainer.global_step, "runtime_s": round(time.time() - t0, 2),
            "config": OmegaConf.to_container(cfg, resolve=True), "run_dir": str(run_dir),
        }
        if trainer.is_global_zero:
            atomic.write_json(results_path, result)
            if logger:
                _log_summary(logger, result)
        log.info("%s %s seed %d: %s (score %.2f)", spec.name, model.label, cfg.seed,
                 ", ".join(f"{k} {v:.4f}" for k, v in final.items()), result["score"])
        exit_code = 0
    finally:
        finish_logger(logger, exit_code)
    return result


def _log_summary(logger, result: dict) -> None:
    from lightning.pytorch.loggers import WandbLogger

    if isinstance(logger, WandbLogger):
        summary = logger.experiment.summary
        for k, v in result["metrics"].items():
            summary[f"glue/{result['task']}/{k}"] = v
        summary[f"glue/{result['task']}/score"] = result["score"]
        summary["glue/score"] = result["score"]  # one key for every task: the metric of sweeps/glue.yaml


__all__ = ["Pretrained", "load_pretrained", "run", "task_score"]
