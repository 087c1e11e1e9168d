"""The smooth trend of a latency curve under its steps: a robust quadratic that steps do not bend (pure maths).

Step detection (`pomt.measurement.steps`), the search's candidates and its windows divide it out; docs/method.md,
section 5, item 1.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import median_abs_deviation

JUMP_GUESS = 3.0  # noise units of a single-interval change that count as a step for the first trend
STEP_SHARE = 0.5  # most of the curve's span the intervals set aside as steps may cover (steps are outliers)
LOW_QUARTILE_ABS_NORMAL = 0.3186  # 25th percentile of |N(0, 1)|


def trend(t: np.ndarray, y: np.ndarray, sigma: float | None = None, floor: float = 0.0) -> np.ndarray:
    """Robust quadratic trend of y over t, evaluated at t; steps do not bend it.

    First in slope space: a repeated-median line (Siegel's, weighted by interval length) through the
    intervals' per-token slopes, refitted without the intervals whose change departs from it by more
    than JUMP_GUESS noise units; steps are outliers there, so a coarse staircase does not tilt it. The
    refits stop before the intervals set aside cover more than STEP_SHARE of the span: on a sawtooth of
    aligned pairs each refit set aside more of the rising intervals, until the "steps" covered 177 of
    195 tokens and the trend fell below zero. Then least squares in level space with those intervals'
    changes taken out as offsets, which is far more precise than slopes of short intervals. Where those offsets
    carry a positive curve's trend to zero or below, the quadratic through the points instead (`_through_points`).
    `sigma` defaults to a lower-quartile spread of the changes.
    """
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
    # the smooth part by least squares in level space (far more precise than slopes of short intervals),
    # with the excluded intervals' changes taken out as level offsets
    change = np.diff(y - fitted)
    jumps = np.where(use, 0.0, change - np.median(change[use]) if use.any() else change)
    base = y - np.concatenate([[0.0], np.cumsum(jumps)])
    x = (t - t.mean()) / (np.ptp(t) or 1.0)
    smooth = np.polynomial.polynomial.polyval(x, np.polynomial.polynomial.polyfit(x, base, min(2, t.size - 2)))
    if np.all(y > 0) and np.any(smooth <= 0):  # no latency has a level at or below zero
        return _through_points(x, y)
    return smooth


def _through_points(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The quadratic through the points themselves (least squares, refitted once without the points beyond
    JUMP_GUESS robust standard deviations of it): the trend where taking steps out as offsets carried it to a level
    at or below zero. On a sawtooth of aligned pairs (deit_small at batch 1 on the AMD VM, its whole grid) the
    intervals set aside were the rises between the pairs, the pairs' drops were fitted as the smooth part, and
    the trend fell from 8.8 ms at 2 tokens to -2.6 ms at 80 where the curve rose from 8.4 to 27.8 ms."""
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


__all__ = ["low_quartile_sd", "trend"]
