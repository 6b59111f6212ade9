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

from pretrainlab import atomic
from pretrainlab.glue.tasks import TASKS, display_name, task_score

log = logging.getLogger("pretrainlab")

EXCLUDED_FROM_GLUE_SCORE = ("wnli",)
ORDER = list(TASKS)


class CompareError(ValueError):
    """Results that cannot be put side by side without misreporting one of them."""


def is_result(d: object) -> bool:
    return isinstance(d, dict) and "task" in d and "metrics" in d and "label" in d and "seed" in d


def encoder_of(r: dict) -> dict:
    """Who produced a result: ``id`` (the encoder's weights hash; for init=scratch, its architecture
    and tokenizer), ``label`` (objective, ``scratch``, ``hf:<name>``), ``model`` (the model preset or
    the encoder's shape), ``pretrain_seed`` and where it came from. Results written before the
    hash was recorded are identified by their encoder's path."""
    p = r.get("pretrained") or {}
    label = r.get("label_override") or r["label"]
    return {"id": p.get("encoder_id") or p.get("path") or label, "label": label, "model": p.get("model"),
            "pretrain_seed": p.get("pretrain_seed"), "source": p.get("run_dir") or p.get("path") or "?"}


def collect(sources: list[str], labels: dict[str, str] | None = None) -> list[dict]:
    """Results from directories (searched recursively for results JSON files) and W&B projects.
    ``labels`` (source -> name) relabels the results found under a source.

    The same result reached twice (a run directory and its ``glue/``) counts once; two different
    fine-tuning runs of one encoder, task and seed are refused, since one would hide the other."""
    results: list[dict] = []
    labels = {str(Path(k).expanduser().resolve()) if not k.startswith("wandb:") else k: v
              for k, v in (labels or {}).items()}
    for src in sources:
        found: list[dict] = []
        if str(src).startswith("wandb:"):
            found = collect_wandb(str(src)[len("wandb:"):])
            key = str(src)
        else:
            p = Path(src).expanduser()
            if not p.exists():
                raise FileNotFoundError(f"{src}: no such results directory or file.")
            key = str(p.resolve())
            for f in [p] if p.is_file() else sorted(p.rglob("*.json")):
                try:
                    d = json.loads(f.read_text())
                except (json.JSONDecodeError, UnicodeDecodeError, OSError):
                    continue
                if is_result(d):
                    d.setdefault("run_dir", str(f.parent))
                    found.append(d)
        for d in found:
            if key in labels:
                d["label_override"] = labels[key]
        results += found
    unique: dict[tuple, dict] = {}
    for r in results:
        k = (encoder_of(r)["id"], encoder_of(r)["label"], r["task"], r["seed"])
        if k in unique and unique[k].get("run_dir") != r.get("run_dir"):
            raise CompareError(
                f"{r['task']} seed {r['seed']} of encoder {encoder_of(r)['source']} was fine-tuned twice: "
                f"{unique[k].get('run_dir')} and {r.get('run_dir')}. Compare one of them (move the other away)."
            )
        unique[k] = r
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
            pretrained = {k[len("pretrained."):]: v for k, v in run.config.items() if k.startswith("pretrained.")}
            results.append({"task": task, "seed": run.config.get("seed", 0), "metrics": metrics,
                            "label": run.config.get("encoder_label", run.group or run.name),
                            "pretrained": pretrained, "run_dir": f"wandb:{project}/{run.id}",
                            "eval_examples": {k[len("eval_examples."):]: v for k, v in run.config.items()
                                              if k.startswith("eval_examples.")} or None})
    return results


def _mean_std(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def two_level(values: dict[str, list[float]]) -> tuple[float, float, float | None]:
    """(mean, sd over fine-tuning seeds, sd over pretraining seeds) of scores grouped by encoder
    (one pretraining seed each): the mean of the encoders' means; the fine-tuning sd pooled within
    encoders (ddof 1; 0 when every encoder has one seed); the sd of the encoders' means (ddof 1;
    None for a single encoder)."""
    means = [float(np.mean(v)) for v in values.values()]
    within = [float(np.var(v, ddof=1)) for v in values.values() if len(v) > 1]
    sd_ft = float(np.sqrt(np.mean(within))) if within else 0.0
    sd_pt = float(np.std(means, ddof=1)) if len(means) > 1 else None
    return float(np.mean(means)), sd_ft, sd_pt


def row_labels(results: list[dict]) -> dict[str, str]:
    """Encoder id -> its row: the label, with the model when the results span several models.
    Pretraining seeds of one (label, model) share a row; two encoders claiming the same label,
    model and pretraining seed are refused."""
    encoders = {}
    for r in results:
        e = encoder_of(r)
        encoders.setdefault(e["id"], e)
    models = {e["model"] for e in encoders.values()}
    several = len(models) > 1
    rows, claimed = {}, {}
    for eid, e in encoders.items():
        row = f"{e['label']} ({e['model'] or '?'})" if several else e["label"]
        rows[eid] = row
        key = (row, e["pretrain_seed"])
        if key in claimed and claimed[key]["id"] != eid:
            other = claimed[key]
            seed = "" if e["pretrain_seed"] is None else f", pretraining seed {e['pretrain_seed']}"
            raise CompareError(
                f"two different encoders are both '{row}'{seed}: {other['source']} and {e['source']}. Their results "
                f"would be mixed in one row. Compare them in separate reports, or name them apart with "
                f"--label <results dir>=<name>."
            )
        claimed[key] = e
    return rows


def _check_example_counts(results: list[dict]) -> None:
    """Results of one task must be scored on the same examples."""
    by_task: dict[str, dict] = defaultdict(dict)
    for r in results:
        counts = r.get("eval_examples")
        if counts is None:
            continue
        by_task[r["task"]].setdefault(json.dumps(counts, sort_keys=True), r)
    for task, seen in by_task.items():
        if len(seen) > 1:
            listed = "; ".join(f"{encoder_of(r)['source']}: {counts}" for counts, r in seen.items())
            raise CompareError(f"{task} results were evaluated on different numbers of examples ({listed}); scores on "
                               f"different dev sets are not comparable. Re-run them on the same data "
                               f"(glue.max_eval_examples, glue.source).")


def aggregate(results: list[dict]) -> dict:
    """{"labels", "tasks", "cells": {label: {task: {...}}}, "glue": {label: {...}}, "glue_tasks",
    "encoders": {label: [...]}}.

    A cell's ``metrics`` and ``score`` are (mean, sd over fine-tuning seeds) and ``pretrain_sd``
    the sd over pretraining seeds (None with one); see :func:`two_level`."""
    _check_example_counts(results)
    rows = row_labels(results)
    by: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))  # row -> task -> encoder -> runs
    encoders: dict = defaultdict(dict)
    for r in results:
        e = encoder_of(r)
        by[rows[e["id"]]][r["task"]][e["id"]].append(r)
        encoders[rows[e["id"]]][e["id"]] = {"pretrain_seed": e["pretrain_seed"], "source": e["source"]}
    labels = sorted(by, key=lambda x: (x.startswith("scratch"), x))
    tasks = [t for t in ORDER if any(t in by[label] for label in labels)]

    def score(r: dict) -> float:
        return task_score(r["metrics"])

    cells: dict = {}
    for label in labels:
        cells[label] = {}
        for task, per_encoder in by[label].items():
            names = list(next(iter(per_encoder.values()))[0]["metrics"])
            metric_stats, pretrain_sd = {}, {}
            for m in names:
                mean, sd_ft, sd_pt = two_level({e: [100.0 * r["metrics"][m] for r in rs] for e, rs in per_encoder.items()})
                metric_stats[m], pretrain_sd[m] = (mean, sd_ft), sd_pt
            mean, sd_ft, sd_pt = two_level({e: [score(r) for r in rs] for e, rs in per_encoder.items()})
            pretrain_sd["score"] = sd_pt
            runs = [r for rs in per_encoder.values() for r in rs]
            cells[label][task] = {"metrics": metric_stats, "score": (mean, sd_ft), "pretrain_sd": pretrain_sd,
                                  "seeds": sorted(r["seed"] for r in runs), "encoders": len(per_encoder),
                                  "eval_examples": runs[0].get("eval_examples")}
    glue_tasks = [t for t in tasks if t not in EXCLUDED_FROM_GLUE_SCORE and all(t in cells[lb] for lb in labels)]
    glue = {}
    for label in labels:
        if not glue_tasks:
            continue
        per_encoder = {}
        for e in encoders[label]:
            # a GLUE score per (encoder, fine-tuning seed) present in every task
            seeds = set.intersection(*({r["seed"] for r in by[label][t].get(e, [])} for t in glue_tasks))
            scores = [float(np.mean([score(r) for t in glue_tasks for r in by[label][t][e] if r["seed"] == s]))
                      for s in sorted(seeds)]
            if scores:
                per_encoder[e] = scores
        if per_encoder:
            mean, sd_ft, sd_pt = two_level(per_encoder)
        else:  # no fine-tuning seed ran every task: the mean of task means, without a spread
            mean, sd_ft, sd_pt = float(np.mean([cells[label][t]["score"][0] for t in glue_tasks])), 0.0, None
        glue[label] = {"score": (mean, sd_ft), "pretrain_sd": sd_pt}
    return {"labels": labels, "tasks": tasks, "cells": cells, "glue": glue, "glue_tasks": glue_tasks,
            "encoders": {label: list(encoders[label].values()) for label in labels}}


def _fmt(ms: tuple[float, float], pretrain_sd: float | None = None) -> str:
    text = f"{ms[0]:.1f} ± {ms[1]:.1f}"
    return text if pretrain_sd is None else f"{text} [{pretrain_sd:.1f}]"


def to_markdown(table: dict) -> str:
    tasks = table["tasks"]
    header = ["encoder"] + [f"{display_name(t)} ({'/'.join(_metric_short(m) for m in TASKS[t].metric_names())})"
                            for t in tasks] + ["GLUE"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label in table["labels"]:
        row = [label]
        for t in tasks:
            c = table["cells"][label].get(t)
            row.append(" / ".join(_fmt(v, c["pretrain_sd"][m]) for m, v in c["metrics"].items()) if c else "–")
        g = table["glue"].get(label)
        row.append(_fmt(g["score"], g["pretrain_sd"]) if g else "–")
        lines.append("| " + " | ".join(row) + " |")
    seeds = sorted({len(set(c["seeds"])) for lb in table["labels"] for c in table["cells"][lb].values()})
    encoders = sorted({len(v) for v in table.get("encoders", {}).values()})
    pretrain = ""
    if any(n > 1 for n in encoders):
        pretrain = (f", over {'/'.join(map(str, encoders))} pretraining seed(s) per row: the mean of the encoders' "
                    f"means, ± the sd over fine-tuning seeds pooled within encoders, [the sd over pretraining seeds]")
    lines.append("")
    lines.append(f"Dev-set metrics x 100 after the last fine-tuning epoch, mean ± std over {'/'.join(map(str, seeds))} "
                 f"fine-tuning seed(s){pretrain}. GLUE = mean task score (a task's score is the mean of its metrics) "
                 f"over {', '.join(display_name(t) for t in table['glue_tasks']) or 'no common task'}; WNLI excluded as in "
                 f"BERT.")
    return "\n".join(lines)


def _metric_short(m: str) -> str:
    return {"accuracy": "acc", "mcc": "MCC", "f1": "F1", "pearson": "P", "spearman": "S"}.get(
        m.split("_")[0], m) + ("-" + m.split("_")[1] if "_" in m else "")


def to_csv(table: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["encoder", "task", "metric", "mean", "std", "std_pretrain", "seeds", "encoders"])

    def sd(v: float | None) -> str:
        return "" if v is None else f"{v:.4f}"

    for label in table["labels"]:
        n_enc = len(table.get("encoders", {}).get(label, [])) or ""
        for t in table["tasks"]:
            c = table["cells"][label].get(t)
            if not c:
                continue
            for m, (mean, std) in c["metrics"].items():
                w.writerow([label, t, m, f"{mean:.4f}", f"{std:.4f}", sd(c["pretrain_sd"][m]), len(c["seeds"]),
                            c["encoders"]])
            w.writerow([label, t, "score", f"{c['score'][0]:.4f}", f"{c['score'][1]:.4f}", sd(c["pretrain_sd"]["score"]),
                        len(c["seeds"]), c["encoders"]])
        if label in table["glue"]:
            g = table["glue"][label]
            w.writerow([label, "glue", "score", f"{g['score'][0]:.4f}", f"{g['score'][1]:.4f}", sd(g["pretrain_sd"]),
                        "", n_enc])
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
    ax.set_xticks(x, [display_name(g) if g in TASKS else "GLUE" for g in groups])
    ax.set_ylabel("dev score (x 100)")
    ax.set_title("GLUE dev scores, mean ± std over seeds")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format="png")
    plt.close(fig)
    return atomic.write_bytes(path, buffer.getvalue())


def write_report(results: list[dict], out_dir: str | Path) -> dict:
    """comparison.md, comparison.csv, comparison.png and comparison.json in ``out_dir``."""
    table = aggregate(results)  # refuses what cannot be compared before anything is written
    out = Path(out_dir)
    atomic.write_text(out / "comparison.md", to_markdown(table) + "\n")
    atomic.write_text(out / "comparison.csv", to_csv(table))
    atomic.write_text(out / "comparison.json", json.dumps(table, indent=2))
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
