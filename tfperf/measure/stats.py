"""Statistics for timings: confidence intervals of medians and ratios, a rank test, and verdicts.

NumPy (and SciPy's Student t), no TensorFlow: `tfperf compare` uses it on stored samples and answers at once.
Timings are skewed (a floor, and a tail of interruptions), so everything here is built on medians
and ranks, never on means and standard deviations.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np

FASTER, SLOWER, NO_DIFFERENCE = "faster", "slower", "no measurable difference"
# torch.utils.benchmark's rule: an interquartile range over 10% of the median means the machine moved.
UNSTABLE_IQR = 0.10


@functools.lru_cache(maxsize=256)  # a few sample counts recur (every row of a run has the same n): kept, read-only
def _log_binom_half_cdf(n: int) -> np.ndarray:
    """log P(X <= k) for k = 0..n, X ~ Binomial(n, 1/2), in log space so that large n does not underflow."""
    log_pmf = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(n + 1)])
    cdf = np.logaddexp.accumulate(log_pmf - n * math.log(2))
    cdf.flags.writeable = False
    return cdf


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median, from order statistics.

    The number of samples below the true median is Binomial(n, 1/2) whatever the distribution, so
    the interval [x_(k), x_(n-k+1)] covers it with probability 1 - 2 P(X < k). With too few samples
    for the confidence asked (n < 6 at 95%), the interval is the whole range [min, max].
    """
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = len(x)
    if n == 0:
        raise ValueError("no samples: a confidence interval needs at least one")
    alpha = 1.0 - confidence
    # The largest k (1-based) with P(X <= k - 1) <= alpha / 2, at most n // 2.
    k = min(int(np.sum(_log_binom_half_cdf(n) <= math.log(alpha / 2))), n // 2)
    if k == 0:
        return float(x[0]), float(x[-1])
    return float(x[k - 1]), float(x[n - k])


def mean_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Student's t interval of the mean: where a mean is what is predicted (times that add up, as a step's
    all-reduces do), however lumpy the times (a 4 ms scheduler tick's steps). One sample: the point itself."""
    x = np.asarray(samples, dtype=np.float64)
    if len(x) == 0:
        raise ValueError("no samples: a confidence interval needs at least one")
    mean = float(x.mean())
    if len(x) == 1:
        return mean, mean
    half = t_quantile(0.5 + confidence / 2, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean - half, mean + half


def _binomial_cdf(n: int, p: float) -> np.ndarray:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, p), computed in logs (n in the hundred thousands is fine)."""
    k = np.arange(n + 1)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
    log_pmf = log_fact[n] - log_fact[k] - log_fact[n - k] + k * math.log(p) + (n - k) * math.log1p(-p)
    return np.minimum(np.cumsum(np.exp(log_pmf - log_pmf.max())) / np.exp(log_pmf - log_pmf.max()).sum(), 1.0)


def quantile_ci(samples: Sequence[float], q: float, confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the q-quantile (0.99 for p99), from order statistics.

    How many samples fall below the true quantile is Binomial(n, q) whatever the distribution, so
    [x_(j), x_(m)] covers it with probability P(j <= B < m). A bound the samples cannot give at this
    confidence (p99 from a few hundred samples has no upper one) is -inf or inf: collect more.
    """
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = len(x)
    if n == 0:
        raise ValueError("no samples: a confidence interval needs at least one")
    if not 0 < q < 1:
        raise ValueError(f"q must be between 0 and 1, got {q}")
    alpha = 1.0 - confidence
    cdf = _binomial_cdf(n, q)  # cdf[k] = P(B <= k)
    j = int(np.sum(cdf <= alpha / 2))  # the largest j with P(B <= j - 1) <= alpha/2 (1-based)
    m = int(np.argmax(cdf >= 1 - alpha / 2)) + 1 if cdf[-1] >= 1 - alpha / 2 else n + 1
    low = float(x[j - 1]) if j >= 1 else -math.inf
    high = float(x[m - 1]) if m <= n else math.inf
    return low, high


def _rounds(samples: np.ndarray, rounds: int) -> np.ndarray:
    if rounds < 1 or len(samples) % rounds:
        raise ValueError(f"{len(samples)} samples do not split into {rounds} equal rounds")
    return samples.reshape(rounds, -1)


def ratio_ci(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    rounds: int | None = None,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    statistic: str = "median",
) -> tuple[float, tuple[float, float]]:
    """median(baseline) / median(candidate), with a percentile-bootstrap confidence interval.

    `statistic="mean"` compares totals instead: what a user pays over all the calls, where a few long ones (a
    compile at two of six new sizes) matter and a median would hide them.

    With `rounds`, both sample sets were taken in that many interleaved rounds (round i of one beside
    round i of the other, equal samples per round): the bootstrap then draws whole rounds, the same
    ones for both, so that a drift of the machine's speed moves both sides together and cancels in
    the ratio. Without it the two sets are independent (two separate runs) and are drawn apart.
    For times, the ratio is how many times faster the candidate is.
    """
    a = np.asarray(baseline, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    if len(a) == 0 or len(b) == 0:
        raise ValueError("a ratio needs samples on both sides")
    center = {"median": np.median, "mean": np.mean}[statistic]
    point = float(center(a) / center(b))
    rng = np.random.default_rng(seed)
    if rounds is not None:
        ra, rb = _rounds(a, rounds), _rounds(b, rounds)
        picks = rng.integers(0, rounds, size=(resamples, rounds))
        med_a = center(ra[picks].reshape(resamples, -1), axis=1)
        med_b = center(rb[picks].reshape(resamples, -1), axis=1)
    else:
        med_a = center(a[rng.integers(0, len(a), size=(resamples, len(a)))], axis=1)
        med_b = center(b[rng.integers(0, len(b), size=(resamples, len(b)))], axis=1)
    ratios = med_a / med_b
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return point, (float(low), float(high))


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation with tie correction)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("the rank test needs samples on both sides")
    both = np.concatenate([x, y])
    order = both.argsort(kind="mergesort")
    ranks = np.empty(len(both))
    sorted_values = both[order]
    # Average ranks for ties.
    i = 0
    while i < len(both):
        j = i
        while j + 1 < len(both) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    _, counts = np.unique(both, return_counts=True)
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - (counts**3 - counts).sum() / (n * (n - 1) if n > 1 else 1))
    if variance <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)  # with continuity correction
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))


# The fewest independent units (rounds when paired, samples per side otherwise) a verdict may rest on:
# with fewer, a bootstrap interval is far too narrow (two samples each that happen not to overlap would
# "prove" a speedup), and no rank test could reach significance either.
MIN_UNITS = 6


def verdict(ci: tuple[float, float], *, threshold: float = 0.0) -> str:
    """"faster" when the whole speedup CI is above 1 + threshold, "slower" when below 1 / (1 + threshold)."""
    low, high = ci
    if low > 1.0 + threshold:
        return FASTER
    if high < 1.0 / (1.0 + threshold):
        return SLOWER
    return NO_DIFFERENCE


def short_of_threshold(ci: Sequence[float], verdict_said: str, threshold: float) -> bool:
    """A change the interval shows (it excludes 1) that did not clear the threshold the verdict asks: 'no measurable
    difference' beside 'CI 1.02-1.47x' reads as a contradiction unless the threshold is said."""
    low, high = ci
    return verdict_said == NO_DIFFERENCE and bool(threshold) and (low > 1 or high < 1)


def against_goal(cis: Sequence[Sequence[float]], goal: float) -> str:
    """A model's errors judged by their 95% intervals against +-goal: "within" when every interval lies inside it,
    "outside" when one lies wholly beyond it, else "not settled against" (a point estimate alone flipped between two
    runs of the same code: +14% and +24%, each interval spanning 15%)."""
    if all(abs(low) <= goal and abs(high) <= goal for low, high in cis):
        return "within"
    return "outside" if any(low > goal or high < -goal for low, high in cis) else "not settled against"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How many times faster a candidate is than a baseline, with its CI and the verdict it supports."""

    baseline: str
    candidate: str
    ratio: float
    ci95: tuple[float, float]
    verdict: str
    paired: bool
    threshold: float = 0.0
    units: int | None = None  # the rounds (paired) or the smaller side's samples the interval rests on
    # The times per item both sides were judged on (baseline, candidate), so that a record can be re-judged.
    samples: tuple[tuple[float, ...], tuple[float, ...]] | None = dataclasses.field(default=None, repr=False)
    statistic: str = "median"  # what the ratio divides: medians, or means (totals)

    @property
    def too_few(self) -> bool:
        """Too few rounds or samples for any verdict but 'no measurable difference'."""
        return self.units is not None and self.units < MIN_UNITS

    @property
    def decided(self) -> bool:
        """True when the CI lies wholly on one side of each verdict boundary (1 + threshold and its
        inverse): more samples would not be expected to change the verdict. False when it straddles one."""
        low, high = self.ci95
        return not any(low < bound < high for bound in (1 + self.threshold, 1 / (1 + self.threshold)))

    def describe(self) -> str:
        """'1.42x faster (95% CI 1.31-1.55x)' or 'no measurable difference (0.97x, 95% CI 0.91-1.04x)'."""
        low, high = self.ci95
        if self.too_few:
            what = "rounds" if self.paired else "samples"
            return (f"no measurable difference ({self.ratio:.2f}x from {self.units} {what}: "
                    f"too few to judge, {MIN_UNITS} needed)")
        if self.verdict == FASTER:
            return f"{self.ratio:.2f}x faster (95% CI {low:.2f}-{high:.2f}x)"
        if self.verdict == SLOWER:
            return f"{1 / self.ratio:.2f}x slower (95% CI {1 / high:.2f}-{1 / low:.2f}x)"
        # The interval excludes 1 but does not clear the threshold: a change, not shown to be one that counts.
        below = f", not shown to clear the {self.threshold:.0%} that counts" if short_of_threshold(
            self.ci95, self.verdict, self.threshold) else ""
        return f"no measurable difference ({self.ratio:.2f}x, 95% CI {low:.2f}-{high:.2f}x{below})"


def compare_times(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    names: tuple[str, str] = ("baseline", "candidate"),
    rounds: int | None = None,
    threshold: float = 0.0,
    seed: int = 0,
    statistic: str = "median",
) -> Comparison:
    """Compare two sets of times (seconds per item): the candidate's speedup over the baseline (by their
    medians, or with `statistic="mean"` their totals)."""
    ratio, ci = ratio_ci(baseline, candidate, rounds=rounds, seed=seed, statistic=statistic)
    units = rounds if rounds is not None else min(len(baseline), len(candidate))
    judged = verdict(ci, threshold=threshold) if units >= MIN_UNITS else NO_DIFFERENCE
    return Comparison(baseline=names[0], candidate=names[1], ratio=ratio, ci95=ci, verdict=judged,
                      paired=rounds is not None, threshold=threshold, units=units,
                      samples=(tuple(map(float, baseline)), tuple(map(float, candidate))), statistic=statistic)


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean: the right average of ratios (a 2x and a 0.5x cancel)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0 or np.any(v <= 0):
        raise ValueError("a geometric mean needs positive values")
    return float(np.exp(np.log(v).mean()))


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (the normal's when df is infinite)."""
    from scipy.special import ndtri, stdtrit

    return float(ndtri(p) if math.isinf(df) else stdtrit(df, p))


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom."""
    from scipy.special import ndtr, stdtr

    tail = ndtr(-abs(t)) if math.isinf(df) else stdtr(df, -abs(t))
    return float(min(1.0, 2 * tail))


def moderated_variance(variance: float, df: float, prior_variance: float, prior_df: float) -> tuple[float, float]:
    """A variance estimated from few runs, pulled toward a prior one (limma's moderated variance): the
    prior counts as `prior_df` more degrees of freedom (infinite: the prior alone). Returns (variance, df)."""
    if math.isinf(prior_df):
        return prior_variance, math.inf
    total = df + prior_df
    if total <= 0:
        raise ValueError("a variance needs at least one degree of freedom")
    return (df * variance + prior_df * prior_variance) / total, total


def _trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x, by Newton's method from limma's starting point (x > 0)."""
    from scipy.special import polygamma

    if x > 1e7:
        return 1 / math.sqrt(x)
    if x < 1e-6:
        return 1 / x
    y = 0.5 + 1 / x
    for _ in range(50):
        tri = float(polygamma(1, y))
        step = tri * (1 - tri / x) / float(polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


def variance_prior(variances: Sequence[float], dfs: Sequence[float], *,
                   prior_df: float | None = None) -> tuple[float, float]:
    """The prior of many figures' variances, each estimated from few degrees of freedom (Smyth 2004, as
    limma's squeezeVar): (prior variance, prior degrees of freedom). The more alike the variances, the
    more degrees of freedom the prior earns (infinite when they differ no more than sampling explains);
    the more they differ, the more each figure keeps its own. Given `prior_df`, only the variance is
    estimated (a group's, with the degrees of freedom learnt from all groups). Zero variances are left out."""
    from scipy.special import digamma, polygamma

    pairs = [(v, d) for v, d in zip(variances, dfs) if v > 0 and d > 0]
    if not pairs:
        raise ValueError("a variance prior needs at least one positive variance")
    v, d = np.array(pairs).T
    e = np.log(v) - digamma(d / 2) + np.log(d / 2)
    mean = float(e.mean())
    if prior_df is None:
        excess = float(e.var(ddof=1) - np.mean(polygamma(1, d / 2))) if len(e) > 1 else 0.0
        prior_df = 2 * _trigamma_inverse(excess) if excess > 0 else math.inf
    if math.isinf(prior_df):
        return math.exp(mean), math.inf
    return math.exp(mean + float(digamma(prior_df / 2)) - math.log(prior_df / 2)), prior_df


def benjamini_hochberg(p_values: Sequence[float], q: float = 0.05) -> list[bool]:
    """Which hypotheses to reject with the false discovery rate at `q` (Benjamini-Hochberg). When every
    hypothesis is true (an A/A comparison), the chance of rejecting any is at most q."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    largest = 0
    for rank, i in enumerate(order, start=1):
        if p_values[i] <= q * rank / m:
            largest = rank
    rejected = set(order[:largest])
    return [i in rejected for i in range(m)]

