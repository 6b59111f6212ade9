"""``report/slot.md``: what a slot did, from its ``slot.json`` (``run.account``): the machine, whether its
processes shared the GPU through CUDA's MPS, the code, the share of the wall-clock pretraining had, the phases with the device's utilisation (each
start's, for a slot continued), the plan against what happened run by run, and the jobs' aggregate
throughput at once against one after another."""

from __future__ import annotations

import json
from pathlib import Path

from pretrainlab import atomic
from pretrainlab.studies.cost import cost_markdown


def _tera(x: float | None) -> str:
    return "–" if not x else f"{x / 1e12:.2f}"


def _mega(x: float | None) -> str:
    return "–" if not x else f"{x / 1e6:.2f}M"


def _seconds(x: float | None) -> str:
    return "–" if x is None else f"{x:.0f} s"


def _util(u: dict | None) -> str:
    return "–" if not u else f"{u['gpu_util_pct']:.0f}% ({u['memory_mib'] / 1024:.1f} GiB)"


def _calibration_of(plan: dict) -> str:
    """Whose calibration measured a plan's throughput: this slot's, or an earlier slot's (``--rates-from``)."""
    there = plan.get("measured_in") or {}
    if not there:
        return "this slot's calibration"
    return (
        f"the calibration of {there.get('from')} (started {there.get('started', '?')}, code {there.get('code', '?')})"
    )


def slot_markdown(record: dict) -> str:
    device = record.get("device") or {}
    code = record.get("code") or {}
    plan = record.get("plan") or {}
    lines = [
        f"# Slot: study {record.get('study', '?')}, pretraining seed {', '.join(map(str, record.get('seeds', [])))}",
        "",
        f"- **Command**: `{record.get('command', '?')}`, started {record.get('started', '?')}",
        f"- **Machine**: {device.get('device', '?')}, driver {device.get('driver') or '–'}, {device.get('cpu_cores')} CPU "
        f"cores; torch {device.get('torch')} (CUDA {device.get('cuda') or '–'})",
        *(
            [f"- **Processes sharing the GPU**: {(record['mps'] or {}).get('status', '–')}"]
            if record.get("mps")
            else []
        ),
        f"- **Code**: {code.get('digest')} (commit {str(code.get('commit'))[:10]}{', uncommitted changes' if code.get('dirty') else ''})",
        f"- **Inputs**: {(record.get('inputs') or {}).get('digest', '–')}",
        f"- **Installed at the start**: {', '.join((record.get('installed') or {}).get('packages') or []) or 'nothing'}",
        f"- **Wall-clock**: {record.get('wall_s', 0):.0f} s of the {60 * float(record.get('minutes') or 0):.0f} s allowed",
    ]
    starts = [*(record.get("earlier") or []), record]
    wall = sum(float(r.get("wall_s") or 0) for r in starts)
    pretraining = sum(float(((r.get("phases") or {}).get("pretraining") or {}).get("seconds") or 0) for r in starts)
    if wall:
        over = f" over its {len(starts)} starts" if len(starts) > 1 else ""
        lines.append(
            f"- **Pretraining**: {pretraining:.0f} s of the {wall:.0f} s of wall-clock{over} ({pretraining / wall:.0%})"
        )
    if record.get("error"):
        lines += ["", f"**The slot failed**: {record['error']}"]
    if len(starts) > 1:
        lines += [
            "",
            "## Starts",
            "",
            "The slot was continued (the same command and `--work` again): each start, its phases and how it ended. "
            "The rest of this page is the last start's, but for the runs pretrained in an earlier one.",
            "",
            "| start | started | wall-clock | phases | ended |",
            "|---|---|---|---|---|",
        ]
        for k, r in enumerate(starts, 1):
            steps = ", ".join(f"{n} {p['seconds']:.0f} s" for n, p in (r.get("phases") or {}).items())
            lines.append(
                f"| {k} | {r.get('started', '?')} | {float(r.get('wall_s') or 0):.0f} s of "
                f"{60 * float(r.get('minutes') or 0):.0f} s | {steps or '–'} | {r.get('error') or 'finished'} |"
            )
    phases = record.get("phases") or {}
    if phases:
        lines += ["", "## Phases", "", "| phase | from | length | GPU utilisation (peak memory) |", "|---|---|---|---|"]
        for name, p in phases.items():
            lines.append(f"| {name} | {p['from_s']:.0f} s | {p['seconds']:.0f} s | {_util(p.get('utilisation'))} |")
    if plan:
        lines += ["", "## Budget", "", f"**{plan['budget_flops']:.3g} FLOPs per objective**, {plan.get('source')}."]
        if plan.get("window_s") is not None:
            where = (plan.get("measured_in") or {}).get("from")
            measured = f"in the calibration of {where}" if where else "at the start"
            lines.append(
                f"Planned from the throughput measured {measured}: a pretraining window of {plan['window_s']:.0f} s, "
                f"each run starting {plan['startup_s']:.0f} s into it and ending {plan['finish_s']:.0f} s after its last "
                f"step, the last one planned to end by {plan.get('safety', 1):.0%} of the window."
            )
    runs = record.get("runs") or {}
    rates = plan.get("rates") or {}
    if runs or rates:
        lines += [
            "",
            "| run | TFLOP/s with all at once | TFLOP/s alone | planned end | exported at | done at | steps | tokens | FLOPs |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        seeds = record.get("seeds") or []
        # the calibration's jobs: one per arm (roberta) for a slot of one seed, one per run (roberta-s1) for several
        names = sorted(set(runs) | {k if len(seeds) > 1 else f"{k}-s{s}" for k in rates for s in seeds})
        ends = plan.get("planned_end_s") or {}
        for name in names:
            objective = name.rsplit("-s", 1)[0]
            r, rate = runs.get(name, {}), rates.get(name) or rates.get(objective, {})
            planned = ends.get(name, ends.get(objective))
            then = f" (start {r['start']})" if r.get("start") else ""
            lines.append(
                f"| {name} | {_tera(rate.get('together'))} | {_tera(rate.get('alone'))} | {_seconds(planned)} | "
                f"{_seconds(r.get('exported_s'))}{then} | {_seconds(r.get('done_s'))}{then} | {r.get('steps', '–')} | {_mega(r.get('tokens'))} | "
                f"{r.get('flops') or 0:.3g} |"
            )
    speed = plan.get("throughput")
    if speed:
        util = plan.get("utilisation") or {}
        lines += [
            "",
            "## The jobs at once against one after another",
            "",
            f"Measured in {_calibration_of(plan)}: {speed['jobs']} pretraining jobs on the device at once, then each "
            f"alone; one after another is each job alone for its share of the budget, summed.",
            "",
            "| | tokens/s | TFLOP/s | GPU utilisation |",
            "|---|---|---|---|",
            f"| all at once | {_mega(speed['together']['tokens_per_s'])} | {_tera(speed['together']['flops_per_s'])} | "
            f"{_util(util.get('together'))} |",
        ]
        seq = speed.get("one_after_another")
        if seq:
            lines.append(
                f"| one after another | {_mega(seq['tokens_per_s'])} | {_tera(seq['flops_per_s'])} | {_util(util.get('alone'))} |"
            )
            lines += ["", f"At once: **{speed['speedup']:.2f}x** the aggregate throughput of one after another."]
    for k, r in enumerate(starts, 1):
        done = r.get("pretraining_throughput")
        which = f" in start {k}" if len(starts) > 1 else ""
        if done:
            lines += [
                "",
                f"The pretraining phase as it ran{which}: {_mega(done['tokens_per_s'])} tokens/s and "
                f"{_tera(done['flops_per_s'])} TFLOP/s in aggregate over its wall-clock, GPU utilisation "
                f"{_util(((r.get('phases') or {}).get('pretraining') or {}).get('utilisation'))}.",
            ]
        elif "pretraining" in (r.get("phases") or {}):
            lines += ["", f"Nothing was pretrained{which}: every run had been pretrained before it."]
    return "\n".join(lines)


def wall_by_phase(records: list[dict]) -> dict[str, float]:
    """The wall-clock seconds of pretraining and evaluation over slot records, each with its earlier starts."""
    out: dict[str, float] = {}
    for record in records:
        for start in [*(record.get("earlier") or []), record]:
            for phase in ("pretraining", "evaluation"):
                p = (start.get("phases") or {}).get(phase)
                if p:
                    out[phase] = round(out.get(phase, 0.0) + float(p["seconds"]), 1)
    return out


def recost(report: Path, records: list[dict], of: str = "") -> None:
    """``report``'s cost.json and cost.md with the slots' wall-clock by phase (``of``: over what, in words),
    and whether their runs trained on a GPU (where a step timed on the host's clock falls short)."""
    path = report / "cost.json"
    if not path.is_file():
        return
    cost = json.loads(path.read_text())
    wall = wall_by_phase(records)
    if wall:
        cost["wall_s"], cost["wall_of"] = wall, of
    cost["gpu"] = any((r.get("device") or {}).get("cuda") for r in records)
    atomic.write_json(path, cost)
    atomic.write_text(report / "cost.md", cost_markdown(cost) + "\n")


__all__ = ["recost", "slot_markdown", "wall_by_phase"]
