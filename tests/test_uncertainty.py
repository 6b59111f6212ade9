"""The statistics of comparisons, checked by simulation: intervals cover the true mean about as
often as they claim, a planted difference is found, identical rows give false positives at the
nominal rate and no more, and the seeds-needed rule delivers the power it promises."""

import numpy as np
import pytest

from pretrainlab import uncertainty

MU, SD_PT, SD_FT = 60.0, 2.0, 3.0  # a row's true mean, the sd over pretraining and over fine-tuning seeds


def draw(rng, encoders: int, seeds: int, mu: float = MU, offsets=None) -> dict:
    """{pretraining seed: {fine-tuning seed: score}}; ``offsets``: the encoders' own deviations."""
    offsets = rng.normal(0, SD_PT, encoders) if offsets is None else offsets
    return {p: {f: mu + offsets[p] + rng.normal(0, SD_FT) for f in range(seeds)} for p in range(encoders)}


def groups(row: dict) -> dict:
    return {p: list(v.values()) for p, v in row.items()}


def coverage(method: str, encoders: int, seeds: int, trials: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        offsets = rng.normal(0, SD_PT, encoders)
        # several encoders: the interval is about the objective (any pretraining seed); one: about that encoder
        target = MU if encoders > 1 else MU + offsets[0]
        lo, hi = uncertainty.summarize(groups(draw(rng, encoders, seeds, offsets=offsets)), method=method, rng=rng).ci
        hits += lo <= target <= hi
    return hits / trials


@pytest.mark.parametrize("encoders,seeds", [(3, 3), (5, 2), (1, 3), (1, 5)])
def test_t_interval_covers_the_true_mean_95_percent_of_the_time(encoders, seeds):
    # 4000 trials: the binomial sd of the coverage is 0.0034, so 0.935-0.965 is about +-4.5 sd
    assert 0.935 <= coverage("t", encoders, seeds, 4000) <= 0.965


def test_bootstrap_interval_covers_near_nominal_with_many_seeds():
    # a percentile bootstrap undercovers with few units (documented); with 20 encoders it is close
    assert 0.915 <= coverage("bootstrap", 20, 3, 1500, seed=1) <= 0.97


def test_summary_reports_both_spreads_median_and_a_conditional_interval_for_one_encoder():
    row = {0: [50.0, 52.0, 54.0], 1: [60.0, 62.0, 64.0]}
    s = uncertainty.summarize(row)
    assert s.mean == pytest.approx(57.0) and s.median == pytest.approx(57.0)
    assert s.sd_ft == pytest.approx(2.0) and s.sd_pt == pytest.approx(np.std([52, 62], ddof=1))
    assert s.encoders == 2 and s.n == 6 and not s.conditional
    # two encoder means 52 and 62: t(0.975, 1) = 12.706, se = 5
    assert s.ci == pytest.approx((57 - 12.7062 * 5, 57 + 12.7062 * 5), rel=1e-4)
    one = uncertainty.summarize({0: [50.0, 52.0, 54.0]})
    assert (
        one.conditional
        and one.sd_pt is None
        and one.ci == pytest.approx((52 - 4.3027 * 2 / 3**0.5, 52 + 4.3027 * 2 / 3**0.5), rel=1e-4)
    )
    assert uncertainty.summarize({0: [50.0]}).ci is None
    with pytest.raises(ValueError, match="interval method"):
        uncertainty.summarize(row, method="jackknife")


def rates(delta: float, encoders: int, seeds: int, trials: int, seed: int = 0) -> tuple[float, float]:
    """(how often the interval excludes zero, how often p < 0.05) for rows whose true means differ
    by ``delta``, their fine-tuning seeds matched. With one encoder a row the test is about the two
    encoders (conditional), so the null is two encoders of equal quality: no pretraining offset."""
    rng = np.random.default_rng(seed)
    flagged = low_p = 0
    offsets = np.zeros(1) if encoders == 1 else None
    for _ in range(trials):
        d = uncertainty.difference(
            draw(rng, encoders, seeds, MU + delta, offsets), draw(rng, encoders, seeds, offsets=offsets)
        )
        flagged += d.significant
        low_p += d.p < 0.05
    return flagged / trials, low_p / trials


@pytest.mark.parametrize("encoders,seeds", [(1, 5), (3, 3)])
def test_identical_rows_are_flagged_at_the_nominal_rate_and_no_more(encoders, seeds):
    flagged, low_p = rates(0.0, encoders, seeds, 4000)
    assert flagged <= 0.065 and low_p <= 0.065
    assert flagged >= 0.035  # the test is not needlessly conservative either
    assert flagged == low_p  # the interval and the p-value agree: the same t test


def test_a_planted_difference_is_detected():
    # 6 points between encoders whose single runs have an sd of 3 (fine-tuning): with 10 matched
    # seeds the paired t test finds it nearly always
    flagged, _ = rates(6.0, 1, 10, 500, seed=2)
    assert flagged >= 0.9
    rng = np.random.default_rng(3)
    d = uncertainty.difference(draw(rng, 1, 10, MU + 6.0, np.zeros(1)), draw(rng, 1, 10, offsets=np.zeros(1)))
    assert d.significant and d.p < 0.01 and d.test == "paired t over seeds" and d.pairs == 10
    assert d.ci[0] < 6.0 < d.ci[1]


def test_one_pretraining_seed_a_row_cannot_tell_objectives_apart_from_seed_luck():
    # the same objective twice, one pretraining seed each: the encoders differ by their pretraining
    # luck (sd 2), which a test over fine-tuning seeds does not see; it flags them far above 5%.
    # This is why a row with one encoder is marked conditional.
    rng = np.random.default_rng(6)
    flagged = sum(uncertainty.difference(draw(rng, 1, 5), draw(rng, 1, 5)).significant for _ in range(1000)) / 1000
    assert flagged > 0.12
    assert uncertainty.difference(draw(rng, 1, 5), draw(rng, 1, 5)).conditional


def test_pairing_by_pretraining_seed_and_the_unpaired_fallback():
    rng = np.random.default_rng(4)
    a, b = draw(rng, 3, 2, MU + 1), draw(rng, 3, 2)
    d = uncertainty.difference(a, b)
    assert d.test == "paired t over encoders" and d.pairs == 6 and not d.conditional
    means = [np.mean([a[p][f] - b[p][f] for f in range(2)]) for p in range(3)]
    assert d.mean == pytest.approx(np.mean(means))
    # several pretraining seeds against a baseline without any (scratch): no pairing, Welch's t
    scratch = {None: {0: 55.0, 1: 57.0, 2: 56.0}}
    w = uncertainty.difference(a, scratch)
    assert w.test == "Welch t" and w.pairs == 0 and w.p is not None


def test_seeds_needed_delivers_the_promised_power():
    sd, delta = SD_FT, 4.0
    n = uncertainty.seeds_needed(sd, delta)
    assert n == int(np.ceil(2 * (1.959964 + 0.841621) ** 2 * sd**2 / delta**2))
    rng = np.random.default_rng(5)
    found = 0
    trials = 1000
    for _ in range(trials):  # two independent rows (no pairing), n runs each
        a, b = rng.normal(MU + delta, sd, n), rng.normal(MU, sd, n)
        found += uncertainty.unpaired({0: dict(enumerate(a))}, {0: dict(enumerate(b))}, 0.95).p < 0.05
    assert 0.72 <= found / trials <= 0.9  # 80% power by the normal approximation, slightly less with t
    assert uncertainty.seeds_needed(sd, 2 * delta) < n
