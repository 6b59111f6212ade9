"""Compose a pretraining run from its config and run it. ``train.py`` at the repository root is
the Hydra entry point; tests call :func:`run` with a composed config and a run directory.

Order matters and goes one way: corpus -> tokenizer -> encoder config (vocabulary from the
tokenizer) -> objective -> examples -> LightningModule -> Trainer -> export.
"""

from __future__ import annotations

import logging
import shlex
import signal
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from pretrainlab.checkpoint import CheckpointIO, check_resumable, run_info
from pretrainlab.checkpoint import save as save_checkpoint
from pretrainlab.data.pretrain import PretrainData, PretrainDataModule
from pretrainlab.data.tokenizer import special_tokens
from pretrainlab.export import export_encoder
from pretrainlab.lit.pretrain import PretrainModule
from pretrainlab.loggers import build_logger, finish_logger
from pretrainlab.memory import keep_freed_memory
from pretrainlab.model.encoder import ConfigError, EncoderConfig
from pretrainlab.preemption import SaveOnSignal, StepCheckpoint
from pretrainlab.rundir import checkpoint_to_resume, claim
from pretrainlab.settings import check_pretraining
from pretrainlab.tokens import SpecialTokens

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


def validate(cfg: DictConfig) -> EncoderConfig:
    """Refuse settings that cannot work, before anything expensive happens. Builds the model and
    the objective once on the meta device (no memory), so that every one of their settings is
    checked by their own constructors; returns the encoder config (its vocabulary size provisional)."""
    check_pretraining(cfg)
    validate_precision(cfg)
    _refuse_multirun_ddp(cfg)
    max_pos = cfg.model.get("max_position_embeddings", 512)
    if cfg.max_seq_len > max_pos:
        raise ConfigError(
            f"max_seq_len={cfg.max_seq_len} exceeds model.max_position_embeddings={max_pos}: the model has no "
            f"position embedding beyond {max_pos}. Lower max_seq_len or raise model.max_position_embeddings."
        )
    batch_split(cfg.batch_size, _world_size(cfg), cfg.get("device_batch_size"))
    instantiate(cfg.optim)
    encoder_config = instantiate(cfg.model, vocab_size=cfg.model.get("vocab_size") or 64)
    placeholder = SpecialTokens(encoder_config.vocab_size, 0, 1, 2, 3, 4,
                                np.zeros(encoder_config.vocab_size, dtype=bool))
    with torch.device("meta"):
        build_objective(cfg, encoder_config, placeholder)
    return encoder_config


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
    p = checkpoint_to_resume(ckpt_path, Path(run_dir))
    return None if p is None else str(p)


def resume_command(run_dir: Path) -> str:
    """The command that continues this run from its ``last.ckpt``."""
    overrides: list[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            overrides = [o for o in HydraConfig.get().overrides.task
                         if not o.split("=", 1)[0].lstrip("+~") in ("ckpt_path", "hydra.run.dir", "overwrite")]
    except ImportError:  # pragma: no cover
        pass
    return " ".join(["python train.py", *map(shlex.quote, overrides), shlex.quote(f"hydra.run.dir={run_dir}"),
                     "ckpt_path=last"])


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
    provisional = validate(cfg)
    resume_from = checkpoint_to_resume(cfg.ckpt_path, run_dir)
    claim(run_dir, resume_from, overwrite=bool(cfg.get("overwrite", False)))
    objective_cfg = OmegaConf.to_container(cfg.objective, resolve=True)
    if resume_from is not None:  # before the corpus and tokenizer: refuse another run's checkpoint at once
        check_resumable(resume_from, run_info(objective_cfg, provisional.to_dict()), ignore=("vocab_size",))
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.get("keep_freed_memory", True):
        keep_freed_memory()
    L.seed_everything(cfg.seed, workers=True, verbose=False)

    corpus = instantiate(cfg.data)
    tokenizer_spec = instantiate(cfg.tokenizer)
    data = PretrainData(corpus, tokenizer_spec, cfg.cache_dir, cfg.val_fraction, cfg.split_seed)
    tokenizer = data.tokenizer
    tokens = special_tokens(tokenizer, tokenizer_spec.special_tokens)
    encoder_config = build_encoder_config(cfg, tokens.vocab_size)
    info = run_info(objective_cfg, encoder_config.to_dict())
    if resume_from is not None:
        check_resumable(resume_from, info)
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
                            on_nonfinite=cfg.get("on_nonfinite", "stop"), run_info=info)
    budget = build_budget(cfg, datamodule, module.flops_per_token)
    if budget is not None:
        module.budget = budget
        log.info("budget: %s %s (about %s per step); max_steps is not used", f"{budget.total:.4g}", budget.kind,
                 f"{budget.expected_per_step or float('nan'):.4g}")
    max_steps = cfg.max_steps if budget is None else -1
    log.info("encoder: %s parameters; objective %s adds %s", f"{module.encoder.num_parameters():,}",
             objective.name, f"{sum(p.numel() for p in objective.parameters()):,}")

    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    logger = build_logger(cfg, run_dir, hydra_choices() if choices is None else choices,
                          resume=resume_from is not None)
    checkpoint = StepCheckpoint(dirpath=run_dir / "checkpoints", filename="step={step}", auto_insert_metric_name=False,
                                 every_n_train_steps=cfg.checkpoint_every, save_top_k=1, monitor="step", mode="max",
                                 save_last=True, save_on_train_epoch_end=False)
    stopper = SaveOnSignal(run_dir / "checkpoints" / "last.ckpt")
    callbacks: list = [checkpoint, stopper]
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(TQDMProgressBar(refresh_rate=cfg.progress_refresh_rate))
    trainer: L.Trainer = instantiate(
        cfg.trainer, max_steps=max_steps, max_epochs=-1, default_root_dir=str(run_dir), logger=logger,
        callbacks=callbacks, plugins=[CheckpointIO()],
        val_check_interval=cfg.val_every if budget is not None else min(cfg.val_every, cfg.max_steps),
        check_val_every_n_epoch=None,
        gradient_clip_val=optim.grad_clip, use_distributed_sampler=False, accumulate_grad_batches=accumulate,
    )
    exit_code = 1  # anything that does not reach the end is a failure, for W&B too
    try:
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=None if resume_from is None else str(resume_from),
                        weights_only=True)
        except SIGTERMException:  # a signal before training started, while Lightning's handler was in place
            stopper.signum = signal.SIGTERM
        except SystemExit:  # Lightning's answer to a KeyboardInterrupt it caught (recorded by the stopper)
            if stopper.signum is None:
                raise
        if stopper.signum is not None:
            exit_code = stopper.exit_code
            name = signal.Signals(stopper.signum).name
            saved = (f"checkpoint saved at step {trainer.global_step} to {stopper.path}" if stopper.stopped else
                     "stopped without saving; the last checkpoint written is the one to resume from")
            log.warning("%s: %s. Resume with:\n  %s", name, saved, resume_command(run_dir))
            raise SystemExit(exit_code) from None
        if trainer.global_step > 0 and trainer.global_step % cfg.checkpoint_every:
            save_checkpoint(trainer, run_dir / "checkpoints" / "last.ckpt")  # the final state
        result: dict[str, Any] = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        result["global_step"] = trainer.global_step
        result["run_dir"] = str(run_dir)
        if trainer.is_global_zero and cfg.export:
            out = export_encoder(module.encoder, tokenizer, tokens, run_dir / "encoder", pretraining={
                "objective": objective.name, "run_dir": str(run_dir.resolve()), "global_step": trainer.global_step,
                "tokens_seen": float(module.tokens_seen), "flops": float(module.tokens_seen) * module.flops_per_token,
                "choices": hydra_choices() if choices is None else choices,
                "config": OmegaConf.to_container(cfg, resolve=True),
            })
            result["encoder_dir"] = str(out)
            log.info("exported encoder -> %s", out)
            if cfg.get("log_encoder_artifact"):
                log_encoder_artifact(logger, out, objective.name)
        exit_code = 0
    finally:
        finish_logger(logger, exit_code)
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
