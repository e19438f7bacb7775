"""Statistics: CIs that cover what they claim on samples of known distribution, the rank test, verdicts."""

import numpy as np
import pytest

from tfperf.measure import stats


@pytest.mark.parametrize("n", [11, 30, 200])
def test_median_ci_covers_the_true_median_about_95_percent_of_the_time(n):
    rng = np.random.default_rng(n)
    trials, covered = 2000, 0
    for _ in range(trials):
        # Lognormal: skewed like timings; its true median is exp(0) = 1.
        low, high = stats.median_ci(rng.lognormal(size=n))
        covered += low <= 1.0 <= high
    # Order-statistic intervals are conservative (at least 95%, a little more at small n).
    assert 0.94 <= covered / trials <= 0.99


def test_median_ci_with_too_few_samples_is_the_whole_range():
    assert stats.median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert stats.median_ci(np.arange(1.0, 101.0)) == (40.0, 61.0)  # the textbook ranks for n = 100
    with pytest.raises(ValueError, match="no samples"):
        stats.median_ci([])


def test_mean_ci_covers_the_mean_of_times_in_4_ms_steps():
    """An all-reduce's times on the emulated hosts: 1 to 12 ms in steps of the kernel's tick, the mean predicted."""
    rng = np.random.default_rng(4)
    steps, odds = np.array([1.0, 4.0, 8.0, 12.0]), np.array([0.2, 0.5, 0.25, 0.05])
    trials, covered = 2000, 0
    for _ in range(trials):
        low, high = stats.mean_ci(rng.choice(steps, size=42, p=odds))
        covered += low <= float(steps @ odds) <= high
    assert 0.93 <= covered / trials <= 0.97
    assert stats.mean_ci([5.0]) == (5.0, 5.0)
    assert stats.mean_ci([4.0, 6.0]) == pytest.approx((5 - 12.706, 5 + 12.706), abs=0.001)  # t(0.975, 1 df)
    with pytest.raises(ValueError, match="no samples"):
        stats.mean_ci([])


def test_ratio_ci_covers_a_known_ratio():
    rng = np.random.default_rng(1)
    trials, covered = 300, 0
    for t in range(trials):
        a = 1.3 * rng.lognormal(sigma=0.2, size=40)  # true median ratio: 1.3
        b = rng.lognormal(sigma=0.2, size=40)
        _, (low, high) = stats.ratio_ci(a, b, resamples=1000, seed=t)
        covered += low <= 1.3 <= high
    # The percentile bootstrap of a median is a little liberal at n = 40; it must still be near 95%.
    assert 0.88 <= covered / trials <= 0.995


def test_paired_rounds_cancel_a_drift_that_independent_sampling_cannot():
    rng = np.random.default_rng(2)
    rounds, per_round = 10, 5
    drift = np.repeat(np.linspace(1.0, 2.0, rounds), per_round)  # the machine slows down 2x over the run
    a = 1.10 * drift * rng.lognormal(sigma=0.01, size=rounds * per_round)
    b = 1.00 * drift * rng.lognormal(sigma=0.01, size=rounds * per_round)
    _, paired = stats.ratio_ci(a, b, rounds=rounds)
    _, independent = stats.ratio_ci(a, b)
    assert paired[0] > 1.0 and stats.verdict(paired) == stats.FASTER
    assert independent[0] < 1.0 < independent[1]  # the drift swamps a 10% difference without pairing
    assert paired[1] - paired[0] < (independent[1] - independent[0]) / 5
    with pytest.raises(ValueError, match="equal rounds"):
        stats.ratio_ci(a[:-1], b[:-1], rounds=rounds)


def test_mann_whitney_separates_shifted_samples_and_not_identical_ones():
    rng = np.random.default_rng(3)
    base = rng.lognormal(sigma=0.2, size=30)  # spread like timings on a busy machine
    assert stats.mann_whitney_p(base, base) == 1.0
    assert stats.mann_whitney_p(base, base * 1.5) < 0.05
    assert stats.mann_whitney_p(base, rng.lognormal(sigma=0.2, size=30)) > 0.01
    # Exact two-sided p for complete separation of 5 vs 5 is 2/252 = 0.0079; the approximation is close.
    assert stats.mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.0079, abs=0.006)


@pytest.mark.parametrize("ci, expected", [((1.1, 1.3), stats.FASTER), ((0.7, 0.9), stats.SLOWER),
                                          ((0.95, 1.2), stats.NO_DIFFERENCE), ((1.02, 1.04), stats.FASTER)])
def test_verdict_comes_from_the_interval(ci, expected):
    assert stats.verdict(ci) == expected


def test_threshold_widens_the_band_of_no_difference():
    assert stats.verdict((1.02, 1.04), threshold=0.05) == stats.NO_DIFFERENCE
    assert stats.verdict((0.90, 0.94), threshold=0.05) == stats.SLOWER


def test_comparison_describes_itself_in_words():
    c = stats.compare_times([2.0] * 10, [1.0] * 10, names=("a", "b"))
    assert c.ratio == 2.0 and c.verdict == stats.FASTER and c.describe().startswith("2.00x faster")
    slow = stats.compare_times([1.0] * 10, [2.0] * 10)
    assert slow.verdict == stats.SLOWER and slow.describe().startswith("2.00x slower")


def test_geometric_mean_cancels_reciprocal_ratios():
    assert stats.geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        stats.geometric_mean([])


def test_too_few_rounds_or_samples_never_make_a_verdict():
    # Two samples each that do not overlap: a bootstrap interval alone would call this a 2x speedup.
    few = stats.compare_times([2.0, 2.1], [1.0, 1.05])
    assert few.verdict == stats.NO_DIFFERENCE and few.too_few and "too few to judge" in few.describe()
    paired = stats.compare_times([2.0, 2.1] * 3, [1.0, 1.05] * 3, rounds=3)
    assert paired.verdict == stats.NO_DIFFERENCE and paired.units == 3
    enough = stats.compare_times([2.0, 2.1, 1.9] * 4, [1.0, 1.05, 0.95] * 4, rounds=stats.MIN_UNITS)
    assert enough.verdict == stats.FASTER and not enough.too_few


@pytest.mark.parametrize("ci, threshold, decided", [
    ((1.10, 1.20), 0.02, True),   # faster, whatever more data says
    ((0.99, 1.01), 0.02, True),   # inside the band: no difference worth a change
    ((1.01, 1.08), 0.02, False),  # straddles the 2% bar: more rounds could settle it either way
    ((0.90, 0.99), 0.02, False),  # straddles the mirror bar for slower
    ((0.95, 1.05), 0.0, False),   # with no threshold, an interval around 1 is never settled
])
def test_a_comparison_knows_when_its_interval_straddles_a_bar(ci, threshold, decided):
    c = stats.Comparison("a", "b", ratio=sum(ci) / 2, ci95=ci, verdict=stats.verdict(ci, threshold=threshold),
                         paired=True, threshold=threshold, units=10)
    assert c.decided is decided
