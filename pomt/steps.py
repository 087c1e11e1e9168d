"""Detection of latency steps (level shifts) in a measured curve L(n) with scipy.

Method, on the points sorted by token count (duplicates averaged):

1. Local trend. Each interval between neighbouring points gets a local slope: the gap-weighted median of
   the per-token slopes of the intervals within `2 * window` intervals, itself excluded, so a step never
   sets its own trend. Integrating these slopes gives a trend; `e = L - trend` is the detrended level.
2. Noise. The per-point noise is the larger of (a) the normal-scaled `scipy.stats.median_abs_deviation`
   of the residual differences (difference minus slope x gap) divided by sqrt(2), (b) the standard error
   of a median derived from the measured IQR (IQR / 1.349 x 1.2533 / sqrt(samples), median over points),
   (c) 0.01 % of the median latency. `noise_ms`, when given, replaces (a).
3. Spikes. An interior point whose level lies more than k noise units away from the median levels of
   the `window` points on each side, on the same side of both, is a spike: reported for re-measurement
   and left out of the step search.
4. Steps. For every interval the level shift h = median(e of `window` points above) - median(e of
   `window` points below) and its significance z = |h| / standard error. `scipy.signal.find_peaks` with
   `height=k` on z (drops and rises separately) finds candidate regions; each is located at the interval
   with the largest residual difference nearby and widened by up to `spread` neighbouring intervals
   that carry a clear part of it (a step spread over 2-3 tokens is reported once, its low side being
   the lowest of them). Candidates that touch are merged and re-scored; those with z >= k remain.

A "drop" is the usual step: fewer tokens, faster than the trend predicts. A "rise" is a non-monotone
region's edge: fewer tokens, slower. Two steps closer than about `window` points count as one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.signal import find_peaks
from scipy.stats import median_abs_deviation

from pomt.errors import CurveError

IQR_TO_SD = 1.349  # IQR of a normal distribution in standard deviations
MEDIAN_SE = 1.2533  # standard error of a median relative to that of a mean, for normal samples
NOISE_FLOOR = 1e-4  # relative: no timer resolves a curve to better than 0.01 %
SLOPE_WIDTH = 15  # points on each side of an interval that set its local slope
SLOPE_SE = 1.1  # Theil-Sen slope error relative to least squares


@dataclass(frozen=True)
class Step:
    """One significant level shift between `tokens` (low side) and `upper_tokens` (high side)."""

    tokens: int
    upper_tokens: int
    before_ms: float
    after_ms: float
    drop_ms: float
    drop_pct: float
    significance: float
    kind: str
    excess_ms: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StepReport:
    """Steps found, token counts that look like one-point spikes (to re-measure), and the noise used."""

    steps: list[Step] = field(default_factory=list)
    spikes: list[int] = field(default_factory=list)
    noise_ms: float = 0.0


def detect_steps(
    tokens: Sequence[int],
    latency_ms: Sequence[float],
    *,
    k: float = 5.0,
    noise_ms: float | None = None,
    iqr_ms: Sequence[float] | None = None,
    samples: Sequence[int] | None = None,
    window: int = 5,
    spread: int = 2,
) -> StepReport:
    """Find latency steps of significance >= k and one-point spikes; see the module docstring."""
    t, y, iqr, nsamp = _prepare(tokens, latency_ms, iqr_ms, samples)
    floor = _noise_floor(y, iqr, nsamp)
    if len(t) < 4:
        return StepReport([], [], max(noise_ms or 0.0, floor))
    sigma = estimate_noise(t, y, floor=floor, noise_ms=noise_ms)
    spike_idx = _find_spikes(t, y, local_slopes(t, y), sigma, k, window)
    keep = np.ones(len(t), dtype=bool)
    keep[spike_idx] = False
    steps = _find_steps(t[keep], y[keep], sigma, k, window, spread) if keep.sum() >= 4 else []
    return StepReport(steps, [int(t[j]) for j in spike_idx], sigma)


def _prepare(tokens, latency_ms, iqr_ms, samples):
    """Sorted arrays with duplicate token counts averaged; validated."""
    t = np.asarray(tokens, dtype=float)
    y = np.asarray(latency_ms, dtype=float)
    if t.shape != y.shape or t.ndim != 1:
        raise CurveError(f"token counts ({t.size}) and latencies ({y.size}) must be 1-D of equal length")
    iqr = np.zeros_like(y) if iqr_ms is None else np.asarray(iqr_ms, dtype=float)
    nsamp = np.ones_like(y) if samples is None else np.asarray(samples, dtype=float)
    if iqr.shape != y.shape or nsamp.shape != y.shape:
        raise CurveError("iqr_ms and samples must have one entry per latency point")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(y))):
        raise CurveError("latency curve holds non-finite values")
    uniq, inverse = np.unique(t, return_inverse=True)
    counts = np.bincount(inverse)

    def mean(a: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=a) / counts

    return uniq.astype(int), mean(y), mean(np.nan_to_num(iqr)), np.maximum(mean(nsamp), 1.0)


def _noise_floor(y: np.ndarray, iqr: np.ndarray, samples: np.ndarray) -> float:
    """Noise a step must beat regardless of the curve: the measured spread, and a resolution floor."""
    if y.size == 0:
        return 0.0
    se = iqr / IQR_TO_SD * MEDIAN_SE / np.sqrt(samples)
    return float(max(np.median(se), NOISE_FLOOR * np.median(np.abs(y))))


def _side_indices(n: int, lo: int, hi: int, width: int) -> tuple[range, range]:
    """Up to `width` point indices at or below point lo, and from point hi + 1 upward."""
    return range(max(0, lo - width + 1), lo + 1), range(hi + 1, min(n, hi + 1 + width))


@functools.lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n, 1)


def _slope_around(t: np.ndarray, y: np.ndarray, lo: int, hi: int, width: int) -> tuple[float, float]:
    """Robust slope next to the points lo..hi+1 (median of pairwise slopes on each side, pairs that
    straddle the gap left out) and the sum of squared token spreads that sets its precision."""
    slopes, sxx = [], 0.0
    for side in _side_indices(len(t), lo, hi, width):
        if len(side) >= 2:
            ts, ys = t[side.start : side.stop], y[side.start : side.stop]
            a, b = _pairs(len(side))
            slopes.append((ys[b] - ys[a]) / (ts[b] - ts[a]))
            sxx += float(np.sum((ts - ts.mean()) ** 2))
    if not slopes:
        return float((y[-1] - y[0]) / (t[-1] - t[0])), 0.0
    return float(np.median(np.concatenate(slopes))), sxx


def local_slopes(t: np.ndarray, y: np.ndarray, width: int = SLOPE_WIDTH) -> np.ndarray:
    """Per-interval trend slope (ms/token) from `width` points on each side; a step never sets its own."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    return np.array([_slope_around(t, y, i, i, width)[0] for i in range(len(t) - 1)])


def residual_differences(t: np.ndarray, y: np.ndarray, slopes: np.ndarray | None = None) -> np.ndarray:
    """Difference of neighbouring latencies minus what the local slope predicts over the gap."""
    s = local_slopes(t, y) if slopes is None else slopes
    return np.diff(np.asarray(y, dtype=float)) - s * np.diff(np.asarray(t, dtype=float))


def estimate_noise(
    t: np.ndarray, y: np.ndarray, *, floor: float = 0.0, noise_ms: float | None = None
) -> float:
    """Per-point noise (ms): robust spread of the residual differences, never below `floor`."""
    if noise_ms is not None:
        return max(float(noise_ms), floor)
    if len(t) < 3:
        return floor
    r = residual_differences(t, y)
    return max(float(median_abs_deviation(r, scale="normal")) / math.sqrt(2.0), floor)


def _median_var(m: int) -> float:
    """Variance of the median of m unit-normal samples (exact for 1-2, asymptotic above: conservative)."""
    return {1: 1.0, 2: 0.5}.get(m, math.pi / (2.0 * m))


def _find_spikes(
    t: np.ndarray, y: np.ndarray, s: np.ndarray, sigma: float, k: float, window: int
) -> list[int]:
    spikes = []
    for j in range(1, len(t) - 1):
        e = y - 0.5 * (s[j - 1] + s[j]) * t
        left, right = e[max(0, j - window) : j], e[j + 1 : j + 1 + window]
        dl, dr = e[j] - np.median(left), e[j] - np.median(right)
        limit = k * sigma * math.sqrt(1.0 + max(_median_var(left.size), _median_var(right.size)))
        if np.sign(dl) == np.sign(dr) and min(abs(dl), abs(dr)) >= limit:
            spikes.append(j)
    return spikes


def _shift(t: np.ndarray, y: np.ndarray, lo: int, hi: int, sigma: float, window: int) -> tuple[float, float]:
    """Level shift over the trend across points lo..hi+1 (upper level minus lower) and its z-score."""
    slope, sxx = _slope_around(t, y, lo, hi, SLOPE_WIDTH)
    below, above = _side_indices(len(t), lo, hi, window)
    e = y - slope * t
    h = float(e[above.start : above.stop].mean() - e[below.start : below.stop].mean())
    gap = float(t[above.start : above.stop].mean() - t[below.start : below.stop].mean())
    slope_var = SLOPE_SE**2 / sxx if sxx > 0 else 0.0
    se = sigma * math.sqrt(1.0 / len(below) + 1.0 / len(above) + slope_var * gap**2)
    return h, abs(h) / se if se > 0 else math.inf


def _find_steps(
    t: np.ndarray, y: np.ndarray, sigma: float, k: float, window: int, spread: int
) -> list[Step]:
    """Candidate steps, then re-scored with the other steps taken out of the curve (so a neighbouring
    step biases neither the local slope nor the levels), until the set settles."""
    found = _candidates(t, y, sigma, k, window, spread, [])
    for _ in range(3):
        again = _candidates(t, y, sigma, k, window, spread, found)
        if [c[:3] for c in again] == [c[:3] for c in found]:
            break
        found = again
    steps = []
    for sign, a, b, shift, sig in found:
        before, after = float(y[b + 1]), float(y[a])
        steps.append(
            Step(
                tokens=int(t[a]),
                upper_tokens=int(t[b + 1]),
                before_ms=before,
                after_ms=after,
                drop_ms=before - after,
                drop_pct=100.0 * (before - after) / before if before else 0.0,
                significance=float(sig),
                kind="drop" if sign > 0 else "rise",
                excess_ms=shift,
            )
        )
    return sorted(steps, key=lambda s: s.tokens)


def _without(t: np.ndarray, y: np.ndarray, known: list, lo: int, hi: int):
    """The curve with the known steps that do not touch intervals lo..hi taken out (the points inside
    a spread step dropped), and lo, hi re-indexed onto it."""
    out = y.copy()
    keep = np.ones(len(t), dtype=bool)
    for _, a, b, shift, _ in known:
        if b < lo - 1 or a > hi + 1:
            out[b + 1 :] -= shift
            keep[a + 1 : b + 1] = False
    drop_before = int(np.count_nonzero(~keep[:lo]))
    return t[keep], out[keep], lo - drop_before, hi - drop_before


def _candidates(
    t: np.ndarray, y: np.ndarray, sigma: float, k: float, window: int, spread: int, known: list
) -> list[tuple[int, int, int, float, float]]:
    """(sign, first interval, last interval, shift, significance) of each step that passes k."""
    m = len(t) - 1
    h = np.empty(m)
    z = np.empty(m)
    r = np.empty(m)
    for i in range(m):
        ti, yi, j, _ = _without(t, y, known, i, i)
        h[i], z[i] = _shift(ti, yi, j, j, sigma, window)
        r[i] = yi[j + 1] - yi[j] - _slope_around(ti, yi, j, j, SLOPE_WIDTH)[0] * (ti[j + 1] - ti[j])
    spans: list[tuple[int, int, int]] = []
    for sign in (1, -1):
        profile = np.concatenate([[0.0], np.where(sign * h > 0, z, 0.0), [0.0]])
        peaks, _ = find_peaks(profile, height=k)
        for p in peaks - 1:
            lo, hi = max(0, p - window + 1), min(m, p + window)
            j = lo + int(np.argmax(sign * r[lo:hi]))
            if sign * r[j] <= 0:
                continue
            tau = max(0.25 * sign * r[j], 3.0 * sigma)
            a = b = j
            while a > 0 and j - a < spread and sign * r[a - 1] >= tau:
                a -= 1
            while b < m - 1 and b - j < spread and sign * r[b + 1] >= tau:
                b += 1
            spans.append((sign, a, b))
    out = []
    for sign, a, b in _merge(spans):
        shift, sig = _shift(*_without(t, y, known, a, b), sigma, window)
        if sign * shift > 0 and sig >= k:
            out.append((sign, a, b, shift, sig))
    return out


def _merge(candidates: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Union same-direction interval ranges that overlap or touch."""
    merged: list[tuple[int, int, int]] = []
    for sign, a, b in sorted(candidates, key=lambda c: (c[0], c[1])):
        if merged and merged[-1][0] == sign and a <= merged[-1][2] + 1:
            merged[-1] = (sign, merged[-1][1], max(b, merged[-1][2]))
        else:
            merged.append((sign, a, b))
    return merged
