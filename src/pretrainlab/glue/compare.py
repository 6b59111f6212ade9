"""Compare encoders on GLUE: objective x task, mean ± std over seeds, and a GLUE score.

Conventions (also printed under every table):

- a task's **score** is the mean of its metrics x 100 (MRPC/QQP: F1 and accuracy; STS-B: Pearson and
  Spearman; MNLI: matched and mismatched accuracy; CoLA: Matthews correlation x 100);
- the **GLUE score** of an encoder is the mean of its task scores over the tasks every compared
  encoder has, leaving out WNLI as the BERT paper did (Devlin et al., 2019, Table 1);
- mean ± std are over seeds (std with ddof=1; 0 for a single seed), with a 95% confidence interval and,
  against a ``baseline`` row, paired differences and p-values (see ``pretrainlab.glue.stats``);
- results of encoder snapshots (``fraction`` < 1) are left out of the table and make :func:`curve`.

Inputs are results files (``experiments/glue.py`` and ``finetune.py`` write them) found under the
given directories, or the fine-tuning runs of a W&B project (``wandb:<entity>/<project>``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pretrainlab import atomic, figures
from pretrainlab.evaluation import report
from pretrainlab.evaluation.tasks import EVALUATIONS, ORDER, display_name, is_glue
from pretrainlab.glue import stats
from pretrainlab.glue.results import (
    LEGACY,
    ResultError,
    check_encoder,
    is_result,
    is_results_file,
    read_result,
    settings_of,
)
from pretrainlab.glue.tasks import task_score
from pretrainlab.runtime.provenance import describe, differences

log = logging.getLogger("pretrainlab")

EXCLUDED_FROM_GLUE_SCORE = ("wnli",)


class CompareError(ValueError):
    """Results that cannot be put side by side without misreporting one of them."""


def encoder_of(r: dict) -> dict:
    """Who produced a result: ``id`` (the encoder's weights hash; for init=scratch, its architecture
    and tokenizer), ``label`` (objective, ``scratch``, ``hf:<name>``), ``model`` (the model preset or
    the encoder's shape), ``pretrain_seed`` and where it came from. Results written before the
    hash was recorded are identified by their encoder's path."""
    p = r.get("pretrained") or {}
    label = r.get("label_override") or r["label"]
    return {
        "id": p.get("encoder_id") or p.get("path") or label,
        "label": label,
        "model": p.get("model"),
        "pretrain_seed": p.get("pretrain_seed"),
        "source": p.get("run_dir") or p.get("path") or "?",
    }


def collect(
    sources: list[str], labels: dict[str, str] | None = None, keep: Callable[[dict], bool] | None = None
) -> list[dict]:
    """Results from directories (searched recursively for results JSON files) and W&B projects.
    ``labels`` (source -> name) relabels the results found under a source; ``keep`` chooses the
    results to compare (a study's tasks and seeds), before they are checked against each other.

    Every results file is read whole and must hold finite metrics; a result whose encoder is still
    where it was recorded must be of that encoder (not of one pretrained there before); results of
    one task must have been fine-tuned with the same settings, on the same data files
    (``pretrainlab.glue.results``). The same result reached twice (a run directory and its
    ``glue/``) counts once; two different fine-tuning runs of one encoder, task and seed are
    refused, since one would hide the other."""
    results: list[dict] = []
    identities: dict = {}
    labels = {
        str(Path(k).expanduser().resolve()) if not k.startswith("wandb:") else k: v for k, v in (labels or {}).items()
    }
    for src in sources:
        found: list[dict] = []
        if str(src).startswith("wandb:"):
            found = collect_wandb(str(src)[len("wandb:") :])
            key = str(src)
        else:
            p = Path(src).expanduser()
            if not p.exists():
                raise FileNotFoundError(f"{src}: no such results directory or file.")
            key = str(p.resolve())
            for f in [p] if p.is_file() else sorted(p.rglob("*.json")):
                d = _read(f, strict=p.is_file() or is_results_file(f))
                if d is not None and (keep is None or keep(d)):
                    d.setdefault("run_dir", str(f.parent))
                    check_current_encoder(d, f, identities)
                    found.append(d)
        for d in found:
            if key in labels:
                d["label_override"] = labels[key]
        results += [d for d in found if keep is None or keep(d)]  # (W&B results are chosen here)
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
    _check_same_settings(list(unique.values()))
    return list(unique.values())


def _read(f: Path, strict: bool) -> dict | None:
    """The result in ``f``; a results file (``seed<k>.json``, ``results.json``, or a file named on
    the command line) that cannot be read whole, or holds non-finite metrics, is refused; any other
    JSON file that is not a result is passed over."""
    if strict:
        try:
            return read_result(f)
        except ResultError as e:
            raise CompareError(str(e)) from None
    try:
        d = json.loads(f.read_text())
    except (ValueError, UnicodeDecodeError, OSError):
        return None
    if not is_result(d):
        return None
    try:
        return read_result(f)
    except ResultError as e:
        raise CompareError(str(e)) from None


def check_current_encoder(result: dict, path: Path, identities: dict) -> None:
    """Refuse ``result`` (read from ``path``) when the directory of the encoder it records now holds
    another encoder (pretrained again); bring its record of the encoder's place in its run's budget
    (``fraction``, ``pretrain_flops``) up to date. A result whose encoder is gone is kept as recorded.
    ``identities`` caches the encoders' identities during one collection."""
    from pretrainlab.finetuning.encoders import encoder_identity

    recorded = result.get("pretrained") or {}
    if "encoder_id" not in recorded or str(recorded.get("objective") or "").startswith("hf:"):
        return
    encoder = _encoder_dir(recorded.get("path"), path)
    if encoder is None:
        return
    init = recorded.get("init") or "pretrained"
    key = (str(encoder), init)
    if key not in identities:
        identities[key] = encoder_identity(str(encoder), init)
    identity = identities[key]
    try:
        check_encoder(result, identity, init, path)
    except ResultError as e:
        raise CompareError(
            f"{e} (A result is compared only while its encoder is the one there: these scores are not "
            f"those of {encoder}.)"
        ) from None
    if recorded.get("fraction") is not None:
        result["pretrained"] = {
            **recorded,
            "fraction": identity["fraction"],
            "pretrain_flops": identity["pretrain_flops"],
        }


def _encoder_dir(recorded: str | None, results_file: Path) -> Path | None:
    """The export directory of a result's encoder: for a suite's results
    (``<run or export>/{glue,eval}*/<task>/seed<k>.json``) the encoder beside them (a copied run directory
    still records the original's path), else where it was recorded."""
    from pretrainlab.export import resolve_export_dir

    candidates = []
    if len(results_file.parents) > 2 and results_file.parents[1].name.startswith(("glue", "eval")):
        candidates.append(results_file.parents[2])
    if recorded:
        candidates.append(Path(recorded))
    for c in candidates:
        try:
            return resolve_export_dir(c).resolve()
        except FileNotFoundError:
            continue
    return None


def _check_same_settings(results: list[dict]) -> None:
    """Results of one task must have been fine-tuned with the same settings and on the same data
    files, or their scores measure two experiments."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        by_task[r["task"]].append(r)
    for task, rs in by_task.items():
        recorded = [r for r in rs if r.get("config")]
        for r in recorded[1:]:
            a, b = settings_of(recorded[0]), settings_of(r)
            changed = differences(a, b, legacy=LEGACY) or [(k, y, x) for k, x, y in differences(b, a, legacy=LEGACY)]
            if changed:
                raise CompareError(
                    f"{task} results were fine-tuned with different settings: {describe(changed)} "
                    f"('then' in {recorded[0].get('run_dir')}, 'now' in {r.get('run_dir')}). Side by side they would "
                    f"compare two experiments; compare results made with the same settings (one report each)."
                )
        with_files = [r for r in rs if (r.get("data") or {}).get("files")]
        for r in with_files[1:]:
            a, b = with_files[0]["data"]["files"], r["data"]["files"]
            differing = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            if differing:
                raise CompareError(
                    f"{task} results were computed on different data: {', '.join(differing)} differ between "
                    f"{with_files[0].get('run_dir')} and {r.get('run_dir')} (sha256 {str(a.get(differing[0]))[:12]} and "
                    f"{str(b.get(differing[0]))[:12]}). Scores on different data are not comparable: re-run them on the "
                    f"same files."
                )


def collect_wandb(project: str) -> list[dict]:
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


def is_final(r: dict) -> bool:
    """A result of a run's final encoder (or of an encoder outside a run), not of a snapshot."""
    fraction = (r.get("pretrained") or {}).get("fraction")
    return fraction is None or float(fraction) >= 1.0


def as_final(r: dict) -> dict:
    """``r`` presented as the result of a final encoder (a snapshot's suite summarised on its own)."""
    return {**r, "pretrained": {**(r.get("pretrained") or {}), "fraction": None}}


def two_level(values: dict[str, list[float]]) -> tuple[float, float, float | None]:
    """(mean, sd over fine-tuning seeds, sd over pretraining seeds) of scores grouped by encoder
    (one pretraining seed each): the mean of the encoders' means; the fine-tuning sd pooled within
    encoders (ddof 1; 0 when every encoder has one seed); the sd of the encoders' means (ddof 1;
    None for a single encoder)."""
    s = stats.summarize(values)
    return s.mean, s.sd_ft, s.sd_pt


def row_labels(results: list[dict]) -> dict[str, str]:
    """Encoder id -> its row: the label, with the model when the results span several models.
    Pretraining seeds of one (label, model) share a row; two encoders claiming the same label,
    model and pretraining seed are refused."""
    encoders: dict = {}
    for r in results:
        e = encoder_of(r)
        encoders.setdefault(e["id"], e)
    models = {e["model"] for e in encoders.values()}
    several = len(models) > 1
    rows: dict = {}
    claimed: dict = {}
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
            raise CompareError(
                f"{task} results were evaluated on different numbers of examples ({listed}); scores on "
                f"different dev sets are not comparable. Re-run them on the same data "
                f"(glue.max_eval_examples, glue.source)."
            )


def aggregate(results: list[dict], baseline: str | None = None, method: str = "t", level: float = stats.LEVEL) -> dict:
    """{"labels", "tasks", "cells": {label: {task: {...}}}, "glue": {label: {...}}, "glue_tasks",
    "encoders": {label: [...]}, "interval": {...}, "differences": {label: {task: {...}}},
    "seeds_needed": {task: {...}}}, over the final encoders of ``results`` (snapshots are left to
    :func:`curve`).

    A cell's ``metrics`` and ``score`` are (mean, sd over fine-tuning seeds), ``pretrain_sd`` the sd
    over pretraining seeds (None with one) and ``summary`` the score's :class:`stats.Summary`
    (median, ``level`` interval by ``method``). With ``baseline`` (a row label), ``differences``
    holds every other row minus it per task and for the GLUE score (:func:`stats.difference`)."""
    results = [r for r in results if is_final(r)]
    if not results:
        raise CompareError("no results of a final encoder (only snapshots): compare a run's own glue/ results too.")
    _check_example_counts(results)
    rows = row_labels(results)
    by: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))  # row -> task -> encoder -> runs
    encoders: dict = defaultdict(dict)
    for r in results:
        e = encoder_of(r)
        by[rows[e["id"]]][r["task"]][e["id"]].append(r)
        encoders[rows[e["id"]]][e["id"]] = {"pretrain_seed": e["pretrain_seed"], "source": e["source"]}
    labels = sorted(by, key=lambda x: (x.startswith("scratch"), x))
    if baseline is not None and baseline not in labels:
        raise CompareError(
            f"--baseline {baseline!r} is not a row of this comparison; the rows are: {', '.join(labels)}."
        )
    tasks = [t for t in ORDER if any(t in by[label] for label in labels)]
    rng = np.random.default_rng(0)

    def score(r: dict) -> float:
        return task_score(r["metrics"])

    # row -> task (or "glue") -> {pretraining seed: {fine-tuning seed: score}}, for paired differences
    seeded: dict = defaultdict(dict)
    items: dict = defaultdict(dict)  # row -> zero-shot task -> {pretraining seed: outcome per item}
    cells: dict = {}
    for label in labels:
        cells[label] = {}
        for task, per_encoder in by[label].items():
            names = list(next(iter(per_encoder.values()))[0]["metrics"])
            metric_stats, pretrain_sd = {}, {}
            for m in names:
                mean, sd_ft, sd_pt = two_level(
                    {e: [100.0 * r["metrics"][m] for r in rs] for e, rs in per_encoder.items()}
                )
                metric_stats[m], pretrain_sd[m] = (mean, sd_ft), sd_pt
            runs = [r for rs in per_encoder.values() for r in rs]
            if runs[0].get("items"):  # zero-shot items (minimal pairs): intervals over items (and encoders)
                summary = stats.summarize_items(
                    {e: item_outcomes(rs[0]) for e, rs in per_encoder.items()}, level, rng=rng
                )
                items[label][task] = {
                    encoders[label][e]["pretrain_seed"]: item_outcomes(rs[0]) for e, rs in per_encoder.items()
                }
            else:
                summary = stats.summarize(
                    {e: [score(r) for r in rs] for e, rs in per_encoder.items()}, level, method, rng
                )
            pretrain_sd["score"] = summary.sd_pt
            cells[label][task] = {
                "metrics": metric_stats,
                "score": (summary.mean, summary.sd_ft),
                "pretrain_sd": pretrain_sd,
                "summary": summary.to_dict(),
                "seeds": sorted(r["seed"] for r in runs),
                "encoders": len(per_encoder),
                "no_skill": task_score(runs[0]["no_skill"]) if runs[0].get("no_skill") else None,
                "eval_examples": runs[0].get("eval_examples"),
                "items": bool(runs[0].get("items")),
            }
            seeded[label][task] = {
                encoders[label][e]["pretrain_seed"]: {r["seed"]: score(r) for r in rs} for e, rs in per_encoder.items()
            }
    glue_tasks = [
        t for t in tasks if is_glue(t) and t not in EXCLUDED_FROM_GLUE_SCORE and all(t in cells[lb] for lb in labels)
    ]
    glue = {}
    for label in labels:
        if not glue_tasks:
            continue
        per_encoder, per_seed = {}, {}
        for e in encoders[label]:
            # a GLUE score per (encoder, fine-tuning seed) present in every task
            seeds = set.intersection(*({r["seed"] for r in by[label][t].get(e, [])} for t in glue_tasks))
            scores = {
                s: float(np.mean([score(r) for t in glue_tasks for r in by[label][t][e] if r["seed"] == s]))
                for s in sorted(seeds)
            }
            if scores:
                per_encoder[e] = list(scores.values())
                per_seed[encoders[label][e]["pretrain_seed"]] = scores
        if per_encoder:
            summary = stats.summarize(per_encoder, level, method, rng)
            glue[label] = {
                "score": (summary.mean, summary.sd_ft),
                "pretrain_sd": summary.sd_pt,
                "summary": summary.to_dict(),
            }
            seeded[label]["glue"] = per_seed
        else:  # no fine-tuning seed ran every task: the mean of task means, without a spread
            glue[label] = {
                "score": (float(np.mean([cells[label][t]["score"][0] for t in glue_tasks])), 0.0),
                "pretrain_sd": None,
                "summary": None,
            }
    differences: dict = {}
    if baseline is not None:
        for label in labels:
            if label == baseline:
                continue
            differences[label] = {
                t: (
                    stats.item_difference(items[label][t], items[baseline][t], level, rng=rng)
                    if t in items[label] and t in items[baseline]
                    else stats.difference(seeded[label][t], seeded[baseline][t], level, method, rng)
                ).to_dict()
                for t in [*tasks, "glue"]
                if t in seeded[label] and t in seeded[baseline]
            }
    return {
        "labels": labels,
        "tasks": tasks,
        "cells": cells,
        "glue": glue,
        "glue_tasks": glue_tasks,
        "encoders": {label: list(encoders[label].values()) for label in labels},
        "interval": {"level": level, "method": method},
        "baseline": baseline,
        "differences": differences,
        "seeds_needed": seeds_needed(cells, labels, tasks),
    }


def item_outcomes(result: dict) -> np.ndarray:
    """A zero-shot result's outcome (0/1) per item, its groups (paradigms) in sorted order."""
    return np.frombuffer("".join(result["items"][k] for k in sorted(result["items"])).encode(), dtype=np.uint8) - 48


DELTAS = (1.0, 2.0, 5.0)  # score points


def seeds_needed(cells: dict, labels: list[str], tasks: list[str]) -> dict:
    """Per task: the sd of one fine-tuning run's score measured here (fine-tuning sd pooled over the
    rows, with the pretraining sd added where several pretraining seeds measured it), and the runs
    per encoder that a two-sided test at 5% needs to detect a difference of each of :data:`DELTAS`
    points 80% of the time."""
    out = {}
    for t in tasks:
        ft = [
            cells[lb][t]["summary"]["sd_ft"]
            for lb in labels
            if t in cells[lb] and cells[lb][t]["summary"]["n"] > 1 and cells[lb][t]["summary"]["sd_ft"] > 0
        ]
        pt = [
            cells[lb][t]["summary"]["sd_pt"]
            for lb in labels
            if t in cells[lb] and cells[lb][t]["summary"]["sd_pt"] is not None
        ]
        if not ft:
            continue
        sd = float(np.sqrt(np.mean(np.square(ft)) + (np.mean(np.square(pt)) if pt else 0.0)))
        out[t] = {
            "sd": sd,
            "with_pretraining_sd": bool(pt),
            "runs": {f"{d:g}": stats.seeds_needed(sd, d) for d in DELTAS},
        }
    return out


def _interval(ci) -> str:
    return "" if not ci else f" ({ci[0]:.1f}, {ci[1]:.1f})"


def _cell(
    summary: dict | None,
    ms: tuple[float, float],
    pretrain_sd: float | None,
    n: int | None,
    expected: int,
    items: bool = False,
) -> str:
    """mean ± sd [sd over pretraining seeds] (interval), and the number of runs when it is fewer than
    the row should have (``expected``); a single run is shown as what it is, without a spread. A
    zero-shot cell (``items``): the mean [sd over pretraining seeds] (interval over items)."""
    if items:
        return (
            f"{ms[0]:.1f}"
            + (f" [{pretrain_sd:.1f}]" if pretrain_sd is not None else "")
            + _interval(summary["ci"] if summary else None)
        )
    if n is None:  # a GLUE score with no fine-tuning seed in every task: no spread to show
        return f"{ms[0]:.1f} (mean of task means)"
    if n == 1:
        return f"{ms[0]:.1f} (n=1)"
    text = f"{ms[0]:.1f} ± {ms[1]:.1f}"
    if pretrain_sd is not None:
        text += f" [{pretrain_sd:.1f}]"
    return text + _interval(summary["ci"] if summary else None) + (f" (n={n})" if n < expected else "")


def columns(table: dict) -> list[str]:
    """The table's columns in order: GLUE's tasks, the GLUE score (``glue``), then the other tasks."""
    tasks = table["tasks"]
    glue = [t for t in tasks if is_glue(t)]
    return glue + (["glue"] if table["glue"] else []) + [t for t in tasks if not is_glue(t)]


def _header(column: str) -> str:
    if column == "glue":
        return "GLUE"
    return f"{display_name(column)} ({'/'.join(_metric_short(m) for m in EVALUATIONS[column].metrics)})"


def to_markdown(table: dict) -> str:
    cols = columns(table)
    header = ["encoder"] + [_header(c) for c in cols]
    lines = [table["preface"], ""] if table.get("preface") else []  # a study's warning comes first
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    seeded_cells = [c for lb in table["labels"] for c in table["cells"][lb].values() if not c.get("items")]
    per_encoder = max((len(set(c["seeds"])) for c in seeded_cells), default=1)
    short = zero_shot = False
    for label in table["labels"]:
        row = [label]
        encoders = max(1, len(table.get("encoders", {}).get(label, [])))
        for col in cols:
            if col == "glue":
                g = table["glue"].get(label)
                n = (g.get("summary") or {}).get("n") if g else None
                row.append(
                    _cell(g.get("summary"), g["score"], g["pretrain_sd"], n, per_encoder * encoders) if g else "–"
                )
                short |= bool(g) and (n is None or n < per_encoder * encoders)
                continue
            c = table["cells"][label].get(col)
            if c and c.get("items"):  # zero-shot: one run per encoder, the interval over items
                zero_shot = True
                row.append(_cell(c["summary"], c["score"], c["pretrain_sd"]["score"], None, 1, items=True))
                continue
            expected = per_encoder * encoders
            row.append(
                _cell(c.get("summary"), c["score"], c["pretrain_sd"]["score"], len(c["seeds"]), expected) if c else "–"
            )
            short |= bool(c) and len(c["seeds"]) < expected
        lines.append("| " + " | ".join(row) + " |")
    seeds = [per_encoder]
    per_row = sorted({len(v) for v in table.get("encoders", {}).values()})
    interval = table.get("interval") or {"level": stats.LEVEL, "method": "t"}
    pct = f"{100 * interval['level']:g}%"
    how = {"t": "two-level t interval", "bootstrap": "hierarchical bootstrap"}[interval["method"]]
    pretrain = ""
    if any(n > 1 for n in per_row):
        pretrain = (
            f", over {'/'.join(map(str, per_row))} pretraining seed(s) per row: the mean of the encoders' "
            f"means ± the sd over fine-tuning seeds pooled within encoders [the sd over pretraining seeds]"
        )
    single = any(n == 1 for n in per_row)
    lines.append("")
    seeded = (
        (
            f"Task score x 100 on the dev set after the last fine-tuning epoch (a task's score is the mean of "
            f"its metrics), mean ± std over {'/'.join(map(str, seeds))} seed(s){pretrain}; "
            f"({pct} confidence interval, {how}"
            + ("; for a row with one pretraining seed it covers fine-tuning noise only" if single else "")
            + (
                f"). GLUE = mean task score over "
                f"{', '.join(display_name(t) for t in table['glue_tasks'])}; WNLI excluded as in BERT. "
                if table["glue_tasks"]
                else "). "
            )
        )
        if seeded_cells
        else ""
    )
    lines.append(
        seeded
        + (
            f"Zero-shot tasks (BLiMP): accuracy x 100, scored once per encoder; the {pct} interval is a "
            f"bootstrap over the items (and over pretraining seeds when there are several). "
            if zero_shot
            else ""
        )
        + (
            "(n=k): a cell built from fewer runs than its row's encoders x seeds; its interval is wider and "
            "its mean noisier."
            if short
            else ""
        )
    )
    lines[-1] = lines[-1].rstrip()
    if table.get("blimp"):
        lines += ["", report.blimp_markdown(table["blimp"], ("field",)) + "\n\n(by phenomenon and paradigm: blimp.md)"]
    if table.get("probes"):
        lines += ["", report.probe_markdown(table["probes"])]
    if table.get("differences"):
        lines += ["", differences_markdown(table)]
    if table.get("seeds_needed"):
        lines += ["", seeds_markdown(table)]
    return "\n".join(lines)


def differences_markdown(table: dict) -> str:
    """Every row minus the baseline, per task and GLUE: difference (interval) and p-value; * marks
    an interval that excludes zero."""
    tasks = columns(table)
    base = table["baseline"]
    lines = [
        f"Difference against {base} (points; * = the interval excludes 0)",
        "",
        "| encoder | " + " | ".join(display_name(t) if t in EVALUATIONS else "GLUE" for t in tasks) + " |",
        "|" + "---|" * (len(tasks) + 1),
    ]
    tests = set()
    for label, diffs in table["differences"].items():
        row = [f"{label} − {base}"]
        for t in tasks:
            d = diffs.get(t)
            if not d:
                row.append("–")
                continue
            tests.add(d["test"])
            p = "" if d["p"] is None else f" p={d['p']:.2g}"
            row.append(f"{d['mean']:+.1f}{'*' if d['significant'] else ''}{_interval(d['ci'])}{p}")
        lines.append("| " + " | ".join(row) + " |")
    notes = []
    if any(t.startswith("paired t") for t in tests):
        notes.append(
            "matched pretraining and fine-tuning seeds where both rows have them; a paired t over seeds is "
            "conditional on the two encoders"
        )
    if any(t.startswith("McNemar") for t in tests):
        notes.append("McNemar's test compares two encoders on the same items, so it too is conditional on them")
    lines += ["", f"Tests: {', '.join(sorted(tests))}" + (f" ({'; '.join(notes)})." if notes else ".")]
    return "\n".join(lines)


def seeds_markdown(table: dict) -> str:
    """Runs per encoder needed to detect a difference, from the spreads measured here."""
    needed = table["seeds_needed"]
    lines = [
        "Runs per encoder to detect a difference of 1 / 2 / 5 points (two-sided 5% test, 80% power), from the "
        "sd of one run measured here (marked where only fine-tuning or probe seeds varied, not pretraining seeds)",
        "",
        "| task | sd of one run | 1 point | 2 points | 5 points |",
        "|---|---|---|---|---|",
    ]
    for t, n in needed.items():
        lines.append(
            f"| {display_name(t)} | {n['sd']:.1f}{'' if n['with_pretraining_sd'] else ' (one pretraining seed)'} | "
            + " | ".join(str(n["runs"][f"{d:g}"]) for d in DELTAS)
            + " |"
        )
    return "\n".join(lines)


def _metric_short(m: str) -> str:
    return {"accuracy": "acc", "mcc": "MCC", "f1": "F1", "pearson": "P", "spearman": "S"}.get(m.split("_")[0], m) + (
        "-" + m.split("_")[1] if "_" in m else ""
    )


def to_csv(table: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(
        ["encoder", "task", "metric", "mean", "std", "std_pretrain", "seeds", "encoders", "median", "ci_low", "ci_high"]
    )

    def num(v: float | None) -> str:
        return "" if v is None else f"{v:.4f}"

    def interval(summary: dict | None) -> list[str]:
        if not summary:
            return ["", "", ""]
        ci = summary["ci"] or (None, None)
        return [num(summary["median"]), num(ci[0]), num(ci[1])]

    for label in table["labels"]:
        n_enc = len(table.get("encoders", {}).get(label, [])) or ""
        for t in table["tasks"]:
            c = table["cells"][label].get(t)
            if not c:
                continue
            for m, (mean, std) in c["metrics"].items():
                w.writerow(
                    [
                        label,
                        t,
                        m,
                        f"{mean:.4f}",
                        f"{std:.4f}",
                        num(c["pretrain_sd"][m]),
                        len(c["seeds"]),
                        c["encoders"],
                        "",
                        "",
                        "",
                    ]
                )
            w.writerow(
                [
                    label,
                    t,
                    "score",
                    f"{c['score'][0]:.4f}",
                    f"{c['score'][1]:.4f}",
                    num(c["pretrain_sd"]["score"]),
                    len(c["seeds"]),
                    c["encoders"],
                    *interval(c.get("summary")),
                ]
            )
        if label in table["glue"]:
            g = table["glue"][label]
            w.writerow(
                [
                    label,
                    "glue",
                    "score",
                    f"{g['score'][0]:.4f}",
                    f"{g['score'][1]:.4f}",
                    num(g["pretrain_sd"]),
                    "",
                    n_enc,
                    *interval(g.get("summary")),
                ]
            )
    return out.getvalue()


def plot(table: dict, path: Path) -> Path:
    """Grouped bars: task scores (and the GLUE score) per encoder, with confidence-interval error bars
    (± std when a row has no interval); scratch hatched and last; each task's no-skill level dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = columns(table)
    labels = table["labels"]
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(min(14.0, max(7.0, 0.3 * len(groups) * max(1, len(labels)) + 2.5)), 4.8))
    x = np.arange(len(groups))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, label in enumerate(labels):
        means, low, high = [], [], []
        for g in groups:
            c = table["glue"].get(label) if g == "glue" else table["cells"][label].get(g)
            if not c:
                means.append(np.nan)
                low.append(0.0)
                high.append(0.0)
                continue
            mean, sd = c["score"]
            ci = (c.get("summary") or {}).get("ci")
            means.append(mean)
            low.append(mean - ci[0] if ci else sd)
            high.append(ci[1] - mean if ci else sd)
        scratch = label.startswith("scratch")
        pos = x + (i - (len(labels) - 1) / 2) * width
        ax.bar(
            pos,
            means,
            width,
            yerr=[low, high],
            capsize=3,
            label=label,
            color="lightgray" if scratch else colors[i % len(colors)],
            edgecolor="dimgray" if scratch else "none",
            hatch="//" if scratch else None,
        )
        # a zero-height bar stays visible: a thick line of its colour at its value
        ax.hlines(
            means,
            pos - width / 2,
            pos + width / 2,
            colors="dimgray" if scratch else colors[i % len(colors)],
            linewidth=3,
            zorder=3,
        )
    labelled = False
    for j, g in enumerate(groups):
        levels = (
            [table["cells"][lb][g].get("no_skill") for lb in labels if g in table["cells"][lb]]
            if g in EVALUATIONS
            else []
        )
        levels = [v for v in levels if v is not None]
        if levels:  # the majority-class (constant) prediction: what a model that learnt nothing scores
            ax.hlines(
                float(np.mean(levels)),
                j - 0.45,
                j + 0.45,
                colors="black",
                linestyles="dashed",
                linewidth=1,
                label=None if labelled else "majority class / constant",  # type: ignore[arg-type]  # None: no entry
                zorder=4,
            )
            labelled = True
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, [display_name(g) if g in EVALUATIONS else "GLUE" for g in groups])
    ax.set_ylabel("dev score (x 100)")
    interval = table.get("interval") or {"level": stats.LEVEL}
    ax.set_title(f"GLUE dev scores: mean and {100 * interval['level']:g}% interval over seeds")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return figures.save(fig, path)


def curve(results: list[dict], method: str = "t", level: float = stats.LEVEL, task: str | None = None) -> dict:
    """The GLUE score (or ``task``'s score) against pretraining FLOPs, one line per row: {row:
    [{"fraction", "flops", "glue", "ci", "encoders"}, ...]} in order of FLOPs ("glue" holds the
    score), a point per fraction of the budget (its FLOPs the mean over the encoders at that point),
    from the results of snapshots and final encoders. Encoders without a recorded fraction (scratch,
    outside exports) are left out; {} when no result is of a snapshot."""
    staged = [
        r
        for r in results
        if (r.get("pretrained") or {}).get("fraction") is not None and (task is None or r["task"] == task)
    ]
    if all(is_final(r) for r in staged):
        return {}
    lines: dict = defaultdict(list)
    for fraction in sorted({float(r["pretrained"]["fraction"]) for r in staged}):
        at = [as_final(r) for r in staged if float(r["pretrained"]["fraction"]) == fraction]
        rows = row_labels(at)
        table = aggregate(at, method=method, level=level)
        flops: dict = defaultdict(list)
        for r in at:
            if r["pretrained"].get("pretrain_flops") is not None:
                flops[rows[encoder_of(r)["id"]]].append(float(r["pretrained"]["pretrain_flops"]))
        scores = table["glue"] if task is None else {lb: c[task] for lb, c in table["cells"].items() if task in c}
        for label, g in scores.items():
            if g.get("summary") and flops[label]:
                lines[label].append(
                    {
                        "fraction": fraction,
                        "flops": float(np.mean(flops[label])),
                        "glue": g["score"][0],
                        "ci": g["summary"]["ci"],
                        "encoders": g["summary"]["encoders"],
                    }
                )
    return dict(lines)


def plot_curve(lines: dict, path: Path, baselines: dict | None = None, name: str = "GLUE score") -> Path:
    """GLUE score against pretraining FLOPs (log scale), one line per row with its interval as a
    band; ``baselines`` ({label: score}, e.g. scratch) as horizontal dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.8))
    for label, points in sorted(lines.items()):
        x = [p["flops"] for p in points]
        y = [p["glue"] for p in points]
        (line,) = ax.plot(x, y, marker="o", label=label)
        bands = [(p["flops"], *p["ci"]) for p in points if p["ci"]]
        if bands:
            bx, lo, hi = zip(*bands)
            ax.fill_between(bx, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    for label, value in (baselines or {}).items():
        ax.axhline(value, color="gray", linestyle="--", linewidth=1, label=f"{label} (no pretraining)")
    ax.set_xscale("log")
    ax.set_xlabel("pretraining FLOPs")
    ax.set_ylabel(f"{name} (dev, x 100)")
    ax.set_title(f"{name} against pretraining compute (bands: 95% intervals)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return figures.save(fig, path)


def curve_csv(lines: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["encoder", "fraction", "flops", "glue", "ci_low", "ci_high", "encoders"])
    for label, points in sorted(lines.items()):
        for p in points:
            ci = p["ci"] or ("", "")
            w.writerow([label, p["fraction"], f"{p['flops']:.4g}", f"{p['glue']:.4f}", *ci, p["encoders"]])
    return out.getvalue()


def write_report(
    results: list[dict],
    out_dir: str | Path,
    baseline: str | None = None,
    method: str = "t",
    level: float = stats.LEVEL,
    preface: str = "",
    learning: dict | None = None,
) -> dict:
    """comparison.md, .csv, .png and .json in ``out_dir``; with snapshot results also curve.png and
    curve.csv (the table's ``curve``). ``preface``: what comparison.md says before its table (a
    study's warning about encoders that have not learned yet); ``learning``: the study's held-out
    checks of each run (``studies.intrinsic.learning_report``), kept in the table for W&B."""
    table = aggregate(results, baseline, method, level)  # refuses what cannot be compared before anything is written
    table["preface"], table["learning"] = preface, learning or {}
    table["curve"] = curve(results, method, level)
    table["curves"] = {t: c for t in table["tasks"] if not is_glue(t) and (c := curve(results, method, level, t))}
    finals = [r for r in results if is_final(r)]
    rows = row_labels(finals)
    table["blimp"] = report.blimp_table(finals, rows, lambda r: encoder_of(r)["id"], level)
    table["probes"] = report.probe_table(finals, rows, lambda r: encoder_of(r)["id"])
    out = Path(out_dir)
    atomic.write_text(out / "comparison.md", to_markdown(table) + "\n")
    atomic.write_text(out / "comparison.csv", to_csv(table))
    atomic.write_text(out / "comparison.json", json.dumps(table, indent=2))
    plot(table, out / "comparison.png")
    if table["curve"]:
        scratch = {lb: g["score"][0] for lb, g in table["glue"].items() if lb.startswith("scratch")}
        plot_curve(table["curve"], out / "curve.png", scratch)
        atomic.write_text(out / "curve.csv", curve_csv(table["curve"]))
    for task, lines in table["curves"].items():
        scratch = {
            lb: c[task]["score"][0] for lb, c in table["cells"].items() if lb.startswith("scratch") and task in c
        }
        plot_curve(lines, out / f"curve-{task}.png", scratch, name=display_name(task))
        atomic.write_text(out / f"curve-{task}.csv", curve_csv(lines))
    if table["blimp"]:
        atomic.write_text(out / "blimp.md", report.blimp_markdown(table["blimp"]) + "\n")
    if table["probes"]:
        atomic.write_text(out / "probes.md", report.probe_markdown(table["probes"]) + "\n")
        report.plot_probes(table["probes"], out / "probes.png")
    return table


def log_to_wandb(
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
