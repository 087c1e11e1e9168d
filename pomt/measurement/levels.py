"""Each count's latency as a latency model should price it: its measured level, shrunk toward the smooth trend
with the confirmed steps by as much as its own noise leaves it in doubt (pure maths, empirical Bayes).

A count's measured level is its true level times a noise factor of relative standard error s (its `se_ms`);
the trend with the confirmed steps (`pomt.measurement.steps.trend` on the levels with the steps taken out,
`pomt.measurement.candidates.confirmed_factor`, then put back) describes the true levels up to structure it
does not model (wiggles no test confirmed), of relative variance tau^2 between counts. Then the best estimate
of a level, in logs, is the trend plus the share w = tau^2 / (tau^2 + s^2) of the count's residual from it:

    priced(n) = model(n) * (measured(n) / model(n)) ** w(n)

tau^2 comes from the curve itself (moments): the mean squared log-residual less the mean s^2, at least 0. A
count seen many times (s small) keeps its measured level; one seen once or twice on a noisy curve moves toward
the trend; where the curve's residuals are as large as its noise says, nothing is shrunk... only where they
are not. Confirmed steps are never smoothed away: they are part of the model.

Why: the frontier search proposes and ranks schedules on predicted latency, and a curve read at three visits a
count (4 s at batch 1) priced two runs of one command so differently that they measured different schedules
and shipped different answers (docs/known-weaknesses.md, item 19).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pomt.measurement.steps import trend


def step_factor(tokens: Sequence[int], steps: Sequence[tuple[int, int, float]]) -> np.ndarray:
    """Per count, the product of the `excess` ratios (low side over high side, beyond the trend) of the
    steps (low, high, excess) at or below it: multiplying a level by it continues the low sides' trend."""
    return np.array([math.prod(excess for _, high, excess in steps if high <= n) for n in tokens], dtype=float)


def shrinkage(residuals: np.ndarray, se: np.ndarray) -> np.ndarray:
    """Each count's weight on its own residual: tau^2 / (tau^2 + se^2), tau^2 by moments (module docstring)."""
    tau2 = max(0.0, float(np.mean(residuals**2) - np.mean(se**2)))
    if tau2 == 0.0:
        return np.zeros_like(se)
    return tau2 / (tau2 + se**2)


def priced_levels(tokens: Sequence[int], latency_ms: Sequence[float], se_ms: Sequence[float],
                  steps: Sequence[tuple[int, int, float]] = ()) -> dict[int, float]:
    """Each count's level shrunk toward the trend with the confirmed `steps` (module docstring); a count
    without a finite standard error keeps its measured level, and so does a curve of fewer than 4 counts."""
    t = np.asarray(tokens, dtype=float)
    y = np.asarray(latency_ms, dtype=float)
    se = np.asarray(se_ms, dtype=float)
    if t.size < 4 or np.any(y <= 0):
        return dict(zip(map(int, t), y.tolist(), strict=True))
    order = np.argsort(t)
    t, y, se = t[order], y[order], se[order]
    factor = step_factor(t.astype(int).tolist(), steps)
    rel = np.where(np.isfinite(se), se / y, np.nan)
    stepless = y * factor
    smooth = trend(t, stepless, float(np.nanmedian(rel * stepless)) if np.isfinite(rel).any() else None)
    if np.any(smooth <= 0):
        return dict(zip(map(int, t), y.tolist(), strict=True))
    model = smooth / factor
    residual = np.log(y / model)
    known = np.isfinite(rel)
    weight = np.ones_like(y)
    if known.sum() >= 4:
        weight[known] = shrinkage(residual[known], rel[known])
    return dict(zip(map(int, t), (model * np.exp(weight * residual)).tolist(), strict=True))
