"""Everything pretrainlab says to Weights & Biases or reads from it, in one place.

W&B runs are written under the run directory (``<run_dir>/wandb/offline-run-*``, offline by
default) and can be uploaded later with ``wandb sync``; online works unchanged with an API key.

    WandbLogger          Lightning's logger, quiet (``conf/logger/wandb.yaml``)
    init_kwargs          a run's name, group, job type, and the id that continues a resumed run
    remember_id          ``<run>/.wandb_id``: the run's W&B id and where it was started;
    read_wandb_id        read by a resumed run and by fine-tuning (to link its encoder's run)
    finish               close the run with the exit code, tagged when a signal stopped it
    log_encoder_artifact the exported encoder as a model artifact
    log_finetune_summary a fine-tuning result in the run summary (``glue/score`` for sweeps)
    finetune_results     the fine-tuning results of a W&B project, for a comparison
    log_comparison       a comparison report: tables, figures, the learning checks, summaries
    enabled              whether a logger config logs to W&B
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch import loggers as pl_loggers
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from pretrainlab.runtime.early import logs_to_wandb

log = logging.getLogger("pretrainlab")


class WandbLogger(pl_loggers.WandbLogger):
    """Lightning's W&B logger, less the ``anonymous`` argument it always passes to ``wandb.init``:
    wandb deprecated that setting and warns about it at every run, even when it is None."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)


enabled = logs_to_wandb  # whether a logger config logs to W&B (runtime.early, which imports no torch)


def init_kwargs(logger_cfg: Any, run_dir: Path, name: str, group: str, job_type: str, resume: bool) -> dict[str, Any]:
    """``name`` and ``group`` unless the logger config sets its own, ``job_type``; for a ``resume``d
    run, the id of the W&B run started in this directory (``resume="allow"``)."""
    kwargs: dict[str, Any] = {
        "name": logger_cfg.get("name") or name,
        "group": logger_cfg.get("group") or group,
        "job_type": job_type,
    }
    # a resumed run continues the same W&B run: the one started in this directory (a copy of a run
    # directory starts its own, or the copy's logs would be merged into the original's W&B run)
    wandb_id, written_in = read_wandb_id(run_dir)
    if logger_cfg.get("id") is None and resume and wandb_id:
        if written_in is None or written_in == str(run_dir.resolve()):
            kwargs["id"] = wandb_id
            kwargs["resume"] = "allow"
        else:
            log.info(
                "%s continues a run copied from %s: a new W&B run is started (continuing its W&B run %s "
                "would merge the two)",
                run_dir,
                written_in,
                wandb_id,
            )
    return kwargs


@rank_zero_only
def remember_id(logger: pl_loggers.WandbLogger, path: Path) -> None:
    """``.wandb_id``: the W&B run's id, and on a second line the run directory it was started in."""
    path.write_text(f"{logger.experiment.id}\n{path.parent.resolve()}\n")


def read_wandb_id(run_dir: Path) -> tuple[str | None, str | None]:
    """(W&B run id, the directory it was started in) from ``<run_dir>/.wandb_id``; the directory is
    None in files written before it was recorded; (None, None) without the file."""
    path = Path(run_dir) / ".wandb_id"
    if not path.is_file():
        return None, None
    lines = path.read_text().splitlines()
    return (lines[0].strip() or None) if lines else None, (lines[1].strip() or None) if len(lines) > 1 else None


STOPPED = {130: "interrupted", 143: "preempted"}  # exit codes of SIGINT and SIGTERM


@rank_zero_only
def finish(logger: Logger | bool, exit_code: int = 0) -> None:
    """Close the W&B run with the run's exit code, so that the next run in this process (multirun,
    tests) starts a new one. A run that did not finish is stored as failed (non-zero exit code);
    one stopped by Ctrl-C or SIGTERM also gets the tag and summary ``stopped`` "interrupted" or
    "preempted"."""
    if isinstance(logger, pl_loggers.WandbLogger):
        import wandb

        run: Any = logger._experiment or wandb.run  # its own run (several may be open: a fused group's)
        if run is None:
            return
        if exit_code in STOPPED:
            run.tags = tuple(run.tags or ()) + (STOPPED[exit_code],)
            run.summary["stopped"] = STOPPED[exit_code]
        run.finish(exit_code=exit_code)


def log_encoder_artifact(logger, export_dir: Path, objective: str) -> None:
    """The exported encoder as a W&B model artifact of this run (uploaded by `wandb sync` when offline)."""
    if not isinstance(logger, pl_loggers.WandbLogger):
        log.warning("log_encoder_artifact=true needs logger=wandb; no artifact logged")
        return
    import wandb

    run = logger.experiment
    artifact = wandb.Artifact(f"encoder-{run.id}", type="model", metadata={"objective": objective})
    artifact.add_dir(str(export_dir))
    run.log_artifact(artifact, aliases=["latest"])


def log_finetune_summary(logger: Any, result: dict) -> None:
    """A fine-tuning result's metrics and task score in the W&B run summary (nothing for other loggers)."""
    if isinstance(logger, pl_loggers.WandbLogger):
        summary = logger.experiment.summary
        for k, v in result["metrics"].items():
            summary[f"glue/{result['task']}/{k}"] = v
        summary[f"glue/{result['task']}/score"] = result["score"]
        summary["glue/score"] = result["score"]  # one key for every task: the metric of sweeps/glue.yaml


def finetune_results(project: str) -> list[dict]:
    """Fine-tuning runs of a W&B project (``entity/project``), from their config and summary."""
    import wandb

    results = []
    for run in wandb.Api().runs(project, filters={"jobType": "finetune"}):
        task = run.config.get("task.name") or (run.config.get("task") or {}).get("name")
        if task is None:
            continue
        prefix = f"glue/{task}/"
        metrics = {
            k[len(prefix) :]: float(v) for k, v in run.summary.items() if k.startswith(prefix) and k != prefix + "score"
        }
        if metrics:
            pretrained = {k[len("pretrained.") :]: v for k, v in run.config.items() if k.startswith("pretrained.")}
            results.append(
                {
                    "task": task,
                    "seed": run.config.get("seed", 0),
                    "metrics": metrics,
                    "label": run.config.get("encoder_label", run.group or run.name),
                    "pretrained": pretrained,
                    "run_dir": f"wandb:{project}/{run.id}",
                    "eval_examples": {
                        k[len("eval_examples.") :]: v for k, v in run.config.items() if k.startswith("eval_examples.")
                    }
                    or None,
                }
            )
    return results


def log_comparison(
    table: dict,
    out_dir: Path,
    project: str = "pretrainlab",
    mode: str = "offline",
    group: str | None = None,
    entity: str | None = None,
) -> str:
    """The comparison as a W&B table, an image and the run summary (one number per encoder)."""
    import wandb

    run = wandb.init(
        project=project,
        entity=entity,
        mode=mode,  # type: ignore[arg-type]  # checked by the caller: online | offline | disabled
        job_type="compare",
        group=group,
        dir=str(out_dir),
        name=f"compare-{group}" if group else "compare",
        reinit="finish_previous",
    )
    rows = []
    for label in table["labels"]:
        for t in table["tasks"]:
            c = table["cells"][label].get(t)
            if c:
                for m, (mean, std) in c["metrics"].items():
                    rows.append([label, t, m, mean, std, len(c["seeds"])])
    run.log(
        {
            "glue/table": wandb.Table(columns=["encoder", "task", "metric", "mean", "std", "seeds"], data=rows),
            "glue/plot": wandb.Image(str(out_dir / "comparison.png")),
        }
    )
    lines = table.get("curve") or {}
    if lines:  # GLUE against pretraining FLOPs: a line chart of the points, the table behind it, the PNG
        labels = sorted(lines)
        run.log(
            {
                "glue/curve": wandb.plot.line_series(
                    xs=[[p["flops"] for p in lines[lb]] for lb in labels],
                    ys=[[p["glue"] for p in lines[lb]] for lb in labels],
                    keys=labels,
                    title="GLUE score against pretraining FLOPs",
                    xname="pretraining FLOPs",
                ),
                "glue/curve_points": wandb.Table(
                    columns=["encoder", "fraction", "flops", "glue", "ci_low", "ci_high"],
                    data=[
                        [lb, p["fraction"], p["flops"], p["glue"], *(p["ci"] or (None, None))]
                        for lb in labels
                        for p in lines[lb]
                    ],
                ),
                "glue/curve_plot": wandb.Image(str(out_dir / "curve.png")),
            }
        )
    if table.get("learning"):  # what each run learned beside its trivial baseline, and which have not yet
        run.log(
            {
                "learning/table": wandb.Table(
                    columns=["run", "head", "held_out", "baseline", "baseline_name", "status"],
                    data=[
                        [name, c["head"], c["value"], c["baseline"], c["baseline_name"], c["status"]]
                        for name, row in sorted(table["learning"].items())
                        for c in row["checks"]
                    ],
                )
            }
        )
        flagged = sorted(
            name for name, row in table["learning"].items() if any(c["status"] == "at baseline" for c in row["checks"])
        )
        run.summary["learning/runs_at_baseline"] = len(flagged)
        run.summary["learning/at_baseline"] = ", ".join(flagged) or "none"
    for label, g in table["glue"].items():
        run.summary[f"glue_score/{label}"] = g["score"][0]
    for label in table["labels"]:
        for t, c in table["cells"][label].items():
            run.summary[f"{t}/{label}"] = c["score"][0]
    run_dir = run.dir
    run.finish()
    return run_dir


__all__ = [
    "WandbLogger",
    "enabled",
    "finetune_results",
    "finish",
    "init_kwargs",
    "log_comparison",
    "log_encoder_artifact",
    "log_finetune_summary",
    "read_wandb_id",
    "remember_id",
]
