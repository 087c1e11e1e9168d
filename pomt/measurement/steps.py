"""Detection of latency steps (level shifts) in a measured curve L(n) with scipy.

L(n) is modelled as a smooth robust quadratic trend, plus steps, plus noise. Narrow spikes are reported apart;
candidate steps are the peaks of the shift's significance z over the intervals, widened over a step spread across
2-3 tokens, merged, and kept when z >= k; trend and steps are refitted until they settle. A "drop": fewer tokens,
faster than the trend predicts; a "rise": fewer tokens, slower. The whole procedure: docs/method.md, section 5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.stats import median_abs_deviation

from pomt.errors import CurveError
from pomt.formats.trace import Visit
from pomt.measurement.drift import drift_profile
from pomt.measurement.robust import PairedEffect, paired_effect, trend

NOISE_FLOOR = 1e-4  # relative: no timer resolves a curve to better than 0.01 %
PASSES = 4


@dataclass(frozen=True)
class Step:
    """One significant level shift between `tokens` (low side) and `upper_tokens` (high side). `drop_ms` is the raw
    change before - after; `excess_ms` the shift over the trend (> 0: a drop); the `paired_*` fields, once confirmed
    by paired measurement, the change in % (> 0: a drop) with its interval and p-value."""

    tokens: int
    upper_tokens: int
    before_ms: float
    after_ms: float
    drop_ms: float
    drop_pct: float
    significance: float
    kind: str
    excess_ms: float = 0.0
    paired_pct: float | None = None
    paired_ci_pct: tuple[float, float] | None = None
    p_value: float | None = None
    pairs: int | None = None

    @property
    def fast_tokens(self) -> int:
        """The count on the step's faster side, where a schedule lands: the low side of a drop, the high of a rise."""
        return self.upper_tokens if self.kind == "rise" else self.tokens

    def to_dict(self) -> dict:
        data = asdict(self)
        data["paired_ci_pct"] = list(self.paired_ci_pct) if self.paired_ci_pct else None
        return data


@dataclass
class StepReport:
    """Steps found, token counts that look like one-point spikes (to re-measure), and the noise used."""

    steps: list[Step] = field(default_factory=list)
    spikes: list[int] = field(default_factory=list)
    noise_ms: float = 0.0


def detect_steps(tokens: Sequence[int], latency_ms: Sequence[float], *, k: float = 5.0,
                 noise_ms: float | Sequence[float] | None = None, window: int = 5, spread: int = 2) -> StepReport:
    """Find latency steps of significance >= k and one-point spikes; see the module docstring."""
    t, y, given = _prepare(tokens, latency_ms, noise_ms)
    if len(t) < 4:
        floor = NOISE_FLOOR * float(np.median(np.abs(y))) if y.size else 0.0
        return StepReport([], [], float(np.median(given)) if given is not None else floor)
    sigma = _noise(t, y, given)
    detrended = y - trend(t, y, float(np.median(sigma)))
    spike_idx = _find_spikes(detrended, sigma, k, window)
    keep = np.ones(len(t), dtype=bool)
    keep[spike_idx] = False
    bar = _Bar(k, window, spread)
    steps = _find_steps(t[keep], y[keep], sigma[keep], bar) if keep.sum() >= 4 else []
    return StepReport(steps, [int(t[j]) for j in spike_idx], float(np.median(sigma)))


def _prepare(tokens, latency_ms, noise_ms):
    """Sorted float arrays with duplicate token counts averaged (their noise too); validated."""
    t = np.asarray(tokens, dtype=float)
    y = np.asarray(latency_ms, dtype=float)
    if t.shape != y.shape or t.ndim != 1:
        raise CurveError(f"token counts ({t.size}) and latencies ({y.size}) must be 1-D of equal length")
    noise = None if noise_ms is None else np.broadcast_to(np.asarray(noise_ms, dtype=float), y.shape)
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(y))):
        raise CurveError("latency curve holds non-finite values")
    uniq, inverse = np.unique(t, return_inverse=True)
    counts = np.bincount(inverse)

    def mean(a: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=a) / counts

    return uniq, mean(y), None if noise is None else mean(np.nan_to_num(noise))


def _noise(t: np.ndarray, y: np.ndarray, given: np.ndarray | None) -> np.ndarray:
    """Per-point standard error: the caller's, else one robust figure from the curve; never below the floor."""
    floor = NOISE_FLOOR * np.abs(y)
    if given is None:
        r = np.diff(y) - np.diff(trend(t, y, floor=float(np.median(floor))))
        given = np.full_like(y, float(median_abs_deviation(r, scale="normal")) / math.sqrt(2.0))
    return np.maximum(given, np.maximum(floor, 1e-12))


def _median_var(m: int) -> float:
    """Variance of the median of m unit-normal samples (exact for 1-2, asymptotic above: conservative)."""
    return {1: 1.0, 2: 0.5}.get(m, math.pi / (2.0 * m))


def _find_spikes(e: np.ndarray, sigma: np.ndarray, k: float, window: int) -> list[int]:
    spikes = []
    for j in range(1, len(e) - 1):
        left, right = e[max(0, j - window) : j], e[j + 1 : j + 1 + window]
        dl, dr = e[j] - np.median(left), e[j] - np.median(right)
        limit = k * sigma[j] * math.sqrt(1.0 + max(_median_var(left.size), _median_var(right.size)))
        if np.sign(dl) == np.sign(dr) and min(abs(dl), abs(dr)) >= limit:
            spikes.append(j)
    return spikes


Known = list[tuple[int, int, int, float, float]]  # (sign, first interval, last interval, shift, z)


@dataclass(frozen=True)
class _Bar:
    """What a step must pass: significance `k`, levels over `window` points each side, `spread` intervals wide."""

    k: float
    window: int
    spread: int


def _find_steps(t: np.ndarray, y: np.ndarray, sigma: np.ndarray, bar: _Bar) -> list[Step]:
    """Candidates, re-scored with the other steps taken out of the curve, until the set settles."""
    found: Known = []
    for _ in range(PASSES):
        again = _candidates(t, y, sigma, bar, found)
        settled = [c[:3] for c in again] == [c[:3] for c in found]
        found = again
        if settled:
            break
    steps = []
    for sign, a, b, shift, sig in found:
        before, after = float(y[b + 1]), float(y[a])
        steps.append(Step(tokens=int(t[a]), upper_tokens=int(t[b + 1]), before_ms=before, after_ms=after,
                          drop_ms=before - after, drop_pct=100.0 * (before - after) / before if before else 0.0,
                          significance=float(sig), kind="drop" if sign > 0 else "rise", excess_ms=shift))
    return sorted(steps, key=lambda s: s.tokens)


def _levels(t: np.ndarray, y: np.ndarray, known: Known, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Detrended levels with every known step taken out, and each known step's level function."""
    staircase = np.zeros((len(known), len(t)))
    for row, (_, _, b, shift, _) in enumerate(known):
        staircase[row, b + 1 :] = shift
    base = y - staircase.sum(axis=0)
    return base - trend(t, base, float(np.median(sigma))), staircase


def _shift(e: np.ndarray, lo: int, hi: int, sigma: np.ndarray, window: int, skip: np.ndarray) -> tuple[float, float]:
    """Level shift across points lo..hi+1 (upper level minus lower) and its z-score; `skip` marks points inside
    other spread steps, which belong to neither level."""
    below = [j for j in range(lo, -1, -1) if not skip[j]][:window]
    above = [j for j in range(hi + 1, len(e)) if not skip[j]][:window]
    if not below or not above:
        return 0.0, 0.0
    h = float(e[above].mean() - e[below].mean())
    se = math.hypot(math.sqrt(float(np.sum(sigma[below] ** 2))) / len(below),
                    math.sqrt(float(np.sum(sigma[above] ** 2))) / len(above))
    return h, abs(h) / se if se > 0 else math.inf


def _candidates(t: np.ndarray, y: np.ndarray, sigma: np.ndarray, bar: _Bar, known: Known) -> Known:
    """(sign, first interval, last interval, shift, significance) of each step that passes `bar.k`."""
    k, window, spread = bar.k, bar.window, bar.spread
    m = len(t) - 1
    e_all, staircase = _levels(t, y, known, sigma)
    inside = np.zeros(len(t), dtype=bool)
    for _, a, b, _, _ in known:
        inside[a + 1 : b + 1] = True

    def view(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Levels with the known steps that touch intervals lo..hi put back, and points to skip."""
        e = e_all.copy()
        skip = inside.copy()
        for row, (_, a, b, _, _) in enumerate(known):
            if not (b < lo - 1 or a > hi + 1):
                e += staircase[row]
                skip[a + 1 : b + 1] = False
        return e, skip

    h, z, r = np.empty(m), np.empty(m), np.empty(m)
    for i in range(m):
        e, skip = view(i, i)
        h[i], z[i] = _shift(e, i, i, sigma, window, skip)
        r[i] = e[i + 1] - e[i]
    from scipy.signal import find_peaks  # here: its import takes most of a second, which every command would pay

    spans: list[tuple[int, int, int]] = []
    for sign in (1, -1):
        profile = np.concatenate([[0.0], np.where(sign * h > 0, z, 0.0), [0.0]])
        peaks, _ = find_peaks(profile, height=k)
        for p in peaks - 1:
            lo, hi = max(0, p - window // 2), min(m, p + window // 2 + 1)
            j = lo + int(np.argmax(sign * r[lo:hi]))
            if sign * r[j] <= 0:
                continue
            tau = max(0.25 * sign * r[j], 3.0 * float(np.median(sigma[lo:hi + 1])))
            a = b = j
            while a > 0 and j - a < spread and sign * r[a - 1] >= tau:
                a -= 1
            while b < m - 1 and b - j < spread and sign * r[b + 1] >= tau:
                b += 1
            spans.append((sign, a, b))
    out: Known = []
    for sign, a, b in _merge(spans):
        e, skip = view(a, b)
        skip[a + 1 : b + 1] = True
        shift, sig = _shift(e, a, b, sigma, window, skip)
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


def paired_step(low: int, high: int, before_ms: float, after_ms: float, effect: PairedEffect,
                significance: float) -> Step:
    """The `Step` between `low` and `high` tokens that a paired measurement confirmed, its levels from the pooled
    curve."""
    saving, interval = effect.saving_pct
    return Step(tokens=low, upper_tokens=high, before_ms=before_ms, after_ms=after_ms, drop_ms=before_ms - after_ms,
                drop_pct=100.0 * (before_ms - after_ms) / before_ms if before_ms else 0.0, significance=significance,
                kind="drop" if saving > 0 else "rise", excess_ms=before_ms * saving / 100.0, paired_pct=saving,
                paired_ci_pct=interval, p_value=effect.p_value, pairs=effect.pairs)


def steps_in_trace(visits: Sequence[Visit], *, min_step: float = 0.05, alpha: float = 1e-3,
                   widths: Sequence[int] = (1, 2)) -> list[Step]:
    """Steps a dense trace confirms by paired measurement of counts `width` apart in the same passes (t-test at a
    small `alpha`: every interval is tested), at least `min_step`: the ground truth the search is scored against."""
    levels, drift_log = drift_profile(visits)
    tokens = np.array(sorted(levels), dtype=float)
    curve = np.exp([levels[int(n)] for n in tokens])
    expected = dict(zip(tokens.astype(int).tolist(), trend(tokens, curve).tolist(), strict=True))
    corrected: dict[tuple[int, int], float] = {}
    for visit, g in zip(visits, drift_log, strict=True):
        corrected.setdefault((visit.tokens, visit.pass_index), visit.median_ms / math.exp(g))
    found: list[Step] = []
    ordered = tokens.astype(int).tolist()
    for width in widths:
        for low, high in zip(ordered, ordered[width:], strict=False):
            passes = sorted({p for (n, p) in corrected if n == low} & {p for (n, p) in corrected if n == high})
            if len(passes) < 3:
                continue
            effect = paired_effect([corrected[(high, p)] for p in passes], [corrected[(low, p)] for p in passes],
                                   offset=math.log(expected[low] / expected[high]))
            if effect.p_value < alpha and abs(effect.excess - 1.0) >= min_step:
                found.append(paired_step(low, high, math.exp(levels[high]), math.exp(levels[low]), effect, math.inf))
    kept: list[Step] = []
    for step in sorted(found, key=lambda s: -abs(s.paired_pct)):
        if all(step.upper_tokens <= other.tokens or step.tokens >= other.upper_tokens for other in kept):
            kept.append(step)
    return sorted(kept, key=lambda s: s.tokens)
