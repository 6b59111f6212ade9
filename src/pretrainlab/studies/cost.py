"""What a study cost: the compute each of its pretraining runs and evaluations took, from what they
recorded, and the code that pretrained its encoders (``report/cost.md`` and ``cost.json``).

- pretraining: each exported encoder's ``pretraining`` record (``encoder/config.json``): optimiser
  steps, tokens, FLOPs and the seconds spent in training steps, summed over every resumption (the
  validations every ``val_every`` steps, data preparation and the export are not in it);
- evaluation: each results file's ``runtime_s`` (a fine-tuning run, a probe, a BLiMP scoring),
  by task, over the final encoders, their snapshots and the scratch baseline.

Those seconds are process time (on a GPU, a run's steps on the device: ``PretrainModule.seconds``), on
whatever machine ran each: several runs at once, or a study resumed on other machines, add up seconds
that ran side by side or are not alike, so their sum is not a duration. The study's duration is its
wall-clock per phase (``wall_s``: what the study measured of itself, or a slot's record over its starts),
shown beside it. Each results file is counted once.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from pretrainlab import atomic
from pretrainlab.evaluation.base import result_dirs
from pretrainlab.evaluation.results import is_results_file

# a run brought back without its weights (``pretrainlab.slot``) keeps its export's config.json under this name
EXPORT_RECORD = "encoder.json"


def _pretraining(run: Path) -> dict | None:
    config = next((c for c in (run / "encoder" / "config.json", run / EXPORT_RECORD) if c.is_file()), None)
    if config is None:
        return None
    record = json.loads(config.read_text()).get("pretraining") or {}
    return {
        "run": run.name,
        "objective": record.get("objective"),
        "steps": record.get("global_step"),
        "tokens": record.get("tokens_seen"),
        "flops": record.get("flops"),
        "seconds": record.get("seconds"),
        "clock": record.get("seconds_clock"),  # host or device; None: exported before runs recorded it (the host's)
        "software": record.get("software"),
    }


def _results(run: Path) -> list[Path]:
    tops = [run, *sorted((run / "snapshots").glob("*"))]
    return sorted({p for top in tops for d in result_dirs() for p in (top / d).rglob("*.json") if is_results_file(p)})


def study_cost(runs: list[Path], jobs: int = 1, wall_s: dict[str, float] | None = None) -> dict:
    """The cost of the study whose pretraining runs are ``runs``, trained ``jobs`` at a time (see the
    module docstring); ``wall_s``: its wall-clock seconds by phase (pretraining, evaluation)."""
    pretraining = [row for run in runs if (row := _pretraining(run)) is not None]
    tasks: dict[str, dict[str, float]] = defaultdict(lambda: {"runs": 0, "seconds": 0.0})
    for run in runs:
        for path in _results(run):
            result = json.loads(path.read_text())
            tasks[result["task"]]["runs"] += 1
            tasks[result["task"]]["seconds"] += float(result.get("runtime_s") or 0.0)
    pretrain_s = sum(float(r["seconds"] or 0.0) for r in pretraining)
    evaluation_s = sum(t["seconds"] for t in tasks.values())
    return {
        "pretraining": pretraining,
        "evaluation": dict(sorted(tasks.items())),
        "pretraining_s": pretrain_s,
        "jobs": jobs,
        "evaluation_s": evaluation_s,
        "total_s": pretrain_s + evaluation_s,
        **({"wall_s": dict(wall_s)} if wall_s else {}),
    }


def hours(seconds: float) -> str:
    """A duration as reports write it: minutes under an hour ("4.5 min"), hours from there ("1.25 h")."""
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def describe_code(entry: dict) -> str:
    """One version of the code (:func:`pretrainlab.runtime.provenance.software`), in a few words."""
    commit = entry.get("commit")
    where = (
        f"commit {commit[:10]}{' with uncommitted changes' if entry.get('dirty') else ''}"
        if commit
        else "no git checkout"
    )
    return (
        f"pretrainlab {entry.get('pretrainlab')} ({where}), torch {entry.get('torch')}, "
        f"lightning {entry.get('lightning')}, Python {entry.get('python')}"
    )


def code_markdown(pretraining: list[dict]) -> list[str]:
    """Which code pretrained the study's encoders: one line when it was one version for every run,
    else each run's versions, oldest first (a run resumed under newer code lists both)."""
    if not pretraining:
        return []
    versions = {r["run"]: [describe_code(s) for s in r.get("software") or []] for r in pretraining}
    distinct = {v for vs in versions.values() for v in vs}
    lines = ["", "## Code", ""]
    if len(distinct) == 1 and all(versions.values()):
        return [*lines, f"Every encoder was pretrained with {distinct.pop()}."]
    if len(distinct) > 1:
        lines += ["The encoders were pretrained with more than one version of the code.", ""]
    lines += ["| pretraining run | code, oldest first |", "|---|---|"]
    for run, vs in versions.items():
        lines.append(f"| {run} | {'; then '.join(vs) if vs else 'not recorded (pretrained before runs recorded it)'} |")
    return lines


def cost_markdown(cost: dict) -> str:
    host = [r["run"] for r in cost["pretraining"] if r.get("clock") != "device"]
    lines = [
        "# What this study cost",
        "",
        "Each pretraining run's time in training steps (on a GPU its steps' time on the device; validation and",
        "data preparation not counted) and the runtime every evaluation recorded: process time, as measured",
        "on the machines that ran them.",
        "",
        "| pretraining run | steps | tokens | FLOPs | training steps |",
        "|---|---|---|---|---|",
    ]
    for r in cost["pretraining"]:
        tokens = f"{r['tokens'] / 1e6:.1f}M" if r["tokens"] else "–"
        flops = f"{r['flops']:.2g}" if r["flops"] else "–"
        lines.append(f"| {r['run']} | {r['steps']:,} | {tokens} | {flops} | {hours(float(r['seconds'] or 0))} |")
    lines += ["", "| evaluation | runs | process time |", "|---|---|---|"]
    for task, t in cost["evaluation"].items():
        lines.append(f"| {task} | {t['runs']} | {hours(t['seconds'])} |")
    wall = cost.get("wall_s") or {}
    at_once = cost.get("jobs", 1)
    summed = (
        f"pretraining {hours(cost['pretraining_s'])}, evaluation {hours(cost['evaluation_s'])}, summed over the runs"
        + (f" ({at_once} at a time: time that ran side by side, not a duration)" if at_once > 1 else "")
    )
    lines.append("")
    if wall:
        of = f" {cost['wall_of']}" if cost.get("wall_of") else ""
        phases = ", ".join(f"{phase} {hours(float(seconds))}" for phase, seconds in wall.items())
        lines += [f"Wall-clock{of}: {phases} (**{hours(sum(map(float, wall.values())))}**). Process time: {summed}."]
    else:
        lines += [f"Process time: {summed}."]
    if host and cost.get("gpu"):  # a slot's record says its runs trained on a GPU
        lines += [
            "",
            f"The training-step times of {', '.join(host)} were taken on the host's clock, which on a GPU runs ahead "
            "of the device (code before its steps were timed on the device): they are shorter than the steps took.",
        ]
    lines += code_markdown(cost["pretraining"])
    return "\n".join(lines)


def cost_report(runs: list[Path], out_dir: Path, jobs: int = 1, wall_s: dict[str, float] | None = None) -> dict:
    """``cost.json`` and ``cost.md`` in ``out_dir``; returns the cost."""
    cost = study_cost(runs, jobs, wall_s)
    atomic.write_json(out_dir / "cost.json", cost)
    atomic.write_text(out_dir / "cost.md", cost_markdown(cost) + "\n")
    return cost
