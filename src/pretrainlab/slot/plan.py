"""A time budget turned into one FLOP budget for every objective: the largest equal budget whose
pretraining runs, all started at once on one device, end within the time there is.

What is known is measured at the start of the same slot (``calibrate``): each job's FLOPs per second
when it runs alone on the device, and when every job of the phase runs at once. Between the two the
model is time sharing: a job's time per FLOP grows linearly with the number of jobs running beside
it, from its time alone (one job) to its time among all of them. A job that finishes frees its share
for the others, so the phase's length is simulated event by event (:func:`finish_times`), and the
largest budget that ends within the window is found by bisection (the phase's length grows with the
budget). A job with no measurement alone runs at its shared rate throughout (a conservative plan).

Each job starts after ``startup_s`` (its process's start, with the compile caches warm) and ends
``finish_s`` after its last step (its final validation, checkpoint, export, held-out checks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    """One job's measured speed in FLOPs per second: ``together`` with every job of the phase
    running at once, ``alone`` with none beside it (None: not measured)."""

    together: float
    alone: float | None = None

    def __post_init__(self) -> None:
        if not self.together > 0 or (self.alone is not None and not self.alone > 0):
            raise ValueError(f"a rate must be positive: together {self.together}, alone {self.alone}")

    def at(self, running: int, of: int) -> float:
        """FLOPs per second with ``running`` jobs of the phase's ``of`` running (itself included)."""
        if self.alone is None or of <= 1:
            return self.together
        alone = max(self.alone, self.together)  # noise can put "together" above "alone": never slower alone
        share = (max(1, running) - 1) / (of - 1)
        return 1.0 / (1.0 / alone + share * (1.0 / self.together - 1.0 / alone))


def finish_times(
    budget: float, rates: dict[str, Rate], startup_s: float = 0.0, finish_s: float = 0.0
) -> dict[str, float]:
    """When each job ends (seconds from the phase's start) if each trains ``budget`` FLOPs, all
    starting at ``startup_s``."""
    if budget <= 0:
        return {name: startup_s + finish_s for name in rates}
    left = {name: float(budget) for name in rates}
    done: dict[str, float] = {}
    t = startup_s
    total = len(rates)
    while left:
        speeds = {name: rates[name].at(len(left), total) for name in left}
        name, dt = min(((n, left[n] / speeds[n]) for n in left), key=lambda x: x[1])
        t += dt
        for n in list(left):
            left[n] -= speeds[n] * dt
        done[name] = t + finish_s
        del left[name]
        for n in [n for n in left if left[n] <= budget * 1e-12]:  # finished in the same instant
            done[n] = t + finish_s
            del left[n]
    return done


def round_down(x: float, digits: int = 2) -> float:
    """``x`` rounded down to ``digits`` significant digits (1.2345e16 -> 1.2e16)."""
    if x <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return math.floor(x / scale + 1e-9) * scale


@dataclass(frozen=True)
class Plan:
    """The budget every job trains, and when each is expected to end (seconds from the phase's start)."""

    budget_flops: float
    window_s: float
    finish_s: dict[str, float]

    @property
    def makespan_s(self) -> float:
        return max(self.finish_s.values(), default=0.0)


def largest_budget(
    rates: dict[str, Rate],
    window_s: float,
    startup_s: float = 0.0,
    finish_s: float = 0.0,
    safety: float = 0.9,
    digits: int = 2,
) -> Plan:
    """The largest FLOP budget, rounded down to ``digits`` significant digits, at which every job
    ends within ``safety`` x ``window_s``. Refused (ValueError) when even a tiny budget does not fit."""
    if not rates:
        raise ValueError("no jobs to plan")
    if not 0 < safety <= 1:
        raise ValueError(f"safety={safety}: a fraction in (0, 1]")
    usable = safety * window_s
    if usable <= startup_s + finish_s:
        raise ValueError(
            f"the window of {window_s:.0f} s leaves no time to train: each job needs {startup_s:.0f} s to start and "
            f"{finish_s:.0f} s to finish"
        )

    def makespan(b: float) -> float:
        return max(finish_times(b, rates, startup_s, finish_s).values())

    lo, hi = 0.0, max(r.alone or r.together for r in rates.values()) * usable  # hi: more than fits
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if makespan(mid) <= usable else (lo, mid)
        if hi - lo <= lo * 1e-6:
            break
    budget = round_down(lo, digits)
    if budget <= 0:
        raise ValueError(f"no budget fits a window of {window_s:.0f} s")
    return Plan(budget, window_s, finish_times(budget, rates, startup_s, finish_s))


__all__ = ["Plan", "Rate", "finish_times", "largest_budget", "round_down"]
