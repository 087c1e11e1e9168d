"""Paired tests: two things measured alternately, compared through their paired log-ratios (scipy).

A pair's few rounds estimate their own spread poorly; the spread of paired log-ratios is the machine's
and the visit's, much the same for every pair, so a search pools it over the other pairs it measured
(`pooled_pair_noise`) and each test takes that as a prior worth up to PRIOR_ROUNDS rounds (a moderated
t-test: the variance is the df-weighted mean of the pooled and the pair's own, the degrees of freedom
their sum), which also lets three rounds screen out one hit by interference. A pair whose own rounds
spread significantly wider than that (an F-test) is tested on them alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

MAD_TO_SD = 1.4826  # median absolute deviation of a normal distribution in standard deviations
OUTLIER_SD = 5.0  # paired log-ratios this many robust SDs from their median are interference, not signal
SCREEN_MIN_PAIRS = 6  # fewer pairs cannot tell an interfered pair from an unlucky one (without a prior)
PRIOR_ROUNDS = 20  # most degrees of freedom a pooled noise prior lends one paired test
WIDER_ALPHA = 0.01  # F-test level at which a pair's own spread is wider than the pooled prior


@dataclass(frozen=True)
class PairedEffect:
    """b over a from paired measurements: geometric-mean ratio, confidence interval, t-test p-value.

    `ratio` is exp(mean log(b_i / a_i)); the test and interval are on the log-ratios less `offset`
    (what a smooth trend alone predicts), so `p_value` says whether b departs from a by more than that.
    """

    ratio: float
    ci: tuple[float, float]
    p_value: float
    pairs: int
    dropped: int = 0  # pairs left out as interference (see OUTLIER_SD)
    offset: float = 0.0
    standard_error: float = math.inf  # of the mean log-ratio (about the relative change)

    @property
    def excess(self) -> float:
        """The ratio with the trend's expected ratio divided out."""
        return self.ratio / math.exp(self.offset)

    @property
    def saving_pct(self) -> tuple[float, tuple[float, float]]:
        """How much faster b is than a beyond the trend, in % (negative: slower), with its interval."""
        scale = math.exp(self.offset)
        return 100.0 * (1.0 - self.excess), (100.0 * (1.0 - self.ci[1] / scale), 100.0 * (1.0 - self.ci[0] / scale))

    def to_dict(self) -> dict:
        return {
            "ratio": round(self.ratio, 5),
            "ci": [round(self.ci[0], 5), round(self.ci[1], 5)],
            "p_value": float(f"{self.p_value:.3g}"),
            "pairs": self.pairs,
            "dropped": self.dropped,
            "trend_ratio": round(math.exp(self.offset), 5),
        }


def pooled_pair_noise(log_ratios: Iterable[Sequence[float]]) -> tuple[float, int]:
    """(robust SD of one value about its group's level, degrees of freedom) pooled over groups of two or
    more values (one pair's paired log-ratios, or one count's drift-corrected log values); (0, 0)
    without any.

    The estimate is the weighted median of the absolute differences within groups (a difference of two
    values is N(0, 2 SD^2) whatever the group's size), each group weighing its degrees of freedom.
    Residuals about each group's own median (as `relative_noise` pools) read 0.58 of the SD on groups of
    three, an aligned edge's coarse rounds; these differences are unbiased at any group size.
    """
    differences, weights, df = [], [], 0
    for values in log_ratios:
        d = np.asarray(values, dtype=float)
        if d.size < 2:
            continue
        i, j = np.triu_indices(d.size, 1)
        differences.append(np.abs(d[i] - d[j]))
        weights.append(np.full(i.size, 2.0 / d.size))  # n(n - 1) / 2 differences carry n - 1
        df += d.size - 1
    if not differences:
        return 0.0, 0
    median = np.quantile(np.concatenate(differences), 0.5, weights=np.concatenate(weights), method="inverted_cdf")
    return float(MAD_TO_SD * median / math.sqrt(2.0)), df


def paired_effect(
    a_ms: Sequence[float], b_ms: Sequence[float], *, offset: float = 0.0, confidence: float = 0.95,
    prior: tuple[float, int] = (0.0, 0),
) -> PairedEffect:
    """Compare b with a measured in pairs (a_i and b_i taken together); see `PairedEffect`.

    Pairs whose log-ratio lies more than OUTLIER_SD robust standard deviations from the median pair were
    hit by interference on one side only; they are left out and counted. The SD is the pairs' own (from
    SCREEN_MIN_PAIRS pairs on) or the `prior` (sd, df) from `pooled_pair_noise` (from three pairs on),
    which also moderates the t-test (see the module docstring).
    """
    a = np.asarray(a_ms, dtype=float)
    b = np.asarray(b_ms, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("paired samples must be two 1-D sequences of equal length")
    d = np.log(b) - np.log(a)
    prior_sd, prior_df = prior[0], min(prior[1], PRIOR_ROUNDS) if prior[0] > 0 else 0
    if d.size >= SCREEN_MIN_PAIRS:
        spread = MAD_TO_SD * float(np.median(np.abs(d - np.median(d))))
    else:
        spread = prior_sd if prior_df and d.size >= 3 else 0.0
    keep = np.abs(d - np.median(d)) <= OUTLIER_SD * spread if spread > 0 else np.ones(d.size, dtype=bool)
    kept = d[keep]
    if kept.size < 2:
        ratio = float(np.exp(kept.mean())) if kept.size else 1.0
        return PairedEffect(ratio, (0.0, math.inf), 1.0, int(kept.size), int((~keep).sum()), offset, math.inf)
    if prior_df:
        return _moderated(kept, offset, confidence, prior_sd, prior_df, int((~keep).sum()))
    if np.ptp(kept) == 0.0:  # identical pairs (a noiseless replay): the interval is the value itself
        value = float(kept[0])
        p = 1.0 if value == offset else 0.0
        return PairedEffect(math.exp(value), (math.exp(value), math.exp(value)), p, int(kept.size),
                            int((~keep).sum()), offset, 0.0)
    result = scipy_stats.ttest_1samp(kept - offset, 0.0)
    low, high = result.confidence_interval(confidence)
    return PairedEffect(
        ratio=float(np.exp(kept.mean())),
        ci=(float(np.exp(low + offset)), float(np.exp(high + offset))),
        p_value=float(result.pvalue),
        pairs=int(kept.size),
        dropped=int((~keep).sum()),
        offset=offset,
        standard_error=float(kept.std(ddof=1) / math.sqrt(kept.size)),
    )


def _moderated(d: np.ndarray, offset: float, confidence: float, prior_sd: float, prior_df: int,
               dropped: int) -> PairedEffect:
    """The t-test of `paired_effect` with the pair's variance moderated by a pooled prior; a pair whose own
    rounds spread significantly wider (F-test at WIDER_ALPHA) is tested on them alone: the prior lends
    precision to pairs that agree with it, it never hides a noisy pair's noise."""
    own = float(d.var(ddof=1))
    if scipy_stats.f.sf(own / prior_sd**2, d.size - 1, prior_df) < WIDER_ALPHA:
        variance, df = own, d.size - 1
    else:
        df = prior_df + d.size - 1
        variance = (prior_df * prior_sd**2 + (d.size - 1) * own) / df
    se = math.sqrt(variance / d.size)
    mean = float(d.mean())
    t = (mean - offset) / se if se > 0 else (0.0 if mean == offset else math.inf)
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, df)) * se
    return PairedEffect(
        ratio=math.exp(mean),
        ci=(math.exp(mean - half), math.exp(mean + half)),
        p_value=float(2.0 * scipy_stats.t.sf(abs(t), df)),
        pairs=int(d.size),
        dropped=dropped,
        offset=offset,
        standard_error=se,
    )
