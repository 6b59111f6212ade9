"""Throughput measured at the start of a slot, and the plan made of it: every pretraining job of the
study is started at once, as the study will start them, and timed in windows the coordinator announces
(``studies.throughput``: ``measure`` in each job, ``Windows`` in the coordinator). Together the windows
give what the plan needs (each job's FLOPs per second alone and among all: :func:`plan_rates`, as
``plan.Rate``) and what the slot reports (:func:`throughput`): the aggregate throughput of the jobs run at
once against the same jobs run one after another, on the same device, in the same run.
"""

from __future__ import annotations

from typing import Any

from pretrainlab.slot.plan import Rate


def plan_rates(measured: dict[str, dict]) -> dict[str, Rate]:
    """``plan.Rate`` of every job from what it counted: FLOPs per second together and alone."""
    out = {}
    for job, m in measured.items():
        together = m["together"]["flops"] / m["together"]["seconds"]
        alone = m["alone"]["flops"] / m["alone"]["seconds"] if m.get("alone", {}).get("seconds") else None
        out[job] = Rate(together, alone)
    return out


def throughput(measured: dict[str, dict], budget_flops: float | None = None) -> dict:
    """The jobs run at once against the same jobs run one after another: aggregate tokens and FLOPs
    per second of the together window, and of running each job alone for an equal share of work
    (``budget_flops`` each, default equal FLOPs: the time alone of each job's share, summed)."""
    together_s = max(m["together"]["seconds"] for m in measured.values())
    together = {
        "tokens_per_s": sum(m["together"]["tokens"] for m in measured.values()) / together_s,
        "flops_per_s": sum(m["together"]["flops"] for m in measured.values()) / together_s,
    }
    out: dict[str, Any] = {"together": together, "jobs": len(measured)}
    if all(m.get("alone", {}).get("seconds") for m in measured.values()):
        share = budget_flops or 1.0
        seconds = {j: share / (m["alone"]["flops"] / m["alone"]["seconds"]) for j, m in measured.items()}
        tokens = {j: share / m["flops_per_token"] for j, m in measured.items()}
        total_s = sum(seconds.values())
        out["one_after_another"] = {
            "tokens_per_s": sum(tokens.values()) / total_s,
            "flops_per_s": share * len(measured) / total_s,
        }
        out["speedup"] = together["flops_per_s"] / out["one_after_another"]["flops_per_s"]
    return out


__all__ = ["plan_rates", "throughput"]
