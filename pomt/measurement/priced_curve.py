"""The curve every choice prices schedules from (the frontier's latency model, the policies, the benchmark's
predictions): each measured count's level shrunk toward the curve's trend between its confirmed steps by its own
standard error (pure maths).

Why. A search's curve holds many counts visited once or twice, each off its level by the machine's noise a visit
(8% on the 2-core Intel VM in a noisy stretch). The dynamic programme (`pomt.frontier.surrogate`) lands blocks on
the counts that price lowest, so it picks the counts that noise put low: on the digits case at batch 16 the
frontier search shipped `tome:0=8,1=5,7=10`, six of its blocks at 37 tokens, a count visited once that read
27-30% under both neighbours, predicted 1.46x and verified 1.24x; in two earlier runs the verified schedules
ran up to 7-8% slower than predicted. But not every dip is noise: on the 2-core AMD VM every run's curve showed
16, 24, 32, 40 and 48 tokens below the count above them, and a curve smoothed between confirmed steps alone
(tried in the eighth session) took those away and shipped slower schedules at batch 1. So how far a count's
level is believed depends on how noisy it is against how far the counts' levels really spread.

How. The trend: the counts are cut into segments at every confirmed step (a step's high side starts a segment;
counts inside a step spread over several tokens keep their own level), and each segment is smoothed by a local
quadratic (LOWESS, Cleveland 1979: weighted least squares over the segment's counts within SMOOTH_SHARE of the
curve's range each side, tricube weights in distance times each count's visits, then ROBUST_PASSES reweightings
by Tukey's bisquare of the relative residuals). Then empirical Bayes (`shrunk`): a count's relative residual
from the trend is kept in the share tau^2 / (tau^2 + se^2), se its standard error (the run's noise over the
root of its visits) and tau^2 the spread of the true levels about the trend, estimated from all residuals. A
noisy machine (tau small against se) prices near the trend; a quiet one whose curve has real structure keeps
it; a count visited many times (the reference) keeps its measured level. The trend is local, not the one robust
quadratic over the whole range that step detection divides out (`pomt.measurement.trend.trend`): as a curve to
price from, that misfits the Intel batch-1 curves (below).

Fitted to one visit a count of each of the curve bank's 17 dense traces and scored against the mean of the other
visits, it beat the raw visits on all 17 (16.3% -> 7.3% on a noisy one; 1.78% -> 1.47% on the AMD batch-1 trace
whose curve steps by 2-3% at most counts, where the trend alone read 2.17%), and matched or beat the trend alone
on 14 (worse on 3, by at most 0.34 points), where one quadratic over the range read 6.92% on an Intel batch-1
trace against the raw visits' 4.83% (the trend 3.78%): `docs/results/intel-xeon-2core-2026-11-29-c.md`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pomt.formats.curve import CurvePoint
from pomt.measurement.steps import Step

SMOOTH_SHARE = 0.2  # a local fit reaches this share of the curve's count range each side
ROBUST_PASSES = 2  # bisquare reweightings after the first fit
BISQUARE_SPAN = 6.0  # residuals beyond this many median absolute residuals get no weight
CHI2_MEDIAN = 0.4549  # the median of a chi-square variable with one degree of freedom


def priced_curve(points: Sequence[CurvePoint], steps: Sequence[Step] = ()) -> dict[int, float]:
    """{tokens: priced latency (ms)} at every measured count of a search (see the module docstring)."""
    return priced_levels(points, [(s.tokens, s.upper_tokens) for s in steps])


def priced_levels(points: Sequence[CurvePoint], spans: Sequence[tuple[int, int]] = ()) -> dict[int, float]:
    """Each count's level (`latency_ms`) shrunk toward the trend between the confirmed steps' (low, high) `spans`
    by its standard error (`se_ms`), the trend weighting each count by its visits (module docstring). Without a
    usable standard error for every count, the trend itself."""
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
    trend = measured.copy()
    for part in np.unique(segment):
        members = (segment == part) & ~inside
        trend[members] = lowess(tokens[members], measured[members], weights[members], half)
    errors = np.array([p.se_ms for p in points], dtype=float) / measured
    if not np.all(np.isfinite(errors) & (errors > 0)):
        return dict(zip(counts, trend.tolist(), strict=True))
    priced = trend * (1.0 + shrunk(measured / trend - 1.0, errors, ~inside))
    return dict(zip(counts, priced.tolist(), strict=True))


def shrunk(residual: np.ndarray, error: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Each relative residual from the trend times tau^2 / (tau^2 + its error^2): empirical Bayes, tau^2 the
    spread of the counts' true levels about the trend, the residuals' robust variance (the median of their
    squares over that of a chi-square with one degree of freedom) less the errors' typical variance."""
    if not used.any():
        return residual
    tau2 = max(0.0, float(np.median(residual[used] ** 2)) / CHI2_MEDIAN - float(np.median(error[used] ** 2)))
    return residual * tau2 / (tau2 + error**2)


def step_spans(steps: Sequence[object]) -> list[tuple[int, int]]:
    """The (low, high) counts of the steps a schedule file records (`Step.to_dict`); entries without both
    counts are not steps to keep, and are left out."""
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
