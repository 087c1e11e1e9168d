"""The curve every choice prices schedules from (the frontier's latency model, the policies, the benchmark's
predictions): the measured curve, smoothed between its confirmed steps (pure maths).

Why. A search's curve holds many counts visited once or twice, each off its level by the machine's noise a visit
(8% on the 2-core Intel VM in a noisy stretch). The dynamic programme (`pomt.choice.schedule_dp`) lands blocks on
the counts that price lowest, so it picks the counts that noise put low: on the digits case at batch 16 the
frontier search shipped `tome:0=8,1=5,7=10`, six of its blocks at 37 tokens, a count visited once that read
27-30% under both neighbours, predicted 1.46x and verified 1.24x; in two earlier runs the verified schedules
ran up to 7-8% slower than predicted. Only a confirmed step is a promise to land below; between steps the levels
are smooth (GEMMs and attention in the count). Priced on this curve, the same runs' verified schedules were
predicted within 2-4.5% (`docs/results/intel-xeon-2core-2026-11-29-c.md`).

How. The counts are cut into segments at every confirmed step (a step's high side starts a segment; counts
inside a step spread over several tokens keep their own level). In each segment, at each count, a local
quadratic (LOWESS, Cleveland 1979): weighted least squares over the segment's counts within SMOOTH_SHARE of the
curve's range, tricube weights in distance times each count's visits; then ROBUST_PASSES reweightings by Tukey's
bisquare of the relative residuals, so that one outlying count does not bend its neighbours. On the curve bank's
dense traces (one visit a count fitted, the mean of other visits as truth) a window of a fifth of the range
cut the error of the raw single visits on 16 of 17 traces (e.g. 16.3% -> 7.3%, 2.6% -> 2.0%) and, unlike one
quadratic over the whole range, held the Intel batch-1 curves' shape (3.8% against 6.9%, raw 4.8%). It lost on
the AMD batch-1 trace whose curve steps by 2-3% at most counts (2.2% against 1.8%): steps no search confirms,
and so none a schedule should count on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pomt.measurement.drift import CurvePoint
from pomt.measurement.steps import Step

SMOOTH_SHARE = 0.2  # a local fit reaches this share of the curve's count range each side
ROBUST_PASSES = 2  # bisquare reweightings after the first fit
BISQUARE_SPAN = 6.0  # residuals beyond this many median absolute residuals get no weight


def smoothed_curve(points: Sequence[CurvePoint], steps: Sequence[Step] = ()) -> dict[int, float]:
    """{tokens: smoothed latency (ms)} at every measured count of a search (see the module docstring)."""
    return smooth_levels({p.tokens: p.latency_ms for p in points}, {p.tokens: p.visits for p in points},
                         [(s.tokens, s.upper_tokens) for s in steps])


def smooth_levels(latency: Mapping[int, float], visits: Mapping[int, int],
                  spans: Sequence[tuple[int, int]] = ()) -> dict[int, float]:
    """`latency` (ms by count) smoothed between the confirmed steps' (low, high) `spans`, each count weighted by
    its `visits` (1 where unknown); see the module docstring."""
    counts = sorted(latency)
    tokens = np.array(counts, dtype=float)
    smoothed = np.array([latency[n] for n in counts], dtype=float)
    if tokens.size < 3:
        return dict(zip(counts, smoothed.tolist(), strict=True))
    weights = np.array([max(1, visits.get(n, 1)) for n in counts], dtype=float)
    half = SMOOTH_SHARE * float(np.ptp(tokens))
    inside = np.zeros(tokens.size, dtype=bool)
    for low, high in spans:
        inside |= (tokens > low) & (tokens < high)
    edges = np.array(sorted({high for _, high in spans}), dtype=float)
    segment = np.searchsorted(edges, tokens, side="right")
    for part in np.unique(segment):
        members = (segment == part) & ~inside
        smoothed[members] = lowess(tokens[members], smoothed[members], weights[members], half)
    return dict(zip(counts, smoothed.tolist(), strict=True))


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
