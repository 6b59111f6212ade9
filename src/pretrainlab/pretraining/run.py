"""Compose a pretraining run from its config and run it. ``train.py`` at the repository root is
the Hydra entry point; studies and tests call :func:`run` with a composed config and a run directory.

Order matters and goes one way: checks (settings, run directory, a checkpoint to resume) ->
corpus -> tokenizer -> encoder config (vocabulary from the tokenizer) -> objective -> examples ->
budget -> LightningModule -> Trainer -> train -> final checkpoint, export, what it learned. Each
step is a function below (``validate``, ``build_*``, ``finish``); :func:`prepare` calls them in that
order until the run trains, :func:`train` from there (``pretraining.group`` prepares several runs,
then trains them together).
Exports and their provenance: ``snapshots.EncoderExport``; stopping on a signal:
``runtime.signals.SaveOnSignal``.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from hydra.utils import instantiate
from lightning.fabric.plugins import TorchCheckpointIO
from omegaconf import DictConfig

from pretrainlab.config import ConfigError, plain
from pretrainlab.data.datamodule import PretrainDataModule
from pretrainlab.data.pipeline import PretrainData
from pretrainlab.model.encoder import EncoderConfig
from pretrainlab.objectives.base import Objective, check_targets
from pretrainlab.optim import Budget, StepProgress
from pretrainlab.pretraining.assembly import Model, build_model, build_objective
from pretrainlab.pretraining.learning_log import LearningLog
from pretrainlab.pretraining.module import PretrainModule
from pretrainlab.pretraining.record import identity
from pretrainlab.pretraining.snapshots import EncoderExport, EncoderSnapshots, check_fractions
from pretrainlab.pretraining.snapshots import relabel as relabel_snapshots
from pretrainlab.pretraining.timing import StepTimer
from pretrainlab.runtime import checkpoints, hydra, wandb_runs
from pretrainlab.runtime.checkpoints import KEY as CHECKPOINT_KEY
from pretrainlab.runtime.checkpoints import check_resumable, run_info
from pretrainlab.runtime.checkpoints import save as save_checkpoint
from pretrainlab.runtime.provenance import code_history
from pretrainlab.runtime.rundir import checkpoint_to_resume, claim, is_secondary_rank, release
from pretrainlab.runtime.script import RunScript
from pretrainlab.runtime.settings import Devices, check_precision, check_pretraining, refuse_multirun_ddp
from pretrainlab.runtime.signals import SaveOnSignal, StepCheckpoint
from pretrainlab.tokens import SpecialTokens, special_tokens

log = logging.getLogger("pretrainlab")


def validate(cfg: DictConfig) -> tuple[EncoderConfig, Devices]:
    """Refuse settings that cannot work, before anything expensive happens. Builds the model and
    the objective once on the meta device (no memory), so that every one of their settings is
    checked by their own constructors; returns the encoder config (its vocabulary size provisional)
    and its devices (processes, batch split, compile settings), decided here once for the run."""
    check_pretraining(cfg)
    try:
        check_fractions(cfg.get("snapshots"))
    except ValueError as e:
        raise ConfigError(f"{e} (conf/train.yaml or the command line)") from None
    check_precision(cfg)
    refuse_multirun_ddp(cfg)
    max_pos = cfg.model.get("max_position_embeddings", 512)
    if cfg.max_seq_len > max_pos:
        raise ConfigError(
            f"max_seq_len={cfg.max_seq_len} exceeds model.max_position_embeddings={max_pos}: the model has no "
            f"position embedding beyond {max_pos}. Lower max_seq_len or raise model.max_position_embeddings."
        )
    devices = Devices.of(cfg, cfg.batch_size, cfg.get("device_batch_size"))
    instantiate(cfg.optim)
    encoder_config, objective = meta_model(cfg)
    check_schedule(cfg, objective)
    check_targets(objective, int(cfg.max_seq_len))
    check_budget_size(cfg, objective.mean_flops_per_token(encoder_config, int(cfg.max_seq_len)))
    return encoder_config, devices


def meta_model(cfg: DictConfig) -> tuple[EncoderConfig, Objective]:
    """The run's encoder config (its vocabulary provisional: ``model.vocab_size`` or 64, the tokenizer is
    not read) and its objective, built on the meta device: every setting checked, no memory used."""
    encoder_config = instantiate(cfg.model, vocab_size=cfg.model.get("vocab_size") or 64)
    placeholder = SpecialTokens(
        encoder_config.vocab_size, 0, 1, 2, 3, 4, np.zeros(encoder_config.vocab_size, dtype=bool)
    )
    with torch.device("meta"):
        return encoder_config, build_objective(cfg, encoder_config, placeholder)


def chosen_budget(cfg: DictConfig) -> tuple[str, float] | None:
    """The one budget set in ``cfg.budget`` as (kind, total), or None (a run of ``max_steps``);
    ``check_pretraining`` refuses more than one."""
    chosen = [(k, v) for k, v in (cfg.get("budget") or {}).items() if v is not None]
    return chosen[0] if chosen else None


def check_budget_size(cfg: DictConfig, flops_per_token: float) -> None:
    """Refuse a token or FLOP budget smaller than one optimizer step of the run (a typo, 2e5 for 2e15):
    the run would stop after its first step and everything measured of it would say nothing. The step is
    ``batch_size`` full sequences of ``max_seq_len`` tokens (the data is not read yet: a budget within a
    step or two of that is refused or not by how long the examples turn out, and means nothing either way);
    ``flops_per_token``: the objective's on the provisional vocabulary, which is at most the real one."""
    chosen = chosen_budget(cfg)
    if chosen is None or chosen[0] not in ("tokens", "flops"):
        return
    kind, total = chosen
    tokens = int(cfg.batch_size) * int(cfg.max_seq_len)
    step = tokens * (flops_per_token if kind == "flops" else 1.0)
    if float(total) < step:
        how = f"{cfg.batch_size} sequences x {cfg.max_seq_len} tokens" + (
            f" x {flops_per_token:.3g} FLOPs per token" if kind == "flops" else ""
        )
        raise ConfigError(
            f"budget.{kind}={float(total):.4g} is less than one optimizer step of this run (at least {step:.3g} "
            f"{'FLOPs' if kind == 'flops' else 'tokens'}: {how}): it would stop after its first step, and nothing "
            f"measured of it would mean anything. Raise budget.{kind} (a study's or slot's budget_flops, --budget-flops), or set max_steps instead."
        )


def resume_command(run_dir: Path) -> str:
    """The command that continues this run from its ``last.ckpt``."""
    overrides = [
        o
        for o in hydra.command_overrides()
        if o.split("=", 1)[0].lstrip("+~") not in ("ckpt_path", "hydra.run.dir", "overwrite")
    ]
    return " ".join(
        ["python train.py", *map(shlex.quote, overrides), shlex.quote(f"hydra.run.dir={run_dir}"), "ckpt_path=last"]
    )


def build_data(cfg: DictConfig) -> tuple[PretrainData, SpecialTokens]:
    """The run's corpus, tokenizer (trained or loaded from the cache) and held-out split, and the
    tokenizer's special tokens."""
    tokenizer_spec = instantiate(cfg.tokenizer)
    data = PretrainData(instantiate(cfg.data), tokenizer_spec, cfg.cache_dir, cfg.val_fraction, cfg.split_seed)
    return data, special_tokens(data.tokenizer, tokenizer_spec.special_tokens)


def build_budget(cfg: DictConfig, datamodule: PretrainDataModule, flops_per_token: float) -> Budget:
    """The one budget set in ``cfg.budget`` (tokens, flops or minutes; ``validate`` refuses more
    than one), else ``max_steps`` steps. ``flops_per_token``: the objective's, for the first step's
    estimate of a FLOPs budget."""
    chosen = chosen_budget(cfg)
    if chosen is None:
        return Budget("steps", cfg.max_steps)
    kind, total = chosen
    store = datamodule.train_store
    tokens_per_example = store.num_tokens / len(store) if store is not None else cfg.max_seq_len
    tokens = cfg.batch_size * tokens_per_example
    per_step = {"tokens": tokens, "flops": tokens * flops_per_token, "minutes": 0.0}[kind]
    try:
        budget = Budget(kind, float(total), per_step)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    log.info(
        "budget: %s %s (about %s per step); max_steps is not used",
        f"{budget.total:.4g}",
        budget.kind,
        f"{budget.expected_per_step or float('nan'):.4g}",
    )
    return budget


def check_schedule(cfg: DictConfig, objective: Objective) -> None:
    """An objective whose batches change over the run (``Objective.scheduled``: a masking rate that
    moves, a causal phase) follows each batch's optimizer step over the steps the budget plans:
    refuse a corpus that does not number its batches (streamed) and a budget that plans no steps
    (minutes)."""
    if not objective.scheduled:
        return
    drop = "or drop the schedule (objective.mask_rate_start=null, objective.causal_first=0)"
    if cfg.data.get("streaming"):
        raise ConfigError(
            f"objective={objective.name} changes its batches over the run (a masking-rate schedule or a causal "
            f"phase), which needs each batch's optimizer step, and a streamed corpus does not number its batches: "
            f"set data.streaming=false, {drop}."
        )
    if (cfg.get("budget") or {}).get("minutes") is not None:
        raise ConfigError(
            f"objective={objective.name} changes its batches over the run, and a budget in minutes does not say "
            f"ahead how many steps the run takes: set max_steps (with no budget), budget.tokens or budget.flops, "
            f"{drop}."
        )


def build_schedule(objective: Objective, budget: Budget) -> StepProgress | None:
    """For a scheduled objective, each optimizer step's place in the run, over the steps the budget
    plans (``check_schedule`` has refused what plans none); None for any other."""
    if not objective.scheduled:
        return None
    planned = budget.planned_steps()
    assert planned is not None, "check_schedule refuses a budget that plans no steps"
    log.info("%s: settings scheduled over %d planned optimizer steps", objective.name, planned)
    return StepProgress(planned)


def check_same_schedule(recorded: dict | None, progress: StepProgress, objective: str, checkpoint: Path | None) -> None:
    """Refuse to resume a scheduled objective's run over another number of planned steps than its
    checkpoint was trained over: every step already trained had its place in the run (its masking rate,
    its phase) fixed by that number, so the run would follow, and record, a schedule it did not follow."""
    if not recorded or recorded.get("planned_steps") == progress.planned_steps:
        return
    was = int(recorded["planned_steps"])
    raise ConfigError(
        f"{checkpoint} was trained with objective={objective}'s settings scheduled over {was} planned optimizer "
        f"steps (a masking-rate schedule or a causal phase follows the step's place in the run), and this run plans "
        f"{progress.planned_steps}: its steps so far would have had other settings than the run records. Resume "
        f"with the budget or max_steps it was planned with ({was} steps), or start a new run in another directory."
    )


def build_datamodule(cfg: DictConfig, data: PretrainData, objective: Objective, devices: Devices) -> PretrainDataModule:
    """The objective's examples of ``data`` (built, or read from the cache) and its batches, split
    by the devices; the objective learns the training split's token counts (the masked LMs'
    unigram baselines, objectives/learning.py)."""
    datamodule = PretrainDataModule(
        data,
        objective.example_builder(cfg.max_seq_len),
        objective.collator(cfg.max_seq_len if devices.static_shapes else None),
        devices.micro_batch,
        cfg.seed,
        num_workers=cfg.num_workers,
        accumulate=devices.accumulate,
    )
    datamodule.prepare()
    store = datamodule.train_store
    if store is not None:
        objective.token_counts = store.token_counts(objective.tokens.vocab_size)
        log.info(
            "examples: %d train (%d tokens), %d val", len(store), store.num_tokens, len(datamodule.val_store or ())
        )
    return datamodule


class CheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O, written atomically (:func:`checkpoints.write`) and read without
    running any code a file might carry (:func:`checkpoints.read`: ``weights_only``, clear errors)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        checkpoints.write(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        return checkpoints.read(path)


def build_trainer(
    cfg: DictConfig, script: RunScript, devices: Devices, module: PretrainModule, callbacks: list, logger: Any
) -> L.Trainer:
    """The Trainer of ``cfg.trainer`` with the run's callbacks: step checkpoints every
    ``checkpoint_every`` steps (and ``last.ckpt``), validation every ``val_every`` steps, and
    ``max_steps`` unless a budget stops the run."""
    steps = module.budget.kind == "steps"
    checkpoint = StepCheckpoint(
        dirpath=script.dir / "checkpoints",
        filename="step={step}",
        auto_insert_metric_name=False,
        every_n_train_steps=cfg.checkpoint_every,
        save_top_k=1,
        monitor="step",
        mode="max",
        save_last=True,
        save_on_train_epoch_end=False,
        enable_version_counter=False,
    )
    return instantiate(
        cfg.trainer,
        max_steps=cfg.max_steps if steps else -1,
        max_epochs=-1,
        default_root_dir=str(script.dir),
        logger=logger,
        callbacks=[*callbacks, checkpoint, LearningLog(script.dir), *script.callbacks()],
        plugins=[CheckpointIO()],
        val_check_interval=min(cfg.val_every, cfg.max_steps) if steps else cfg.val_every,
        check_val_every_n_epoch=None,
        gradient_clip_val=module.optim.grad_clip,
        use_distributed_sampler=False,
        accumulate_grad_batches=devices.accumulate,
    )


def run(
    cfg: DictConfig,
    run_dir: str | Path | None = None,
    choices: dict[str, str] | None = None,
    resume_hint: str | None = None,
) -> dict[str, Any]:
    """Pretrain as ``cfg`` says; returns the final logged metrics and the paths written.

    ``choices`` (config group -> option, logged as ``choice.<group>``) default to Hydra's runtime
    choices when running under ``train.py``. ``resume_hint``: the command that resumes this run
    after a signal stops it (a study's own command); by default the ``train.py`` command."""
    script = RunScript.of(cfg, run_dir, choices)
    run_dir = script.dir
    provisional, devices = validate(cfg)
    resume_from = checkpoint_to_resume(cfg.ckpt_path, run_dir)
    claim(run_dir, resume_from, overwrite=bool(cfg.get("overwrite", False)))
    try:
        return _run(cfg, script, provisional, devices, resume_from, resume_hint or resume_command(run_dir))
    finally:
        release(run_dir)


@dataclass
class Assembly:
    """A pretraining run as :func:`assemble` builds it, in order: corpus and tokenizer (``data``, ``tokens``)
    -> encoder config and objective (``model``) -> examples and batches (``datamodule``) -> budget ->
    schedule (``progress``, a scheduled objective's) -> the LightningModule. ``info`` is what its checkpoints
    record of the run."""

    data: PretrainData
    tokens: SpecialTokens
    data_id: dict
    model: Model
    datamodule: PretrainDataModule
    flops_per_token: float
    budget: Budget
    progress: StepProgress | None
    module: PretrainModule
    info: dict


def assemble(
    cfg: DictConfig, devices: Devices, resume_from: Path | None = None, budget: Budget | None = None
) -> Assembly:
    """Build the run ``cfg`` describes on ``devices``: the one place a pretraining run is put
    together (training, and the slot's calibration, which times the run it will train). ``resume_from``:
    the checkpoint it continues, refused before the examples are built when it is another run's (or was
    scheduled over other steps); ``budget``: how long it trains (None: the config's budget, sized with
    the examples)."""
    data, tokens = build_data(cfg)
    model = build_model(cfg, tokens)
    encoder_config, objective = model.encoder_config, model.objective
    data_id = identity(data.corpus_key, data.tokenizer_spec)
    info = run_info(plain(cfg.objective), encoder_config.to_dict(), data_id)
    recorded: dict = {}
    if resume_from is not None:
        recorded = check_resumable(resume_from, info).get(CHECKPOINT_KEY) or {}
    info["software"] = code_history(recorded.get("software"))  # the code it was trained with, over every resumption
    log.info("%s", devices.describe())
    datamodule = build_datamodule(cfg, data, objective, devices)
    flops_per_token = float(objective.mean_flops_per_token(encoder_config, cfg.max_seq_len))
    budget = budget if budget is not None else build_budget(cfg, datamodule, flops_per_token)
    progress = build_schedule(objective, budget)
    if progress is not None:
        check_same_schedule(recorded.get("schedule"), progress, objective.name, resume_from)
        info["schedule"] = {"planned_steps": progress.planned_steps}
    datamodule.progress = progress
    module = build_module(cfg, encoder_config, objective, budget, flops_per_token, info, devices, progress)
    return Assembly(data, tokens, data_id, model, datamodule, flops_per_token, budget, progress, module, info)


@dataclass
class Prepared:
    """A pretraining run built and ready to train (:func:`prepare`): its script (directory, logging,
    config), what :func:`assemble` built, the trainer with its callbacks, the logger, the export, the
    signal's stopper and the checkpoint it resumes from. :func:`train` trains it."""

    cfg: DictConfig
    script: RunScript
    built: Assembly
    trainer: L.Trainer
    logger: Any
    export: EncoderExport
    stopper: SaveOnSignal
    resume_from: Path | None

    @property
    def module(self) -> PretrainModule:
        return self.built.module


def prepare(
    cfg: DictConfig,
    script: RunScript,
    provisional: EncoderConfig,
    devices: Devices,
    resume_from: Path | None,
    resume_hint: str,
) -> Prepared:
    """Everything of the run until it trains: the process set up, corpus -> tokenizer -> encoder config
    -> objective -> examples -> budget -> module, then its config saved, its logger, export, stopper and
    trainer."""
    run_dir = script.dir
    objective_cfg = plain(cfg.objective)
    if resume_from is not None:  # before the corpus and tokenizer: refuse another run's checkpoint at once
        check_resumable(resume_from, run_info(objective_cfg, provisional.to_dict()), ignore=("vocab_size",))
    script.start()

    # corpus -> tokenizer -> encoder config -> objective -> examples -> budget -> module
    built = assemble(cfg, devices, resume_from)
    if resume_from is not None and not is_secondary_rank():
        relabel_snapshots(run_dir, built.budget)  # taken under another budget: renamed to their place in this one

    # trainer, its callbacks, the logger, the export
    script.save_config()
    logger = script.build_logger(resume=resume_from is not None)
    export = EncoderExport(
        built.data.tokenizer,
        built.tokens,
        run_dir,
        built.budget,
        script.choices,
        plain(cfg),
        built.data_id,
    )
    stopper = SaveOnSignal(run_dir / "checkpoints" / "last.ckpt", resume_hint)
    snapshots = EncoderSnapshots(list(cfg.get("snapshots") or []), run_dir, export)
    trainer = build_trainer(cfg, script, devices, built.module, [StepTimer(), stopper, snapshots], logger)
    return Prepared(cfg, script, built, trainer, logger, export, stopper, resume_from)


def train(run: Prepared) -> dict[str, Any]:
    """Train a run :func:`prepare` built: fit -> final checkpoint -> export -> what it learned; its logger
    is closed with the run's exit status whatever happens (a signal's stop exits with 128 + its number)."""
    script, trainer, module = run.script, run.trainer, run.module
    try:
        run.stopper.fit(
            trainer,
            module,
            datamodule=run.built.datamodule,
            ckpt_path=None if run.resume_from is None else str(run.resume_from),
            weights_only=True,
        )
        run.stopper.exit_if_stopped(trainer)
        result = finish(run.cfg, script.dir, trainer, module, run.export, run.logger)
        script.exit_code = 0
    except SystemExit as stop:  # a signal stopped the run: its status goes to the logger too
        script.exit_code = stop.code if isinstance(stop.code, int) else 1
        raise
    finally:
        script.finish()
    return result


def _run(
    cfg: DictConfig,
    script: RunScript,
    provisional: EncoderConfig,
    devices: Devices,
    resume_from: Path | None,
    resume_hint: str,
) -> dict[str, Any]:
    return train(prepare(cfg, script, provisional, devices, resume_from, resume_hint))


def build_module(
    cfg: DictConfig,
    encoder_config: EncoderConfig,
    objective: Objective,
    budget: Budget,
    flops_per_token: float,
    info: dict,
    devices: Devices,
    progress: StepProgress | None = None,
) -> PretrainModule:
    """The encoder and the objective in one LightningModule, optimised as ``cfg.optim`` says;
    ``progress``: a scheduled objective's steps' place in the run (``build_schedule``)."""
    module = PretrainModule(
        encoder_config,
        objective,
        instantiate(cfg.optim),
        budget,
        flops_per_token,
        seed=cfg.seed,
        on_nonfinite=cfg.get("on_nonfinite", "stop"),
        run_info=info,
        compile=devices.compile,
        progress=progress,
        seq_len=cfg.max_seq_len,
    )
    log.info(
        "encoder: %s parameters; objective %s adds %s",
        f"{module.encoder.num_parameters():,}",
        objective.name,
        f"{sum(p.numel() for p in objective.parameters()):,}",
    )
    return module


def finish(
    cfg: DictConfig, run_dir: Path, trainer: L.Trainer, module: PretrainModule, export: EncoderExport, logger: Any
) -> dict:
    """After training: the final state in ``last.ckpt`` (unless a periodic checkpoint holds it),
    the encoder exported (first rank), the result line and what each head learned; returns the
    final metrics, the step, the paths written and the learning checks."""
    if trainer.global_step > 0 and trainer.global_step % cfg.checkpoint_every:
        save_checkpoint(trainer, run_dir / "checkpoints" / "last.ckpt")
    result: dict[str, Any] = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    result["global_step"] = trainer.global_step
    result["run_dir"] = str(run_dir)
    if trainer.is_global_zero and cfg.export:
        out = export(module, run_dir / "encoder", 1.0)
        result["encoder_dir"] = str(out)
        log.info("exported encoder -> %s", out)
        if cfg.get("log_encoder_artifact"):
            wandb_runs.log_encoder_artifact(logger, out, module.objective.name)
    result["learning"] = [c.to_dict() for c in module.learning_checks]
    if trainer.is_global_zero:
        log.info("%s", summary_line(result, module.tokens_trained, run_dir))
        report_learning(module.objective.name, module.learning_checks, module.learning_states)
    return result


def report_learning(objective: str, checks: list, states: str = "") -> None:
    """Each head's last held-out check beside its trivial baseline, what the encoder's final states
    say (``states``: ``learning.states_line``), and a warning for the heads still at it."""
    for check in checks:
        log.info("learned: %s", check.line())
    if states:
        log.info("encoder: %s", states)
    if checks and all(c.at_baseline for c in checks):
        log.warning(
            "every head of %s is still at its trivial baseline on held-out text: this encoder has "
            "learned token frequencies at most, and comparing it measures nothing of its objective "
            'yet. Train longer or larger (docs/studies.md, "Has it learned?").',
            objective,
        )
    elif any(c.at_baseline for c in checks):
        log.warning(
            "%s: %s still at its trivial baseline on held-out text",
            objective,
            ", ".join(c.head for c in checks if c.at_baseline),
        )


def summary_line(result: dict, tokens: float, run_dir: Path) -> str:
    """The run's result in one line: the final validation metrics, steps, tokens, where it went."""
    metrics = " · ".join(f"{k} {v:.4g}" for k, v in sorted(result.items()) if k.startswith("val/"))
    return (
        f"finished: step {result['global_step']}, {tokens / 1e6:.3g}M tokens · {metrics or 'no validation'} · {run_dir}"
    )


__all__ = [
    "build_budget",
    "build_data",
    "build_datamodule",
    "build_schedule",
    "build_trainer",
    "check_same_schedule",
    "check_schedule",
    "meta_model",
    "prepare",
    "resume_command",
    "run",
    "train",
    "validate",
]
