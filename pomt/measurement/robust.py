"""Robust estimates from latencies (pure maths): paired tests, the smooth trend of a curve, the priced curve.

Paired tests compare two things measured alternately through their log-ratios (`paired_effect`). The trend is a
robust quadratic that steps do not bend (`trend`). The priced curve, what every choice prices schedules from, shrinks
each count's level toward a local trend by its own standard error (`priced_curve`): noise a few visits put low does
not attract a schedule, while real structure of a quiet machine stays.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy import stats as scipy_stats
from scipy.stats import median_abs_deviation

from pomt.formats.curve import CurvePoint

MAD_TO_SD = 1.4826  # median absolute deviation of a normal distribution in standard deviations
OUTLIER_SD = 5.0  # paired log-ratios this many robust SDs from their median are interference, not signal
SCREEN_MIN_PAIRS = 6  # fewer pairs cannot tell an interfered pair from an unlucky one (without a prior)
PRIOR_ROUNDS = 20  # most degrees of freedom a pooled noise prior lends one paired test
WIDER_ALPHA = 0.01  # F-test level at which a pair's own spread is wider than the pooled prior
JUMP_GUESS = 3.0  # noise units of a single-interval change that count as a step for the first trend
STEP_SHARE = 0.5  # most of the curve's span the intervals set aside as steps may cover (steps are outliers)
LOW_QUARTILE_ABS_NORMAL = 0.3186  # 25th percentile of |N(0, 1)|
SMOOTH_SHARE = 0.2  # a local fit reaches this share of the curve's count range each side
ROBUST_PASSES = 2  # bisquare reweightings after the first fit
BISQUARE_SPAN = 6.0  # residuals beyond this many median absolute residuals get no weight
CHI2_MEDIAN = 0.4549  # the median of a chi-square variable with one degree of freedom


@dataclass(frozen=True)
class PairedEffect:
    """b over a from paired measurements: `ratio` exp(mean log(b_i / a_i)), its interval and t-test p-value, both
    on the log-ratios less `offset` (what the trend alone predicts): whether b departs from a by more than that."""

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
        return {"ratio": round(self.ratio, 5), "ci": [round(self.ci[0], 5), round(self.ci[1], 5)],
                "p_value": float(f"{self.p_value:.3g}"), "pairs": self.pairs, "dropped": self.dropped,
                "trend_ratio": round(math.exp(self.offset), 5)}


def pooled_pair_noise(log_ratios: Iterable[Sequence[float]]) -> tuple[float, int]:
    """(robust SD of one value about its group's level, degrees of freedom) pooled over groups of two or more values;
    (0, 0) without any. From the differences within groups, so unbiased at any group size."""
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


def paired_effect(a_ms: Sequence[float], b_ms: Sequence[float], *, offset: float = 0.0, confidence: float = 0.95,
                  prior: tuple[float, int] = (0.0, 0)) -> PairedEffect:
    """Compare b with a measured in pairs. Pairs more than OUTLIER_SD robust SDs from the median pair were hit by
    interference and are left out; the `prior` (sd, df) of `pooled_pair_noise` moderates the t-test."""
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
    return PairedEffect(float(np.exp(kept.mean())), (float(np.exp(low + offset)), float(np.exp(high + offset))),
                        float(result.pvalue), int(kept.size), int((~keep).sum()), offset,
                        float(kept.std(ddof=1) / math.sqrt(kept.size)))


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
    return PairedEffect(math.exp(mean), (math.exp(mean - half), math.exp(mean + half)),
                        float(2.0 * scipy_stats.t.sf(abs(t), df)), int(d.size), dropped, offset, se)


def trend(t: np.ndarray, y: np.ndarray, sigma: float | None = None, floor: float = 0.0) -> np.ndarray:
    """Robust quadratic trend of y over t, evaluated at t; steps do not bend it: a weighted repeated-median line
    through the intervals' slopes sets aside the jumps (at most STEP_SHARE of the span), then least squares in level
    space with those jumps taken out. `sigma` defaults to a lower-quartile spread of the changes."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    if t.size < 3:
        return np.full_like(y, y.mean()) if t.size < 2 else y.copy()
    mid = 0.5 * (t[:-1] + t[1:])
    gap = np.diff(t)
    slope = np.diff(y) / gap
    use = np.ones(mid.size, dtype=bool)
    fitted = np.median(slope) * t
    for _ in range(6):
        if use.sum() >= 3:
            a, b = _weighted_repeated_median(mid[use], slope[use], gap[use])
            fitted = a * t + 0.5 * b * t**2
        change = np.diff(y - fitted)
        centred = change - np.median(change[use]) if use.any() else change
        noise = sigma if sigma is not None else low_quartile_sd(centred) / math.sqrt(2.0)
        again = np.abs(centred) < JUMP_GUESS * max(noise, floor, 1e-12) * math.sqrt(2.0)
        if np.array_equal(again, use) or gap[~again].sum() > STEP_SHARE * gap.sum():
            break
        use = again
    change = np.diff(y - fitted)
    jumps = np.where(use, 0.0, change - np.median(change[use]) if use.any() else change)
    base = y - np.concatenate([[0.0], np.cumsum(jumps)])
    x = (t - t.mean()) / (np.ptp(t) or 1.0)
    smooth = np.polynomial.polynomial.polyval(x, np.polynomial.polynomial.polyfit(x, base, min(2, t.size - 2)))
    if np.all(y > 0) and np.any(smooth <= 0):  # no latency has a level at or below zero
        return _through_points(x, y)
    return smooth


def _through_points(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The least-squares quadratic through the points, refitted once without those beyond JUMP_GUESS robust SDs:
    the trend where taking steps out as offsets carried it to or below zero (a sawtooth of aligned pairs)."""
    degree = min(2, x.size - 2)
    fitted = np.polynomial.polynomial.polyval(x, np.polynomial.polynomial.polyfit(x, y, degree))
    residual = y - fitted
    keep = np.abs(residual - np.median(residual)) <= JUMP_GUESS * median_abs_deviation(residual, scale="normal")
    if keep.sum() > degree + 1 and not keep.all():
        fitted = np.polynomial.polynomial.polyval(x, np.polynomial.polynomial.polyfit(x[keep], y[keep], degree))
    return fitted


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, 0.5 * cum[-1])])


def _weighted_repeated_median(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Siegel's repeated-median line y = a + b x with weights (robust to nearly half the weight being
    outliers); weights let long intervals, whose slopes are precise, count for more than short ones."""
    dx = x[None, :] - x[:, None]
    np.fill_diagonal(dx, np.nan)
    pair = (y[None, :] - y[:, None]) / dx
    order = np.argsort(pair, axis=1)  # NaN (the diagonal) sorts last
    sorted_pair = np.take_along_axis(pair, order, axis=1)
    cum = np.cumsum(np.where(np.isnan(sorted_pair), 0.0, w[order]), axis=1)
    half = 0.5 * cum[:, -1:]
    rows = sorted_pair[np.arange(x.size), np.argmax(cum >= half, axis=1)]
    b = _weighted_median(rows, w)
    a = _weighted_median(y - b * x, w)
    return a, b


def low_quartile_sd(x: np.ndarray) -> float:
    """Standard deviation from the 25th percentile of |x - median|: robust to up to 3/4 outliers."""
    return float(np.percentile(np.abs(x - np.median(x)), 25)) / LOW_QUARTILE_ABS_NORMAL if x.size else 0.0


class Spanned(Protocol):
    """A confirmed step as `priced_curve` reads it (`pomt.measurement.steps.Step`): its low and high counts."""

    tokens: int
    upper_tokens: int


def priced_curve(points: Sequence[CurvePoint], steps: Sequence[Spanned] = ()) -> dict[int, float]:
    """{tokens: priced latency (ms)} at every measured count of a search (`priced_levels`)."""
    return priced_levels(points, [(s.tokens, s.upper_tokens) for s in steps])


def priced_levels(points: Sequence[CurvePoint], spans: Sequence[tuple[int, int]] = ()) -> dict[int, float]:
    """Each count's level shrunk by its standard error toward a LOWESS trend over the segments between the confirmed
    steps' (low, high) `spans` (empirical Bayes, `shrunk`); without a usable standard error for every count, the
    trend itself. Counts inside a step spread over several tokens keep their own level."""
    points = sorted(points, key=lambda p: p.tokens)
    counts = [p.tokens for p in points]
    measured = np.array([p.latency_ms for p in points], dtype=float)
    if measured.size < 3:
        return dict(zip(counts, measured.tolist(), strict=True))
    tokens = np.array(counts, dtype=float)
    weights = np.array([max(1, p.visits) for p in points], dtype=float)
    half = SMOOTH_SHARE * float(np.ptp(tokens))
    inside = np.zeros(tokens.size, dtype=bool)
    for low, high in spans:
        inside |= (tokens > low) & (tokens < high)
    edges = np.array(sorted({high for _, high in spans}), dtype=float)
    segment = np.searchsorted(edges, tokens, side="right")
    smooth = measured.copy()
    for part in np.unique(segment):
        members = (segment == part) & ~inside
        smooth[members] = lowess(tokens[members], measured[members], weights[members], half)
    errors = np.array([p.se_ms for p in points], dtype=float) / measured
    if not np.all(np.isfinite(errors) & (errors > 0)):
        return dict(zip(counts, smooth.tolist(), strict=True))
    priced = smooth * (1.0 + shrunk(measured / smooth - 1.0, errors, ~inside))
    return dict(zip(counts, priced.tolist(), strict=True))


def shrunk(residual: np.ndarray, error: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Each relative residual times tau^2 / (tau^2 + its error^2), tau^2 the residuals' robust variance less the
    errors' typical variance: empirical Bayes."""
    if not used.any():
        return residual
    tau2 = max(0.0, float(np.median(residual[used] ** 2)) / CHI2_MEDIAN - float(np.median(error[used] ** 2)))
    return residual * tau2 / (tau2 + error**2)


def step_spans(steps: Sequence[object]) -> list[tuple[int, int]]:
    """The (low, high) counts of the steps a schedule file records (`Step.to_dict`); entries without both are left
    out."""
    spans = []
    for step in steps:
        if isinstance(step, Mapping) and all(isinstance(step.get(k), int) for k in ("tokens", "upper_tokens")):
            spans.append((step["tokens"], step["upper_tokens"]))
    return spans


def lowess(x: np.ndarray, y: np.ndarray, weights: np.ndarray, half: float) -> np.ndarray:
    """Robust local quadratic smoothing of y(x) at every x: window `half` each side, prior `weights`."""
    if x.size < 3:
        return y.copy()
    robust = np.ones_like(y)
    for _ in range(ROBUST_PASSES + 1):
        fitted = np.array([local_quadratic(x, y, weights * robust, at, half) for at in x])
        residual = y / fitted - 1.0
        scale = BISQUARE_SPAN * float(np.median(np.abs(residual)))
        if scale <= 0:
            break
        robust = np.clip(1.0 - (residual / scale) ** 2, 0.0, None) ** 2
    return fitted


def local_quadratic(x: np.ndarray, y: np.ndarray, weights: np.ndarray, at: float, half: float) -> float:
    """The weighted least-squares quadratic (lower degree where fewer counts reach) of y over the x within
    `half` of `at`, tricube in distance, at `at`."""
    distance = np.abs(x - at) / (half + 1.0)
    w = weights * np.clip(1.0 - distance**3, 0.0, None) ** 3
    near = w > 0
    if not near.any():
        return float(y[np.argmin(np.abs(x - at))])
    degree = min(2, int(near.sum()) - 1)
    design = np.vander(x[near] - at, degree + 1, increasing=True)
    root = np.sqrt(w[near])
    coef = np.linalg.lstsq(design * root[:, None], y[near] * root, rcond=None)[0]
    return float(coef[0])


__all__ = ["MAD_TO_SD", "SCREEN_MIN_PAIRS", "PairedEffect", "low_quartile_sd", "paired_effect", "pooled_pair_noise",
           "priced_curve", "priced_levels", "step_spans", "trend"]
