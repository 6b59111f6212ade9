"""The comparison's numbers: per encoder and task, mean and sds over fine-tuning and pretraining
seeds, the GLUE score, intervals, paired differences against a baseline row with p-values, the
seeds a difference would need, and GLUE against pretraining FLOPs for snapshots
(:func:`curve`). The statistics themselves are ``pretrainlab.uncertainty``.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

from pretrainlab import uncertainty
from pretrainlab.compare.collect import CompareError, as_final, encoder_of, is_final, row_labels
from pretrainlab.evaluation.base import UnknownEvaluation, get


def two_level(values: dict[str, list[float]]) -> tuple[float, float, float | None]:
    """(mean, sd over fine-tuning seeds, sd over pretraining seeds) of scores grouped by encoder
    (one pretraining seed each): the mean of the encoders' means; the fine-tuning sd pooled within
    encoders (ddof 1; 0 when every encoder has one seed); the sd of the encoders' means (ddof 1;
    None for a single encoder)."""
    s = uncertainty.summarize(values)
    return s.mean, s.sd_ft, s.sd_pt


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


def score_range(tasks: list[str]) -> tuple[float, float]:
    """Where the mean score of ``tasks`` can lie (a GLUE score): the mean of their ranges."""
    lows = [get(t).score_range[0] for t in tasks] or [0.0]
    return (sum(lows) / len(lows), 100.0)


def bounded_summary(summary: uncertainty.Summary, bounds: tuple[float, float]) -> dict:
    """A summary as a dict, its interval cut to the score's range (``cut``: True when it was)."""
    out = summary.to_dict()
    ci = uncertainty.bounded(out["ci"], bounds)
    if ci and tuple(ci) != tuple(out["ci"]):
        out["ci"], out["cut"] = ci, True
    return out


def aggregate(
    results: list[dict], baseline: str | None = None, method: str = "t", level: float = uncertainty.LEVEL
) -> dict:
    """{"labels", "tasks", "cells": {label: {task: {...}}}, "glue": {label: {...}}, "glue_tasks",
    "encoders": {label: [...]}, "interval": {...}, "differences": {label: {task: {...}}},
    "seeds_needed": {task: {...}}}, over the final encoders of ``results`` (snapshots are left to
    :func:`curve`).

    A cell's ``metrics`` and ``score`` are (mean, sd over fine-tuning seeds), ``pretrain_sd`` the sd
    over pretraining seeds (None with one) and ``summary`` the score's :class:`uncertainty.Summary`
    (median, ``level`` interval by ``method``). With ``baseline`` (a row label), ``differences``
    holds every other row minus it per task and for the GLUE score (:func:`uncertainty.difference`)."""
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
    try:
        tasks = sorted({t for label in labels for t in by[label]}, key=lambda t: get(t).order())
    except UnknownEvaluation as unknown:
        raise CompareError(f"a result is of {unknown} (a result of another version of pretrainlab?)") from None
    rng = np.random.default_rng(0)

    def score(r: dict) -> float:
        return get(r["task"]).score(r["metrics"])

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
                summary = uncertainty.summarize_items(
                    {e: item_outcomes(rs[0]) for e, rs in per_encoder.items()}, level, rng=rng
                )
                items[label][task] = {
                    encoders[label][e]["pretrain_seed"]: item_outcomes(rs[0]) for e, rs in per_encoder.items()
                }
            else:
                summary = uncertainty.summarize(
                    {e: [score(r) for r in rs] for e, rs in per_encoder.items()}, level, method, rng
                )
            pretrain_sd["score"] = summary.sd_pt
            cells[label][task] = {
                "metrics": metric_stats,
                "score": (summary.mean, summary.sd_ft),
                "pretrain_sd": pretrain_sd,
                "summary": bounded_summary(summary, get(task).score_range),
                "seeds": sorted(r["seed"] for r in runs),
                "encoders": len(per_encoder),
                "no_skill": get(task).score(runs[0]["no_skill"]) if runs[0].get("no_skill") else None,
                "eval_examples": runs[0].get("eval_examples"),
                "items": bool(runs[0].get("items")),
            }
            seeded[label][task] = {
                encoders[label][e]["pretrain_seed"]: {r["seed"]: score(r) for r in rs} for e, rs in per_encoder.items()
            }
    glue_tasks = [t for t in tasks if get(t).in_glue_score and all(t in cells[lb] for lb in labels)]
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
            summary = uncertainty.summarize(per_encoder, level, method, rng)
            glue[label] = {
                "score": (summary.mean, summary.sd_ft),
                "pretrain_sd": summary.sd_pt,
                "summary": bounded_summary(summary, score_range(glue_tasks)),
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
                    uncertainty.item_difference(items[label][t], items[baseline][t], level, rng=rng)
                    if t in items[label] and t in items[baseline]
                    else uncertainty.difference(seeded[label][t], seeded[baseline][t], level, method, rng)
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
            "runs": {f"{d:g}": uncertainty.seeds_needed(sd, d) for d in DELTAS},
        }
    return out


def curve(results: list[dict], method: str = "t", level: float = uncertainty.LEVEL, task: str | None = None) -> dict:
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


__all__ = ["DELTAS", "aggregate", "curve", "item_outcomes", "seeds_needed", "two_level"]
