"""Uncertainty of evaluation scores whose fine-tuning seeds are nested in pretraining seeds (every
evaluation's comparison: GLUE, NER, BLiMP, the probes, SQuAD).

A row of a comparison holds one or more encoders (pretraining seeds), each fine-tuned with one or
more seeds. Its estimate is the mean of the encoders' means. Two intervals are offered:

- ``t`` (the default): the two-level t interval. With P >= 2 encoders it is built on the P
  encoder means (P - 1 degrees of freedom): their spread holds both the pretraining and the
  fine-tuning noise, so the interval covers both, and its coverage is exact for normal scores
  with the same number of fine-tuning seeds per encoder, however few seeds there are. With one
  encoder it is built on its F fine-tuning scores (F - 1 degrees of freedom) and is *conditional*
  on that encoder: it says nothing about another pretraining seed (``conditional`` is set).
- ``bootstrap``: a hierarchical percentile bootstrap (encoders resampled with their fine-tuning
  scores; one encoder's scores when there is one). It assumes nothing about the shape of the
  scores, but a percentile bootstrap undercovers with few units (simulated, nominal 95%: about
  79% with 3 units, 87% with 10, 93% with 20-30), so use it with twenty or more.

Differences against a baseline are paired over matched seeds: scores of the same pretraining seed
and the same fine-tuning seed (same data order, same head initialisation) are subtracted, and the
paired t test runs on the per-encoder mean differences (P >= 2) or on the per-seed differences
(one encoder each: conditional on the two encoders). Rows whose seeds cannot be matched (for
instance several pretraining seeds against a scratch baseline, which has none) are compared
unpaired, with Welch's t.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
METHODS = ("t", "bootstrap")
BOOTSTRAP_SAMPLES = 4000


@dataclass
class Summary:
    """A row's estimate from ``{encoder: [scores over fine-tuning seeds]}``."""

    mean: float  # mean of the encoders' means
    median: float  # median of all scores
    sd_ft: float  # sd over fine-tuning seeds, pooled within encoders (0 with one seed each)
    sd_pt: float | None  # sd of the encoders' means (None with one encoder)
    ci: tuple[float, float] | None  # the interval at ``level`` (None when there is a single score)
    n: int  # scores
    encoders: int
    conditional: bool  # one encoder: the interval holds fine-tuning noise only

    def to_dict(self) -> dict:
        return asdict(self)


def bounded(ci, bounds: tuple[float, float] | None):
    """An interval cut to its metric's range (``bounds``; None: as it is): a t interval about a mean near
    an end of the range reaches past it when the seeds disagree (an accuracy of 114%)."""
    if not ci or bounds is None:
        return ci
    return (min(max(ci[0], bounds[0]), bounds[1]), max(min(ci[1], bounds[1]), bounds[0]))


@dataclass
class Difference:
    """A row minus the baseline."""

    mean: float
    ci: tuple[float, float] | None
    p: float | None
    pairs: int  # matched (pretraining seed, fine-tuning seed) pairs; 0 when unpaired
    test: str  # "paired t over encoders", "paired t over seeds", "Welch t" or "none"
    conditional: bool

    @property
    def significant(self) -> bool:
        return self.ci is not None and (self.ci[0] > 0 or self.ci[1] < 0)

    def to_dict(self) -> dict:
        return {**asdict(self), "significant": self.significant}


def _t_interval(values: np.ndarray, level: float) -> tuple[float, float] | None:
    n = len(values)
    if n < 2 or float(values.std(ddof=1)) == 0.0:  # no spread seen: nothing to build an interval on
        return None
    m, se = float(values.mean()), float(values.std(ddof=1)) / math.sqrt(n)
    h = float(sps.t.ppf(0.5 + level / 2, n - 1)) * se
    return m - h, m + h


def _units(groups: dict) -> tuple[list[np.ndarray], np.ndarray]:
    arrays = [np.asarray(v, dtype=np.float64) for v in groups.values() if len(v)]
    return arrays, np.array([a.mean() for a in arrays])


def nested_bootstrap(
    groups: dict, level: float = LEVEL, samples: int = BOOTSTRAP_SAMPLES, rng: np.random.Generator | None = None
) -> tuple[float, float] | None:
    """Percentile interval of the mean of encoder means, resampling the top level that varies:
    encoders (pretraining seeds) with replacement when there are several, each keeping its own
    fine-tuning scores, whose noise its mean already carries (resampling them as well would count
    it twice: 97% coverage for a nominal 95% at 20 x 3 seeds); one encoder's fine-tuning scores
    when there is one."""
    arrays, means = _units(groups)
    if sum(len(a) for a in arrays) < 2:
        return None
    rng = rng if rng is not None else np.random.default_rng(0)
    units = means if len(arrays) > 1 else arrays[0]
    estimates = units[rng.integers(0, len(units), size=(samples, len(units)))].mean(axis=1)
    lo, hi = np.quantile(estimates, [0.5 - level / 2, 0.5 + level / 2])
    return float(lo), float(hi)


def summarize(groups: dict, level: float = LEVEL, method: str = "t", rng: np.random.Generator | None = None) -> Summary:
    """Mean, median, both spreads and the interval of ``{encoder: [scores]}`` (see the module docstring)."""
    if method not in METHODS:
        raise ValueError(f"interval method {method!r}: expected one of {', '.join(METHODS)}.")
    arrays, means = _units(groups)
    if not arrays:
        raise ValueError("no scores to summarize")
    within = [float(a.var(ddof=1)) for a in arrays if len(a) > 1]
    every = np.concatenate(arrays)
    if method == "bootstrap":
        ci = nested_bootstrap(groups, level, rng=rng)
    else:
        ci = _t_interval(means if len(arrays) > 1 else arrays[0], level)
    return Summary(
        mean=float(means.mean()),
        median=float(np.median(every)),
        sd_ft=float(math.sqrt(np.mean(within))) if within else 0.0,
        sd_pt=float(means.std(ddof=1)) if len(arrays) > 1 else None,
        ci=ci,
        n=int(len(every)),
        encoders=len(arrays),
        conditional=len(arrays) == 1,
    )


def _p_value(values: np.ndarray) -> float | None:
    """Two-sided one-sample t test of mean zero."""
    n = len(values)
    if n < 2:
        return None
    sd = float(values.std(ddof=1))
    if sd == 0.0:  # identical differences from a few seeds (tied accuracies) are no evidence either way
        return None
    t = float(values.mean()) / (sd / math.sqrt(n))
    return float(2 * sps.t.sf(abs(t), n - 1))


def difference(
    row: dict, baseline: dict, level: float = LEVEL, method: str = "t", rng: np.random.Generator | None = None
) -> Difference:
    """``row`` minus ``baseline``; each is ``{pretraining seed: {fine-tuning seed: score}}``
    (pretraining seed None for an encoder without one, such as scratch)."""
    if set(row) == set(baseline):  # the same pretraining seeds on both sides
        pairs = {p: [row[p][f] - baseline[p][f] for f in sorted(set(row[p]) & set(baseline[p]))] for p in row}
    elif len(row) == 1 and len(baseline) == 1:  # one encoder each, under different (or no) pretraining seeds
        (r,), (b,) = row.values(), baseline.values()
        pairs = {0: [r[f] - b[f] for f in sorted(set(r) & set(b))]}
    else:
        pairs = {}
    pairs = {p: d for p, d in pairs.items() if d}
    n_pairs = sum(len(d) for d in pairs.values())
    if n_pairs >= 2:
        summary = summarize(pairs, level, method, rng)
        units = (
            np.array([np.mean(d) for d in pairs.values()]) if len(pairs) > 1 else np.array(next(iter(pairs.values())))
        )
        test = "paired t over encoders" if len(pairs) > 1 else "paired t over seeds"
        return Difference(summary.mean, summary.ci, _p_value(units), n_pairs, test, len(pairs) == 1)
    return unpaired(row, baseline, level)


def unpaired(row: dict, baseline: dict, level: float) -> Difference:
    """Unpaired: the difference of the two rows' means, Welch's t on their units (encoder means,
    or the scores of a single encoder)."""

    def units(side: dict) -> np.ndarray:
        groups = [np.array(list(v.values()), dtype=np.float64) for v in side.values() if v]
        return np.array([g.mean() for g in groups]) if len(groups) > 1 else (groups[0] if groups else np.array([]))

    a, b = units(row), units(baseline)
    mean = float(a.mean() - b.mean()) if len(a) and len(b) else float("nan")
    if len(a) < 2 or len(b) < 2:
        return Difference(mean, None, None, 0, "none", True)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Difference(mean, None, None, 0, "none", len(row) == 1 or len(baseline) == 1)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    h = float(sps.t.ppf(0.5 + level / 2, df)) * se
    p = float(2 * sps.t.sf(abs(mean) / se, df))
    return Difference(mean, (mean - h, mean + h), p, 0, "Welch t", len(row) == 1 or len(baseline) == 1)


# --- zero-shot items (minimal pairs): every encoder is scored on the same items ---------------------
def _item_draws(items: list[np.ndarray], samples: int, rng: np.random.Generator) -> np.ndarray:
    """(samples, encoders): each encoder's accuracy on ``samples`` bootstrap resamples of the items,
    the same resample for every encoder. Items are counted by their pattern of outcomes across the
    encoders, so a resample is one multinomial draw over the patterns (cheap for 67,000 items)."""
    matrix = np.stack([np.asarray(a, dtype=np.uint8) for a in items], axis=1)
    patterns, counts = np.unique(matrix, axis=0, return_counts=True)
    n = len(matrix)
    draws = rng.multinomial(n, counts / n, size=samples)
    return draws @ patterns / n


def summarize_items(
    items: dict, level: float = LEVEL, samples: int = BOOTSTRAP_SAMPLES, rng: np.random.Generator | None = None
) -> Summary:
    """Accuracy x 100 of ``{encoder: 0/1 outcome per item}`` (every encoder on the same items): the
    mean of the encoders' accuracies; the interval a bootstrap over items (the same resample for all
    encoders) and, with several encoders (pretraining seeds), over encoders too."""
    rng = rng if rng is not None else np.random.default_rng(0)
    arrays = list(items.values())
    acc = np.array([100.0 * np.mean(a) for a in arrays])
    draws = 100.0 * _item_draws(arrays, samples, rng)
    if len(arrays) > 1:
        draws = np.take_along_axis(draws, rng.integers(0, len(arrays), size=draws.shape), axis=1)
    lo, hi = np.quantile(draws.mean(axis=1), [0.5 - level / 2, 0.5 + level / 2])
    return Summary(
        mean=float(acc.mean()),
        median=float(np.median(acc)),
        sd_ft=0.0,
        sd_pt=float(acc.std(ddof=1)) if len(acc) > 1 else None,
        ci=(float(lo), float(hi)),
        n=len(acc),
        encoders=len(acc),
        conditional=len(acc) == 1,
    )


def item_difference(
    row: dict,
    baseline: dict,
    level: float = LEVEL,
    samples: int = BOOTSTRAP_SAMPLES,
    rng: np.random.Generator | None = None,
) -> Difference:
    """``row`` minus ``baseline`` in accuracy x 100, each ``{pretraining seed: 0/1 outcome per item}``,
    on the same items. One encoder each: McNemar's exact test on the pairs the two disagree on, the
    interval a paired bootstrap over items. Several with the same pretraining seeds: a paired t over
    the seeds' differences, the interval a bootstrap over the seeds and the items."""
    rng = rng if rng is not None else np.random.default_rng(0)
    seeds = sorted(set(row) & set(baseline), key=str) if set(row) == set(baseline) else []
    if len(row) == 1 and len(baseline) == 1:
        (r,), (b,) = row.values(), baseline.values()
        r, b = np.asarray(r, dtype=bool), np.asarray(b, dtype=bool)
        draws = 100.0 * _item_draws([r, b], samples, rng)
        diff = draws[:, 0] - draws[:, 1]
        lo, hi = np.quantile(diff, [0.5 - level / 2, 0.5 + level / 2])
        only_row, only_base = int((r & ~b).sum()), int((~r & b).sum())
        p = float(sps.binomtest(only_row, only_row + only_base, 0.5).pvalue) if only_row + only_base else None
        return Difference(
            float(100.0 * (r.mean() - b.mean())), (float(lo), float(hi)), p, len(r), "McNemar (exact) over items", True
        )
    if len(seeds) >= 2:
        draws = 100.0 * _item_draws([row[k] for k in seeds] + [baseline[k] for k in seeds], samples, rng)
        diffs = draws[:, : len(seeds)] - draws[:, len(seeds) :]
        pick = rng.integers(0, len(seeds), size=diffs.shape)
        lo, hi = np.quantile(np.take_along_axis(diffs, pick, axis=1).mean(axis=1), [0.5 - level / 2, 0.5 + level / 2])
        per_seed = np.array([100.0 * (np.mean(row[k]) - np.mean(baseline[k])) for k in seeds])
        return Difference(
            float(per_seed.mean()),
            (float(lo), float(hi)),
            _p_value(per_seed),
            len(seeds),
            "paired t over encoders",
            False,
        )
    return unpaired(
        {k: {0: 100.0 * float(np.mean(v))} for k, v in row.items()},
        {k: {0: 100.0 * float(np.mean(v))} for k, v in baseline.items()},
        level,
    )


def seeds_needed(sd: float, delta: float, power: float = 0.8, alpha: float = 0.05, paired: bool = False) -> int:
    """Runs per encoder for a two-sided test at ``alpha`` to detect a true difference ``delta``
    with probability ``power``, when one run's score has standard deviation ``sd``: the normal
    approximation n = k (z_{1-alpha/2} + z_power)^2 sd^2 / delta^2, k = 2 for two independent rows
    (k = 1 when ``sd`` is already the sd of paired differences), at least 2."""
    if delta <= 0:
        raise ValueError("delta must be positive")
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    k = 1.0 if paired else 2.0
    return max(2, math.ceil(k * (z * sd / delta) ** 2))


__all__ = [
    "Difference",
    "LEVEL",
    "METHODS",
    "Summary",
    "difference",
    "item_difference",
    "nested_bootstrap",
    "seeds_needed",
    "summarize",
    "summarize_items",
    "unpaired",
]
