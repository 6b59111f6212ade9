"""Run one evaluation on one encoder and write its results file: the evaluation the config names
(``cfg.task``, whose ``_target_`` is its class: ``evaluation.base``) fine-tunes the encoder, scores it
zero-shot or probes its frozen features; this runner does what every evaluation shares. ``finetune.py``
at the repository root is the Hydra entry point; the evaluation suite (``studies.suite``) calls
:func:`run` once per (task, seed).

``pretrained`` is a pretraining run directory, an exported encoder directory (``<run>/encoder``)
or ``hf:<dir>``; ``init=scratch`` keeps its architecture and tokenizer but starts from random
weights (``export.pretrained``).

What the runner shares: the settings checked before anything loads, the run directory claimed (a
directory holding another run's results is refused), the encoder loaded, the fine-tuning loop lent
to a fine-tuned evaluation (``evaluation.finetuning.Fitting``), a signal's handling, the logger, and the
result written atomically with what identifies it: the task, seed, encoder (the hash of its
weights), the resolved config, its score (the evaluation's) and its runtime.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic
from pretrainlab.config import ConfigError
from pretrainlab.evaluation import base, fused
from pretrainlab.evaluation.finetuning import Fitting
from pretrainlab.export.native import CONFIG, resolve_export_dir
from pretrainlab.export.pretrained import Pretrained, load_pretrained
from pretrainlab.runtime import wandb_runs
from pretrainlab.runtime.rundir import claim_results, release
from pretrainlab.runtime.script import RunScript, rerun_command
from pretrainlab.runtime.settings import Devices, check_finetuning, check_precision, uses_cuda
from pretrainlab.runtime.signals import exit_on_signal

log = logging.getLogger("pretrainlab")


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
    evaluation = base.of(cfg)
    check_finetuning(cfg)
    check_precision(cfg)
    evaluation.check()
    check_language(str(cfg.pretrained), evaluation)
    fitting = None
    if isinstance(evaluation, base.Trained) and evaluation.fine_tuned:  # batch split and optimizer, checked now
        devices = Devices.of(cfg, evaluation.batch_size, setting="task.batch_size")
        fitting = (devices, instantiate(cfg.optim))
    claim_results(run_dir, results_path, overwrite=bool(cfg.get("overwrite", False)))
    try:
        return _run(cfg, script, evaluation, fitting, results_path, resume_hint or rerun_command())
    finally:
        release(run_dir)


def run_fused(members: Sequence[tuple[DictConfig, Path, Path, dict[str, str]]], resume_hint: str) -> list[dict] | None:
    """Run the fine-tunings ``members`` ((config, run directory, results path, choices) each, of one
    task) as one group trained at once (``evaluation.fused``), each written as :func:`run` writes it;
    their results. None, with nothing written, where they cannot be fused (the log says why): the
    caller then runs them one by one."""
    prepared = []
    for cfg, run_dir, _, choices in members:
        evaluation = base.of(cfg)
        if not (isinstance(evaluation, base.FineTuned) and evaluation.fusable):
            log.info("%s is fine-tuned one run at a time: its runs cannot be fused", evaluation.name)
            return None
        check_finetuning(cfg)
        check_precision(cfg)
        evaluation.check()
        check_language(str(cfg.pretrained), evaluation)
        devices = Devices.of(cfg, evaluation.batch_size, setting="task.batch_size")
        prepared.append((cfg, RunScript.of(cfg, run_dir, choices), evaluation, devices, instantiate(cfg.optim)))
    claimed: list[Path] = []
    open_scripts: list[RunScript] = []
    try:
        for cfg, run_dir, results_path, _ in members:
            claim_results(run_dir, results_path, overwrite=bool(cfg.get("overwrite", False)))
            claimed.append(run_dir)
        streams = fused.Streams(len(members), any(uses_cuda(cfg) for cfg, *_ in prepared))
        fittings, jobs, models = [], [], []
        for m, (cfg, script, evaluation, devices, optim) in enumerate(prepared):
            script.start()  # every seed set to the run's, as for the run alone
            open_scripts.append(script)
            model = load_pretrained(cfg.pretrained, cfg.init, cfg.seed)
            _check_positions(model, evaluation)
            script.save_config()
            fitting = Fitting(cfg, script, evaluation, devices, optim, lambda _: None, resume_hint)
            jobs.append(evaluation.job(base.RunContext.of(cfg), model, fitting))
            streams.capture(m)  # where the run alone starts training
            fittings.append(fitting)
            models.append(model)
        reason = fused.refusal(fittings, [job.module.encoder for job in jobs])
        if reason is None and not fused.fusable_steps(jobs):
            reason = "the runs' training or dev sets differ in size"
        name = prepared[0][2].name
        if reason is not None:
            log.info("%s: its %d runs are fine-tuned one by one, not fused: %s", name, len(members), reason)
            return None
        log.info("%s: %d runs fine-tuned at once, fused into one model", name, len(members))
        t0 = time.time()
        with exit_on_signal(f"fine-tuning of {name} ({len(members)} runs fused)", resume_hint):
            try:
                trained = fused.fit_fused(fittings, jobs, streams)
            except RuntimeError as error:  # a device's error: the same runs one by one, with nothing lost
                log.warning(
                    "%s: fine-tuning its %d runs fused failed (%s: %s); they are fine-tuned one by one",
                    name,
                    len(members),
                    type(error).__name__,
                    error,
                    exc_info=True,
                )
                return None
        results = []
        for (cfg, script, evaluation, _, _), (_, run_dir, results_path, _), model, job, outcome in zip(
            prepared, members, models, jobs, trained, strict=True
        ):
            logger = _logger(script, evaluation, model, cfg.seed, job.eval_examples)
            if logger:
                for step, metrics in outcome.logged:  # what the run logged as it trained, in its own run
                    logger.log_metrics(metrics, step=step)
            fields = {**outcome.fields, "fused_runs": len(members)}
            result = _result(cfg, evaluation, model, fields.pop("metrics"), t0, run_dir, fields)
            atomic.write_json(results_path, result)
            if logger:
                wandb_runs.log_finetune_summary(logger, result)
                logger.finalize("success")
            log.info(
                "%s %s seed %d: %s (score %.2f)",
                evaluation.name,
                model.label,
                cfg.seed,
                ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()),
                result["score"],
            )
            script.exit_code = 0
            script.finish()
            open_scripts.remove(script)
            results.append(result)
        return results
    finally:
        for script in open_scripts:
            script.finish()
        for run_dir in claimed:
            release(run_dir)


def _check_positions(model: Pretrained, evaluation: base.Evaluation) -> None:
    max_pos = model.encoder.config.max_position_embeddings
    if evaluation.max_seq_len > max_pos:
        raise ConfigError(
            f"task.max_seq_len={evaluation.max_seq_len} exceeds the encoder's {max_pos} positions; "
            f"lower task.max_seq_len."
        )


def check_language(pretrained: str, evaluation: base.Evaluation) -> None:
    """Refuse a synthetic evaluation set (``<block>.source=synthetic``) in another synthetic language than
    the encoder was pretrained on: its export records the corpus, and a set drawn from another seed (or
    another number of topics) has other words, which the encoder has never seen (a seed-1 encoder scored
    0.49 on seed-0 minimal pairs, where the seed-0 encoder scored 0.67)."""
    data = evaluation.data
    if data.source != "synthetic" or pretrained.startswith("hf:"):
        return
    try:
        meta = json.loads((resolve_export_dir(pretrained) / CONFIG).read_text())
    except (FileNotFoundError, OSError, ValueError):
        return  # not an export (refused where it is loaded)
    corpus = ((meta.get("pretraining") or {}).get("config") or {}).get("data") or {}
    if not str(corpus.get("_target_", "")).endswith(".SyntheticCorpus"):
        return
    asked = data.synthetic_language
    trained = {"language_seed": corpus.get("seed", 0), "num_topics": corpus.get("num_topics", 8)}
    if asked != trained:
        raise ConfigError(
            f"{evaluation.data_block}.source=synthetic draws {evaluation.name}'s data from the synthetic language of "
            f"{evaluation.data_block}.synthetic.language_seed={asked['language_seed']} (num_topics={asked['num_topics']}), and "
            f"{pretrained} was pretrained on the language of data.seed={trained['language_seed']} "
            f"(num_topics={trained['num_topics']}): its words are not the encoder's. Set "
            f"{evaluation.data_block}.synthetic.language_seed={trained['language_seed']} "
            f"{evaluation.data_block}.synthetic.num_topics={trained['num_topics']}."
        )


def _run(
    cfg: DictConfig,
    script: RunScript,
    evaluation: base.Evaluation,
    fitting_setup: tuple | None,
    results_path: Path,
    resume_hint: str,
) -> dict[str, Any]:
    script.start()
    model = load_pretrained(cfg.pretrained, cfg.init, cfg.seed)
    _check_positions(model, evaluation)
    t0 = time.time()
    script.save_config()

    def make_logger(eval_examples: dict[str, int]):
        return _logger(script, evaluation, model, cfg.seed, eval_examples)

    fitting = None
    if fitting_setup is not None:
        devices, optim = fitting_setup
        assert isinstance(evaluation, base.Trained)  # what run() made a fitting for
        fitting = Fitting(cfg, script, evaluation, devices, optim, make_logger, resume_hint)
    context = base.RunContext.of(cfg)
    try:
        if fitting is not None:
            fields = evaluation.evaluate(context, model, fitting)
            logger = fitting.logger
        else:  # nothing trains: a signal stops it at once, without results
            with exit_on_signal(f"{evaluation.name} on {model.label}", resume_hint):
                fields = evaluation.evaluate(context, model, None)
            logger = make_logger(fields.get("eval_examples") or {})
            if logger:
                logger.log_metrics({f"val/{k}": v for k, v in fields["metrics"].items()})
        result = _result(cfg, evaluation, model, fields.pop("metrics"), t0, script.dir, fields)
        if fitting is None or fitting.primary:
            atomic.write_json(results_path, result)
            if logger:
                wandb_runs.log_finetune_summary(logger, result)
        log.info(
            "%s %s%s: %s (score %.2f)",
            evaluation.name,
            model.label,
            f" seed {cfg.seed}" if fitting is not None else "",
            ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()),
            result["score"],
        )
        script.exit_code = 0
    finally:
        script.finish()
    if fitting is not None:
        fitting.finish()  # a signal that came during the last evaluation: the results are written
    return result


def _logger(script: RunScript, evaluation: base.Evaluation, model: Pretrained, seed: int, eval_examples: dict):
    return script.build_logger(
        name=f"{evaluation.name}-{model.label}-s{seed}",
        group=model.source.get("wandb_group") or model.label,
        job_type="finetune",
        extra={f"pretrained.{k}": v for k, v in model.source.items()}
        | {"encoder_label": model.label}
        | {f"eval_examples.{s}": n for s, n in eval_examples.items()},
    )


def _result(
    cfg: DictConfig,
    evaluation: base.Evaluation,
    model: Pretrained,
    metrics: dict,
    t0: float,
    run_dir: Path,
    fields: dict,
) -> dict[str, Any]:
    return {
        "task": evaluation.name,
        "seed": cfg.seed,
        "label": model.label,
        "metrics": metrics,
        "score": evaluation.score(metrics),
        **fields,
        "pretrained": model.source,
        "runtime_s": round(time.time() - t0, 2),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "run_dir": str(run_dir),
    }


__all__ = ["check_language", "run", "run_fused"]
