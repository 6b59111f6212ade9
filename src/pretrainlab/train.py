"""Compose a pretraining run from its config and run it. ``train.py`` at the repository root is
the Hydra entry point; tests call :func:`run` with a composed config and a run directory.

Order matters and goes one way: corpus -> tokenizer -> encoder config (vocabulary from the
tokenizer) -> objective -> examples -> LightningModule -> Trainer -> export.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from pretrainlab.data.pretrain import PretrainData, PretrainDataModule
from pretrainlab.data.tokenizer import special_tokens
from pretrainlab.export import export_encoder
from pretrainlab.lit.pretrain import PretrainModule
from pretrainlab.loggers import build_logger, finish_logger
from pretrainlab.memory import keep_freed_memory
from pretrainlab.model.encoder import ConfigError, EncoderConfig

log = logging.getLogger("pretrainlab")


def hydra_choices() -> dict[str, str]:
    """The chosen config groups (objective=..., model=...) when running under Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return {k: str(v) for k, v in HydraConfig.get().runtime.choices.items()
                    if not k.startswith("hydra") and v is not None}
    except ImportError:  # pragma: no cover
        pass
    return {}


def validate_precision(cfg: DictConfig) -> None:
    """fp16 on CPU is refused: it has no fast kernels there."""
    precision = str(cfg.trainer.get("precision", "32-true"))
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and precision.startswith("16"):
        raise ConfigError(
            f"trainer.precision={precision} on CPU: float16 has no fast CPU kernels and runs orders of "
            f"magnitude slower. Use trainer.precision=bf16-mixed (or 32-true) on CPU."
        )


def validate(cfg: DictConfig) -> None:
    """Refuse settings that cannot work, before anything expensive happens."""
    validate_precision(cfg)
    _refuse_multirun_ddp(cfg)
    if cfg.max_steps < 1 and not any(v is not None for v in (cfg.get("budget") or {}).values()):
        raise ConfigError(f"max_steps must be at least 1, got {cfg.max_steps}.")
    max_pos = cfg.model.get("max_position_embeddings", 512)
    if cfg.max_seq_len > max_pos:
        raise ConfigError(
            f"max_seq_len={cfg.max_seq_len} exceeds model.max_position_embeddings={max_pos}: the model has no "
            f"position embedding beyond {max_pos}. Lower max_seq_len or raise model.max_position_embeddings."
        )


def _refuse_multirun_ddp(cfg: DictConfig) -> None:
    """Hydra multirun + Lightning's ``ddp`` (which re-executes the command for every rank) makes
    each rank start its own multirun (hydra#2070): refused, pointing to what works."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
    except ImportError:  # pragma: no cover
        return
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    strategy = str(cfg.trainer.get("strategy", "auto"))
    if strategy in ("ddp", "ddp_find_unused_parameters_true") and _world_size(cfg) > 1:
        raise ConfigError(
            "Hydra multirun (-m) with trainer.strategy=ddp is not supported: ddp re-runs the command for every "
            "rank, and each rank would start its own multirun. Use trainer.strategy=ddp_spawn for multirun, or run "
            "one process per run (a W&B agent: sweeps/*.yaml; or a shell loop over python train.py ...)."
        )


def resolve_checkpoint(ckpt_path: str | None, run_dir: Path) -> str | None:
    """``last`` (this run directory), ``auto`` (``last`` if it exists, else a fresh start: for
    requeued cluster jobs), a run directory, or a checkpoint file."""
    if not ckpt_path:
        return None
    if ckpt_path == "auto":
        p = run_dir / "checkpoints" / "last.ckpt"
        return str(p) if p.is_file() else None
    if ckpt_path == "last":
        p = run_dir / "checkpoints" / "last.ckpt"
        if not p.is_file():
            raise FileNotFoundError(
                f"ckpt_path=last: no checkpoint at {p}. To resume another run, pass ckpt_path=<its run "
                f"directory> (or hydra.run.dir=<its run directory> ckpt_path=last)."
            )
        return str(p)
    p = Path(os.path.expanduser(ckpt_path))
    if p.is_dir():
        p = p / "checkpoints" / "last.ckpt"
    if not p.is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no checkpoint file at {p}.")
    return str(p)


def build_encoder_config(cfg: DictConfig, vocab_size: int) -> EncoderConfig:
    model_vocab = cfg.model.get("vocab_size")
    if model_vocab is not None and model_vocab != vocab_size:
        raise ConfigError(
            f"the tokenizer has {vocab_size} tokens but model.vocab_size={model_vocab}. Set model.vocab_size=null "
            f"to size the embeddings from the tokenizer, or use a tokenizer with {model_vocab} tokens "
            f"(tokenizer.vocab_size={model_vocab} if the corpus has enough distinct words)."
        )
    return instantiate(cfg.model, vocab_size=vocab_size)


def build_objective(cfg: DictConfig, encoder_config: EncoderConfig, tokens):
    """The objective plugin named by ``cfg.objective._target_``. Late objects (encoder config,
    special tokens) go in through a partial, so Hydra passes them as they are."""
    return instantiate(cfg.objective, _partial_=True)(encoder_config=encoder_config, tokens=tokens)


def run(cfg: DictConfig, run_dir: str | Path | None = None, choices: dict[str, str] | None = None) -> dict[str, Any]:
    """Pretrain as ``cfg`` says; returns the final logged metrics and the paths written.

    ``choices`` (config group -> option, logged as ``choice.<group>``) default to Hydra's runtime
    choices when running under ``train.py``."""
    if run_dir is None:
        from hydra.core.hydra_config import HydraConfig

        run_dir = HydraConfig.get().runtime.output_dir
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    validate(cfg)
    if cfg.get("keep_freed_memory", True):
        keep_freed_memory()
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    corpus = instantiate(cfg.data)
    tokenizer_spec = instantiate(cfg.tokenizer)
    data = PretrainData(corpus, tokenizer_spec, cfg.cache_dir, cfg.val_fraction, cfg.split_seed)
    tokenizer = data.tokenizer
    tokens = special_tokens(tokenizer, tokenizer_spec.special_tokens)
    encoder_config = build_encoder_config(cfg, tokens.vocab_size)
    objective = build_objective(cfg, encoder_config, tokens)

    world = _world_size(cfg)
    device_batch, accumulate = batch_split(cfg.batch_size, world, cfg.get("device_batch_size"))
    log.info("global batch %d = %d device(s) x %d micro-batch x %d accumulation", cfg.batch_size, world,
             device_batch, accumulate)
    datamodule = PretrainDataModule(
        data, objective.example_builder(cfg.max_seq_len), objective.collator(), device_batch,
        cfg.seed, num_workers=cfg.num_workers, accumulate=accumulate,
    )
    datamodule.prepare()
    if datamodule.train_store is not None:
        log.info("examples: %d train (%d tokens), %d val", len(datamodule.train_store),
                 datamodule.train_store.num_tokens, len(datamodule.val_store))

    optim = instantiate(cfg.optim)
    module = PretrainModule(encoder_config, objective, optim, cfg.max_steps, cfg.max_seq_len, seed=cfg.seed,
                            on_nonfinite=cfg.get("on_nonfinite", "stop"))
    budget = build_budget(cfg, datamodule, module.flops_per_token)
    if budget is not None:
        module.budget = budget
        log.info("budget: %s %s (about %s per step); max_steps is not used", f"{budget.total:.4g}", budget.kind,
                 f"{budget.expected_per_step or float('nan'):.4g}")
    max_steps = cfg.max_steps if budget is None else -1
    log.info("encoder: %s parameters; objective %s adds %s", f"{module.encoder.num_parameters():,}",
             objective.name, f"{sum(p.numel() for p in objective.parameters()):,}")

    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    logger = build_logger(cfg, run_dir, hydra_choices() if choices is None else choices)
    checkpoint = StepCheckpoint(dirpath=run_dir / "checkpoints", filename="step={step}", auto_insert_metric_name=False,
                                 every_n_train_steps=cfg.checkpoint_every, save_top_k=1, monitor="step", mode="max",
                                 save_last=True, save_on_train_epoch_end=False)
    preemption = SaveOnPreemption(run_dir / "checkpoints" / "last.ckpt")
    callbacks: list = [checkpoint, preemption]
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(TQDMProgressBar(refresh_rate=cfg.progress_refresh_rate))
    trainer: L.Trainer = instantiate(
        cfg.trainer, max_steps=max_steps, max_epochs=-1, default_root_dir=str(run_dir), logger=logger,
        callbacks=callbacks,
        val_check_interval=cfg.val_every if budget is not None else min(cfg.val_every, cfg.max_steps),
        check_val_every_n_epoch=None,
        gradient_clip_val=optim.grad_clip, use_distributed_sampler=False, accumulate_grad_batches=accumulate,
    )
    try:
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=resolve_checkpoint(cfg.ckpt_path, run_dir))
            preempted = preemption.stopped
        except SIGTERMException:  # a signal before training started, while Lightning's handler was in place
            preempted = True
        if preempted:
            log.warning("SIGTERM at step %d: %s; resume with ckpt_path=last in this run directory (or "
                        "ckpt_path=%s)", trainer.global_step,
                        f"checkpoint saved to {preemption.path}" if preemption.stopped else "stopped before training",
                        run_dir)
            raise SystemExit(143) from None
        if trainer.global_step > 0 and trainer.global_step % cfg.checkpoint_every:
            trainer.save_checkpoint(run_dir / "checkpoints" / "last.ckpt")  # the final state
        result: dict[str, Any] = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        result["global_step"] = trainer.global_step
        result["run_dir"] = str(run_dir)
        if trainer.is_global_zero and cfg.export:
            out = export_encoder(module.encoder, tokenizer, tokens, run_dir / "encoder", pretraining={
                "objective": objective.name, "run_dir": str(run_dir.resolve()), "global_step": trainer.global_step,
                "tokens_seen": float(module.tokens_seen), "flops": float(module.tokens_seen) * module.flops_per_token,
                "config": OmegaConf.to_container(cfg, resolve=True),
            })
            result["encoder_dir"] = str(out)
            log.info("exported encoder -> %s", out)
            if cfg.get("log_encoder_artifact"):
                log_encoder_artifact(logger, out, objective.name)
    finally:
        finish_logger(logger)
    return result


def log_encoder_artifact(logger, export_dir: Path, objective: str) -> None:
    """The exported encoder as a W&B model artifact of this run (uploaded by `wandb sync` when offline)."""
    from lightning.pytorch.loggers import WandbLogger

    if not isinstance(logger, WandbLogger):
        log.warning("log_encoder_artifact=true needs logger=wandb; no artifact logged")
        return
    import wandb

    run = logger.experiment
    artifact = wandb.Artifact(f"encoder-{run.id}", type="model", metadata={"objective": objective})
    artifact.add_dir(str(export_dir))
    run.log_artifact(artifact, aliases=["latest"])


def build_budget(cfg: DictConfig, datamodule: PretrainDataModule, flops_per_token: float) -> "Budget | None":
    """The one budget set in ``cfg.budget`` (tokens, flops or minutes), or None (max_steps)."""
    from pretrainlab.lit.pretrain import Budget

    chosen = {k: v for k, v in (cfg.get("budget") or {}).items() if v is not None}
    if not chosen:
        return None
    if len(chosen) > 1:
        raise ConfigError(f"set one budget, not {len(chosen)}: {', '.join(f'budget.{k}' for k in chosen)}.")
    kind, total = next(iter(chosen.items()))
    store = datamodule.train_store
    tokens_per_example = store.num_tokens / len(store) if store is not None else cfg.max_seq_len
    per_step = {"tokens": cfg.batch_size * tokens_per_example, "minutes": 0.0}
    per_step["flops"] = per_step["tokens"] * flops_per_token
    try:
        return Budget(kind, float(total), per_step[kind])
    except ValueError as e:
        raise ConfigError(str(e)) from None


def batch_split(batch_size: int, world: int, device_batch_size: int | None) -> tuple[int, int]:
    """(micro-batch per device, gradient accumulation) for a global ``batch_size`` on ``world``
    devices: batch_size = world x micro-batch x accumulation, exactly."""
    if batch_size % world:
        raise ConfigError(f"batch_size={batch_size} is not divisible by the {world} devices; the global batch "
                          f"must split evenly across devices.")
    per_device = batch_size // world
    micro = device_batch_size or per_device
    if micro > per_device or per_device % micro:
        raise ConfigError(
            f"device_batch_size={device_batch_size} does not divide the per-device batch {per_device} "
            f"(batch_size={batch_size} / {world} devices); choose a divisor of {per_device}."
        )
    return micro, per_device // micro


class StepCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` without its end-of-training ``last.ckpt``: ``run`` writes the final state
    itself, and skips it when a preemption stopped the run, whose checkpoint is the one to resume from."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass


class SaveOnPreemption(Callback):
    """On SIGTERM (preemption, ``scancel``, ``kill``): finish the optimizer step in progress, save
    ``last.ckpt`` (atomically) and stop training (``stopped`` is then true; ``train.py`` exits 143).

    During training this replaces Lightning's SIGTERM handler by one that only records the signal;
    the decision is taken at the end of each optimizer step (under DDP all ranks agree on it with one
    all-reduce), so every rank saves and stops at the same step. The checkpoint is written from
    ``on_train_batch_end``, the point Lightning's own step checkpoints are written from, so the
    resumed run repeats the uninterrupted one exactly, also when that step closed an epoch or the
    signal came in the middle of a gradient accumulation. (Lightning's handler stops right after the
    micro-batch in which the signal arrived, mid-step under accumulation, after the epoch has been
    closed at an epoch end, and under DDP runs a collective inside the signal handler, which can
    deadlock the ranks.)"""

    def __init__(self, path: Path):
        self.path = path
        self._requested = False
        self._step_at_start = -1
        self.stopped = False

    def _request(self, signum: int, frame: Any) -> None:
        self._requested = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._requested = trainer.received_sigterm  # a signal before training started
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._request)  # Lightning restores its handlers at teardown

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_at_start = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step == self._step_at_start:
            return  # inside a gradient accumulation: the step is not finished
        stop = self._requested
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop:
            trainer.save_checkpoint(self.path)
            self.stopped = trainer.should_stop = True  # ends after this step's logging; nothing else is saved


def _world_size(cfg: DictConfig) -> int:
    devices = cfg.trainer.get("devices", 1)
    nodes = cfg.trainer.get("num_nodes", 1) or 1
    if isinstance(devices, int) and devices > 0:
        return devices * nodes
    if isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        return len(devices) * nodes
    if devices in ("auto", -1, "-1"):
        accelerator = str(cfg.trainer.get("accelerator", "auto"))
        if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
            return max(1, torch.cuda.device_count()) * nodes
        return nodes
    return int(devices) * nodes
