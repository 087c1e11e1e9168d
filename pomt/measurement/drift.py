"""Latency on a drifting machine: the drift over time, and each count's level with it divided out.

Drift is a smooth function of time shared by every count: log(visit) = level(count) + drift(time) + noise;
shuffled passes separate the two (`drift_profile`). A count's latency pools its visits corrected for that drift
(`pool_visits`); noise is the spread between visits of the same count after the correction (`relative_noise`).
Pure functions: no timing, no I/O.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pomt.formats.curve import CurvePoint
from pomt.formats.trace import Visit
from pomt.measurement.robust import MAD_TO_SD, pooled_pair_noise

MEDIAN_SE = 1.2533  # standard error of a median relative to that of a mean, for normal samples
DRIFT_WINDOW = 8  # visits on each side that estimate the drift at a visit
UPPER_QUARTILE_ABS_NORMAL = 1.1503  # 75th percentile of |N(0, 1)|
STEADY_SPREADS = 4.0  # counts are unlike when some scatter this many times more than the steadiest quarter
PAIRED_AUTHORITY = 10.0  # how much more a paired ratio counts than its inverse SE in a saved curve
ONE_PASS_PCT = 10.0  # a drift this large (%) is checked for one pass that makes most of it
ONE_PASS_SHARE = 0.5  # one pass makes most of a drift when, left out, the drift shrinks to this share or less


@dataclass(frozen=True)
class Drift:
    """How much the reference count's latency moved during a run."""

    reference_tokens: int
    max_over_min: float
    reference_ms: tuple[float, ...]  # one visit median per pass, in time order

    @property
    def pct(self) -> float:
        return 100.0 * (self.max_over_min - 1.0)

    @property
    def one_pass(self) -> tuple[float, str] | None:
        """(max/min with one pass left out, "slowest" or "fastest") where that pass makes most of a drift of
        ONE_PASS_PCT or more, else None."""
        if len(self.reference_ms) < 3 or self.pct < ONE_PASS_PCT:
            return None
        ordered = sorted(self.reference_ms)
        left_out = min((ordered[-2] / ordered[0], "slowest"), (ordered[-1] / ordered[1], "fastest"))
        return left_out if left_out[0] - 1.0 <= ONE_PASS_SHARE * (self.max_over_min - 1.0) else None

    def one_pass_words(self) -> str:
        """", 1.10 without its slowest pass" where one pass makes most of the drift (`one_pass`), else ""."""
        found = self.one_pass
        return "" if found is None else f", {found[0]:.2f} without its {found[1]} pass"

    def to_dict(self) -> dict:
        found = self.one_pass
        return {"reference_tokens": self.reference_tokens, "max_over_min": round(self.max_over_min, 4),
                "drift_pct": round(self.pct, 2), "reference_ms": [round(v, 3) for v in self.reference_ms],
                **({} if found is None else {"max_over_min_but_one": round(found[0], 4), "left_out": found[1]})}


def pass_references(visits: Iterable[Visit], reference: int) -> dict[int, float]:
    """Median of the reference count's visits in each pass."""
    by_pass: dict[int, list[float]] = defaultdict(list)
    for visit in visits:
        if visit.tokens == reference:
            by_pass[visit.pass_index].append(visit.median_ms)
    return {p: float(np.median(v)) for p, v in by_pass.items()}


def drift(visits: Sequence[Visit], reference: int) -> Drift | None:
    """Max/min of the reference's per-pass latency; None with fewer than two passes holding it."""
    references = pass_references(visits, reference)
    first_time = {}
    for visit in visits:
        if visit.tokens == reference:
            first_time.setdefault(visit.pass_index, visit.t_s)
    ordered = [references[p] for p in sorted(references, key=lambda p: first_time[p])]
    if len(ordered) < 2:
        return None
    return Drift(reference, max(ordered) / min(ordered), tuple(ordered))


def drift_profile(visits: Sequence[Visit], window: int = DRIFT_WINDOW,
                  iterations: int = 8) -> tuple[dict[int, float], np.ndarray]:
    """(log level per count, log drift per visit in the given order). The drift's median over the run is 0, so
    levels are latencies at the run's typical speed. Valid for shuffled visit orders only: in one ascending sweep,
    time and token count are the same axis."""
    fit = _fit_drift(visits, window, iterations)
    return fit.level, fit.drift_at


@dataclass(frozen=True)
class _DriftFit:
    """What `_fit_drift` estimates, with what `_drift_uncertainty` judges it by."""

    level: dict[int, float]
    drift_at: np.ndarray  # log drift per visit, in the visits' given order
    miss: np.ndarray  # corrected log value less its count's level, in time order (NaN: count visited once)
    order: np.ndarray  # the visits' indices in time order


def _fit_drift(visits: Sequence[Visit], window: int, iterations: int = 8) -> _DriftFit:
    if not visits:
        return _DriftFit({}, np.zeros(0), np.zeros(0), np.zeros(0, dtype=int))
    order = np.argsort([v.t_s for v in visits], kind="stable")
    y = np.log([visits[i].median_ms for i in order])
    tokens = np.array([visits[i].tokens for i in order])
    members = {n: tokens == n for n in np.unique(tokens)}
    informative = np.array([members[n].sum() >= 2 for n in tokens])
    g = np.zeros(y.size)
    for _ in range(iterations):
        level = {n: float(np.median(y[m] - g[m])) for n, m in members.items()}
        residual = np.where(informative, y - np.array([level[n] for n in tokens]), np.nan)
        new = _neighbour_median(residual, window, _steadiness(residual, members))
        new -= np.median(new)
        if np.allclose(new, g, atol=1e-6):
            g = new
            break
        g = new
    level = {int(n): float(np.median(y[m] - g[m])) for n, m in members.items()}
    drift_at = np.empty(y.size)
    drift_at[order] = g
    miss = np.where(informative, y - g - np.array([level[int(n)] for n in tokens]), np.nan)
    return _DriftFit(level, drift_at, miss, order)


def _drift_uncertainty(fit: _DriftFit, noise: float, window: int = DRIFT_WINDOW) -> np.ndarray:
    """How far the drift estimate may be off at each visit (log SD, in the visits' given order), beyond the
    unbiased per-visit `noise`: the neighbours' upper-quartile miss in excess of the noise. About 0 on a steady or
    smoothly drifting machine and for one disturbed visit; large where the machine's speed jumped nearby."""
    if fit.miss.size == 0:
        return np.zeros(0)
    miss = np.abs(fit.miss)
    pad = np.full(window, np.nan)
    around = np.lib.stride_tricks.sliding_window_view(np.concatenate([pad, miss, pad]), 2 * window + 1).copy()
    around[:, window] = np.nan
    enough = np.isfinite(around).sum(axis=1) >= 2  # else nothing to judge by: no doubt added
    upper = np.nanpercentile(np.where(enough[:, None], around, 0.0), 75, axis=1) / UPPER_QUARTILE_ABS_NORMAL
    excess = np.maximum(upper ** 2 - noise ** 2, 0.0)
    out = np.empty(excess.size)
    out[fit.order] = np.sqrt(excess)
    return out


def _steadiness(residual: np.ndarray, members: dict) -> np.ndarray:
    """Weight of each visit's residual in the drift estimate: 1 where the counts' robust spreads s_n are alike;
    else a count scattering more than c = STEADY_SPREADS times the lower quartile weighs (c / s_n)^2, so a GPU's
    launch-bound counts flipping between host states do not leak into the drift of the steady counts."""
    weight = np.ones(residual.size)
    spread = {n: MAD_TO_SD * float(np.nanmedian(np.abs(residual[m] - np.nanmedian(residual[m]))))
              for n, m in members.items() if np.isfinite(residual[m]).sum() >= 2}
    if not spread:
        return weight
    lower, upper = np.percentile(list(spread.values()), [25, 75])
    cut = STEADY_SPREADS * float(lower)
    if upper <= cut or cut <= 0:  # alike, or a quarter of the counts without any spread to scale by
        return weight
    for n, m in members.items():
        if spread.get(n, 0.0) > cut:
            weight[m] = (cut / spread[n]) ** 2
    return weight


def _neighbour_median(values: np.ndarray, window: int, weights: np.ndarray | None = None) -> np.ndarray:
    """For each position, the (weighted) median of the non-NaN values within `window` on each side,
    itself left out (0 where there are none). With equal weights it is the plain median."""
    if weights is None:
        weights = np.ones(values.size)
    pad = np.full(window, np.nan)
    around = np.lib.stride_tricks.sliding_window_view(np.concatenate([pad, values, pad]), 2 * window + 1).copy()
    mass = np.lib.stride_tricks.sliding_window_view(
        np.concatenate([np.zeros(window), weights, np.zeros(window)]), 2 * window + 1).copy()
    around[:, window] = np.nan
    mass[np.isnan(around)] = 0.0
    order = np.argsort(np.where(np.isnan(around), np.inf, around), axis=1, kind="stable")
    ranked = np.take_along_axis(around, order, axis=1)
    cumulative = np.cumsum(np.take_along_axis(mass, order, axis=1), axis=1)
    half = 0.5 * cumulative[:, -1:]
    below = np.argmax(cumulative >= half * (1 - 1e-12), axis=1)  # first value holding half the weight
    rows = np.arange(values.size)
    lower = ranked[rows, below]
    # exactly half the weight at or below it (an even count of equal weights): the midpoint, as np.median
    tie = np.isclose(cumulative[rows, below], half[:, 0], rtol=1e-9, atol=0) & (below + 1 < ranked.shape[1])
    upper = ranked[rows, np.minimum(below + 1, ranked.shape[1] - 1)]
    medians = np.where(tie & np.isfinite(upper), 0.5 * (lower + upper), lower)
    return np.where(cumulative[:, -1] > 0, np.nan_to_num(medians, nan=0.0), 0.0)


def corrected_values(visits: Sequence[Visit], window: int = DRIFT_WINDOW) -> dict[int, list[float]]:
    """Each visit's median with the drift at its time divided out, per count."""
    return _corrected(visits, _fit_drift(visits, window).drift_at)


def _corrected(visits: Sequence[Visit], drift_log: np.ndarray) -> dict[int, list[float]]:
    out: dict[int, list[float]] = defaultdict(list)
    for visit, g in zip(visits, drift_log, strict=True):
        out[visit.tokens].append(visit.median_ms / math.exp(g))
    return dict(out)


def relative_noise(values_by_count: dict[int, list[float]]) -> float:
    """Robust standard deviation of one visit's log value around its count's median (a fraction). It reads low on
    counts with few visits (about 0.6 of the spread at three); it is the scale `candidate_k` is set on."""
    residuals = []
    for values in values_by_count.values():
        d = np.log(np.asarray(values, dtype=float))
        if d.size >= 2:
            residuals.extend((d - np.median(d)) * math.sqrt(d.size / (d.size - 1)))
    if not residuals:
        return 0.0
    r = np.asarray(residuals)
    return float(MAD_TO_SD * np.median(np.abs(r - np.median(r))))


def visit_noise(values_by_count: dict[int, list[float]]) -> float:
    """Standard deviation of one visit's log value about its count's level (a fraction), unbiased at any visits."""
    return pooled_pair_noise(np.log(values) for values in values_by_count.values())[0]


def pool_visits(visits: Sequence[Visit], reference: int, window: int = DRIFT_WINDOW) -> list[CurvePoint]:
    """One drift-corrected `CurvePoint` per count, ascending. Each visit's variance is the noise plus how far the
    drift at that visit may be off, so a count seen only just after a sudden slowdown carries that doubt."""
    raw: dict[int, list[float]] = defaultdict(list)
    samples: dict[int, int] = defaultdict(int)
    lowest: dict[int, float] = {}
    for visit in visits:
        raw[visit.tokens].append(visit.median_ms)
        samples[visit.tokens] += len(visit.samples_ms)
        lowest[visit.tokens] = min(lowest.get(visit.tokens, math.inf), min(visit.samples_ms))
    fit = _fit_drift(visits, window)
    corrected = _corrected(visits, fit.drift_at)
    noise = relative_noise(corrected)  # the scale the detector's candidate_k was set on
    # unbiased, else a smooth fast drift reads as doubt (relative_noise reads low on few visits)
    honest_noise = visit_noise(corrected)
    precision: dict[int, float] = defaultdict(float)  # sum over a count's visits of 1 / (log variance)
    for visit, doubt in zip(visits, _drift_uncertainty(fit, honest_noise, window), strict=True):
        precision[visit.tokens] += 1.0 / max(noise ** 2 + doubt ** 2, 1e-18)
    anchor = float(np.median(corrected[reference])) if reference in corrected else float("nan")
    points = []
    for tokens in sorted(raw):
        values = np.asarray(raw[tokens])
        latency = float(np.median(corrected[tokens]))
        q25, q75 = np.percentile(values, [25, 75])
        points.append(CurvePoint(tokens=tokens, latency_ms=latency, median_ms=float(np.median(values)),
                                 relative=latency / anchor, spread_ms=float(q75 - q25), min_ms=lowest[tokens],
                                 visits=len(values), samples=samples[tokens],
                                 se_ms=latency * MEDIAN_SE / math.sqrt(precision[tokens])))
    return points


def reconcile_levels(points: Sequence[CurvePoint], pairs: Sequence[tuple[int, int, float, float]],
                     reference: int) -> list[CurvePoint]:
    """The curve's levels made to agree with its paired measurements `pairs` (low, high, log(L(low) / L(high)), its
    standard error), by one weighted least-squares fit of pooled levels and paired log-ratios. Paired rounds arbitrate
    a step, so a pair counts PAIRED_AUTHORITY^2 times its inverse variance; counts no pair touches keep their level."""
    index = {p.tokens: i for i, p in enumerate(points)}
    usable = [(lo, hi, d, se) for lo, hi, d, se in pairs
              if lo in index and hi in index and math.isfinite(d) and 0 < se < math.inf]
    if not usable or not all(0 < p.se_ms < math.inf for p in points):
        return list(points)
    n = len(points)
    rows = np.zeros((n + len(usable), n))
    target = np.zeros(n + len(usable))
    weight = np.zeros(n + len(usable))
    for i, p in enumerate(points):
        rows[i, i], target[i], weight[i] = 1.0, math.log(p.latency_ms), p.latency_ms / p.se_ms
    for k, (lo, hi, d, se) in enumerate(usable, start=n):
        rows[k, index[lo]], rows[k, index[hi]], target[k], weight[k] = 1.0, -1.0, d, PAIRED_AUTHORITY / se
    design = rows * weight[:, None]
    solution = np.linalg.lstsq(design, target * weight, rcond=None)[0]
    se_log = np.sqrt(np.diag(np.linalg.inv(design.T @ design)))
    anchor = math.exp(solution[index[reference]]) if reference in index else math.nan
    return [replace(p, latency_ms=math.exp(x), relative=math.exp(x) / anchor, se_ms=math.exp(x) * e)
            for p, x, e in zip(points, solution, se_log, strict=True)]
