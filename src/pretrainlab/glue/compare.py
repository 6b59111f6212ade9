"""Compare encoders on GLUE: objective x task, mean ± std over seeds, and a GLUE score.

Conventions (also printed under every table):

- a task's **score** is the mean of its metrics x 100 (MRPC/QQP: F1 and accuracy; STS-B: Pearson and
  Spearman; MNLI: matched and mismatched accuracy; CoLA: Matthews correlation x 100);
- the **GLUE score** of an encoder is the mean of its task scores over the tasks every compared
  encoder has, leaving out WNLI as the BERT paper did (Devlin et al., 2019, Table 1);
- mean ± std are over seeds (std with ddof=1; 0 for a single seed).

Inputs are results files (``experiments/glue.py`` and ``finetune.py`` write them) found under the
given directories, or the fine-tuning runs of a W&B project (``wandb:<entity>/<project>``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections import defaultdict
from pathlib import Path

import numpy as np

from pretrainlab.glue.tasks import TASKS

log = logging.getLogger("pretrainlab")

EXCLUDED_FROM_GLUE_SCORE = ("wnli",)
ORDER = list(TASKS)
NAMES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "mnli": "MNLI",
         "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


def is_result(d: object) -> bool:
    return isinstance(d, dict) and "task" in d and "metrics" in d and "label" in d and "seed" in d


def collect(sources: list[str]) -> list[dict]:
    """Results from directories (searched recursively for results JSON files) and W&B projects."""
    results: list[dict] = []
    for src in sources:
        if str(src).startswith("wandb:"):
            results += collect_wandb(str(src)[len("wandb:"):])
            continue
        p = Path(src).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"{src}: no such results directory or file.")
        files = [p] if p.is_file() else sorted(p.rglob("*.json"))
        for f in files:
            try:
                d = json.loads(f.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError, OSError):
                continue
            if is_result(d):
                results.append(d)
    # the same (label, task, seed) reached twice (e.g. a run dir and its glue/ dir): keep one
    unique = {(r["label"], r["task"], r["seed"]): r for r in results}
    if not unique:
        raise FileNotFoundError(f"no GLUE results found in {', '.join(map(str, sources))}.")
    return list(unique.values())


def collect_wandb(project: str) -> list[dict]:
    """Fine-tuning runs of a W&B project (``entity/project``), from their config and summary."""
    import wandb

    results = []
    for run in wandb.Api().runs(project, filters={"jobType": "finetune"}):
        task = run.config.get("task.name") or (run.config.get("task") or {}).get("name")
        if task is None:
            continue
        prefix = f"glue/{task}/"
        metrics = {k[len(prefix):]: float(v) for k, v in run.summary.items()
                   if k.startswith(prefix) and k != prefix + "score"}
        if metrics:
            results.append({"task": task, "seed": run.config.get("seed", 0), "metrics": metrics,
                            "label": run.config.get("encoder_label", run.group or run.name)})
    return results


def _mean_std(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def aggregate(results: list[dict]) -> dict:
    """{"labels", "tasks", "cells": {label: {task: {...}}}, "glue": {label: {...}}, "glue_tasks"}."""
    by = defaultdict(lambda: defaultdict(list))
    for r in results:
        by[r["label"]][r["task"]].append(r)
    labels = sorted(by, key=lambda x: (x == "scratch", x))
    tasks = [t for t in ORDER if any(t in by[label] for label in labels)]
    cells: dict = {}
    for label in labels:
        cells[label] = {}
        for task, runs in by[label].items():
            names = list(runs[0]["metrics"])
            metric_stats = {m: _mean_std([100.0 * r["metrics"][m] for r in runs]) for m in names}
            score = _mean_std([100.0 * float(np.mean(list(r["metrics"].values()))) for r in runs])
            cells[label][task] = {"metrics": metric_stats, "score": score, "seeds": sorted(r["seed"] for r in runs)}
    glue_tasks = [t for t in tasks if t not in EXCLUDED_FROM_GLUE_SCORE and all(t in cells[lb] for lb in labels)]
    glue = {}
    for label in labels:
        if glue_tasks:
            means = [cells[label][t]["score"][0] for t in glue_tasks]
            # the std of the GLUE score: over seeds present in every task
            seeds = set.intersection(*(set(cells[label][t]["seeds"]) for t in glue_tasks))
            per_seed = []
            for s in sorted(seeds):
                per_seed.append(np.mean([100.0 * np.mean(list(r["metrics"].values()))
                                         for t in glue_tasks for r in by[label][t] if r["seed"] == s]))
            glue[label] = {"score": (float(np.mean(means)), _mean_std(per_seed)[1] if per_seed else 0.0)}
    return {"labels": labels, "tasks": tasks, "cells": cells, "glue": glue, "glue_tasks": glue_tasks}


def _fmt(ms: tuple[float, float]) -> str:
    return f"{ms[0]:.1f} ± {ms[1]:.1f}"


def to_markdown(table: dict) -> str:
    tasks = table["tasks"]
    header = ["encoder"] + [f"{NAMES[t]} ({'/'.join(_metric_short(m) for m in TASKS[t].metric_names())})"
                            for t in tasks] + ["GLUE"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label in table["labels"]:
        row = [label]
        for t in tasks:
            c = table["cells"][label].get(t)
            row.append(" / ".join(_fmt(v) for v in c["metrics"].values()) if c else "–")
        g = table["glue"].get(label)
        row.append(_fmt(g["score"]) if g else "–")
        lines.append("| " + " | ".join(row) + " |")
    seeds = sorted({len(c["seeds"]) for lb in table["labels"] for c in table["cells"][lb].values()})
    lines.append("")
    lines.append(f"Dev-set metrics x 100 after the last fine-tuning epoch, mean ± std over {'/'.join(map(str, seeds))} "
                 f"seed(s). GLUE = mean task score (a task's score is the mean of its metrics) over "
                 f"{', '.join(NAMES[t] for t in table['glue_tasks']) or 'no common task'}; WNLI excluded as in BERT.")
    return "\n".join(lines)


def _metric_short(m: str) -> str:
    return {"accuracy": "acc", "mcc": "MCC", "f1": "F1", "pearson": "P", "spearman": "S"}.get(
        m.split("_")[0], m) + ("-" + m.split("_")[1] if "_" in m else "")


def to_csv(table: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["encoder", "task", "metric", "mean", "std", "seeds"])
    for label in table["labels"]:
        for t in table["tasks"]:
            c = table["cells"][label].get(t)
            if not c:
                continue
            for m, (mean, std) in c["metrics"].items():
                w.writerow([label, t, m, f"{mean:.4f}", f"{std:.4f}", len(c["seeds"])])
            w.writerow([label, t, "score", f"{c['score'][0]:.4f}", f"{c['score'][1]:.4f}", len(c["seeds"])])
        if label in table["glue"]:
            mean, std = table["glue"][label]["score"]
            w.writerow([label, "glue", "score", f"{mean:.4f}", f"{std:.4f}", ""])
    return out.getvalue()


def plot(table: dict, path: Path) -> Path:
    """Grouped bars: task scores (and the GLUE score) per encoder, with ± std error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = table["tasks"] + (["glue"] if table["glue"] else [])
    labels = table["labels"]
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) * max(1, len(labels)) * 0.5 + 2), 4.2))
    x = np.arange(len(groups))
    for i, label in enumerate(labels):
        means, stds = [], []
        for g in groups:
            if g == "glue":
                ms = table["glue"].get(label, {}).get("score", (np.nan, 0.0))
            else:
                c = table["cells"][label].get(g)
                ms = c["score"] if c else (np.nan, 0.0)
            means.append(ms[0])
            stds.append(ms[1])
        ax.bar(x + (i - (len(labels) - 1) / 2) * width, means, width, yerr=stds, capsize=3, label=label)
    ax.set_xticks(x, [NAMES.get(g, "GLUE") for g in groups])
    ax.set_ylabel("dev score (x 100)")
    ax.set_title("GLUE dev scores, mean ± std over seeds")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(results: list[dict], out_dir: str | Path) -> dict:
    """comparison.md, comparison.csv, comparison.png and comparison.json in ``out_dir``."""
    from pretrainlab.data.tokenizer import atomic_write_text

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = aggregate(results)
    atomic_write_text(out / "comparison.md", to_markdown(table) + "\n")
    atomic_write_text(out / "comparison.csv", to_csv(table))
    atomic_write_text(out / "comparison.json", json.dumps(table, indent=2))
    plot(table, out / "comparison.png")
    return table


def log_to_wandb(table: dict, out_dir: Path, project: str = "pretrainlab", mode: str = "offline",
                 group: str | None = None, entity: str | None = None) -> str:
    """The comparison as a W&B table, an image and the run summary (one number per encoder)."""
    import wandb

    run = wandb.init(project=project, entity=entity, mode=mode, job_type="compare", group=group,
                     dir=str(out_dir), name=f"compare-{group}" if group else "compare", reinit="finish_previous")
    rows = []
    for label in table["labels"]:
        for t in table["tasks"]:
            c = table["cells"][label].get(t)
            if c:
                for m, (mean, std) in c["metrics"].items():
                    rows.append([label, t, m, mean, std, len(c["seeds"])])
    run.log({"glue/table": wandb.Table(columns=["encoder", "task", "metric", "mean", "std", "seeds"], data=rows),
             "glue/plot": wandb.Image(str(out_dir / "comparison.png"))})
    for label, g in table["glue"].items():
        run.summary[f"glue_score/{label}"] = g["score"][0]
    for label in table["labels"]:
        for t, c in table["cells"][label].items():
            run.summary[f"{t}/{label}"] = c["score"][0]
    run_dir = run.dir
    run.finish()
    return run_dir
