"""Statistics of latency measured on a drifting machine (pure functions; no timing, no I/O).

- Drift is a smooth function of time shared by every count: log(visit) = level(count) + drift(time)
  + noise. Because counts are visited in shuffled passes, the two separate: `drift_profile` estimates
  both, the drift at each visit from the neighbouring visits in time (leave-one-out running median of
  what their counts' levels do not explain). The reference count, visited in every pass, anchors it.
- A count's latency pools its visits corrected for that drift (`pool_visits`), so a batch measured
  while the machine ran slow does not read as a level shift.
- Noise is the spread between visits of the same count after the correction (`relative_noise`); it is
  the one noise figure the search and the step detector use.
- Claims are paired (`paired_effect`): two things measured alternately, compared through the t
  distribution of their paired log-ratios (scipy), with a confidence interval.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as scipy_stats

from pomt.trace import Visit

MEDIAN_SE = 1.2533  # standard error of a median relative to that of a mean, for normal samples
MAD_TO_SD = 1.4826  # median absolute deviation of a normal distribution in standard deviations
DRIFT_WINDOW = 8  # visits on each side that estimate the drift at a visit
OUTLIER_SD = 5.0  # paired log-ratios this many robust SDs from their median are interference, not signal
SCREEN_MIN_PAIRS = 6  # fewer pairs cannot tell an interfered pair from an unlucky one


@dataclass(frozen=True)
class CurvePoint:
    """Pooled latency of one token count over all its visits.

    `median_ms` pools the raw visit medians; `relative` pools each visit over the reference count's
    visit in the same pass; `latency_ms` is `relative` times the reference's pooled level: the
    drift-corrected latency that detection and policies use.
    """

    tokens: int
    latency_ms: float
    median_ms: float
    relative: float
    spread_ms: float  # interquartile range of the visit medians
    min_ms: float
    visits: int
    samples: int
    se_ms: float = float("nan")  # standard error of latency_ms (between-visit noise)

    def to_row(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Drift:
    """How much the reference count's latency moved during a run."""

    reference_tokens: int
    max_over_min: float
    reference_ms: tuple[float, ...]  # one visit median per pass, in time order

    @property
    def pct(self) -> float:
        return 100.0 * (self.max_over_min - 1.0)

    def to_dict(self) -> dict:
        return {
            "reference_tokens": self.reference_tokens,
            "max_over_min": round(self.max_over_min, 4),
            "drift_pct": round(self.pct, 2),
            "reference_ms": [round(v, 3) for v in self.reference_ms],
        }


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
    """(log level per count, log drift per visit in the given order); see the module docstring.

    The drift at a visit is the median, over up to `window` visits on each side in time (itself left
    out), of what their counts' levels do not explain; only counts visited at least twice inform it.
    Its median over the run is 0, so levels are latencies at the run's typical speed. Valid for
    shuffled visit orders only: in one ascending sweep, time and token count are the same axis.
    """
    if not visits:
        return {}, np.zeros(0)
    order = np.argsort([v.t_s for v in visits], kind="stable")
    y = np.log([visits[i].median_ms for i in order])
    tokens = np.array([visits[i].tokens for i in order])
    members = {n: tokens == n for n in np.unique(tokens)}
    informative = np.array([members[n].sum() >= 2 for n in tokens])
    g = np.zeros(y.size)
    for _ in range(iterations):
        level = {n: float(np.median(y[m] - g[m])) for n, m in members.items()}
        residual = np.where(informative, y - np.array([level[n] for n in tokens]), np.nan)
        new = _neighbour_median(residual, window)
        new -= np.median(new)
        if np.allclose(new, g, atol=1e-6):
            g = new
            break
        g = new
    level = {int(n): float(np.median(y[m] - g[m])) for n, m in members.items()}
    drift_at = np.empty(y.size)
    drift_at[order] = g
    return level, drift_at


def _neighbour_median(values: np.ndarray, window: int) -> np.ndarray:
    """For each position, the median of the non-NaN values within `window` on each side, itself left out
    (0 where there are none)."""
    padded = np.concatenate([np.full(window, np.nan), values, np.full(window, np.nan)])
    around = np.lib.stride_tricks.sliding_window_view(padded, 2 * window + 1).copy()
    around[:, window] = np.nan
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows
        medians = np.nanmedian(around, axis=1)
    return np.nan_to_num(medians, nan=0.0)


def corrected_values(visits: Sequence[Visit], window: int = DRIFT_WINDOW) -> dict[int, list[float]]:
    """Each visit's median with the drift at its time divided out, per count."""
    _, g = drift_profile(visits, window)
    out: dict[int, list[float]] = defaultdict(list)
    for visit, drift_log in zip(visits, g, strict=True):
        out[visit.tokens].append(visit.median_ms / math.exp(drift_log))
    return dict(out)


def relative_noise(values_by_count: dict[int, list[float]]) -> float:
    """Robust standard deviation of one visit's log value around its count's median (a fraction).

    Residuals of every count with two or more visits are pooled, so the estimate is stable even with
    three or four visits per count; each residual is scaled by sqrt(m / (m - 1)) for the count's own
    median having absorbed part of it.
    """
    residuals = []
    for values in values_by_count.values():
        m = len(values)
        if m < 2:
            continue
        logs = np.log(np.asarray(values, dtype=float))
        residuals.extend((logs - np.median(logs)) * math.sqrt(m / (m - 1)))
    if not residuals:
        return 0.0
    r = np.asarray(residuals)
    return float(MAD_TO_SD * np.median(np.abs(r - np.median(r))))


def pool_visits(visits: Sequence[Visit], reference: int, window: int = DRIFT_WINDOW) -> list[CurvePoint]:
    """One drift-corrected `CurvePoint` per count, ascending (see the module docstring)."""
    raw: dict[int, list[float]] = defaultdict(list)
    samples: dict[int, int] = defaultdict(int)
    lowest: dict[int, float] = {}
    for visit in visits:
        raw[visit.tokens].append(visit.median_ms)
        samples[visit.tokens] += len(visit.samples_ms)
        lowest[visit.tokens] = min(lowest.get(visit.tokens, math.inf), min(visit.samples_ms))
    corrected = corrected_values(visits, window)
    noise = relative_noise(corrected)
    anchor = float(np.median(corrected[reference])) if reference in corrected else float("nan")
    points = []
    for tokens in sorted(raw):
        values = np.asarray(raw[tokens])
        latency = float(np.median(corrected[tokens]))
        q25, q75 = np.percentile(values, [25, 75])
        points.append(
            CurvePoint(
                tokens=tokens,
                latency_ms=latency,
                median_ms=float(np.median(values)),
                relative=latency / anchor,
                spread_ms=float(q75 - q25),
                min_ms=lowest[tokens],
                visits=len(values),
                samples=samples[tokens],
                se_ms=noise * latency * MEDIAN_SE / math.sqrt(len(values)),
            )
        )
    return points


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


def paired_effect(
    a_ms: Sequence[float], b_ms: Sequence[float], *, offset: float = 0.0, confidence: float = 0.95
) -> PairedEffect:
    """Compare b with a measured in pairs (a_i and b_i taken together); see `PairedEffect`.

    With SCREEN_MIN_PAIRS or more pairs, those whose log-ratio lies more than OUTLIER_SD robust standard
    deviations from the median pair were hit by interference on one side only; they are left out and
    counted.
    """
    a = np.asarray(a_ms, dtype=float)
    b = np.asarray(b_ms, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("paired samples must be two 1-D sequences of equal length")
    d = np.log(b) - np.log(a)
    mad = MAD_TO_SD * float(np.median(np.abs(d - np.median(d)))) if d.size >= SCREEN_MIN_PAIRS else 0.0
    keep = np.abs(d - np.median(d)) <= OUTLIER_SD * mad if mad > 0 else np.ones(d.size, dtype=bool)
    kept = d[keep]
    if kept.size < 2:
        ratio = float(np.exp(kept.mean())) if kept.size else 1.0
        return PairedEffect(ratio, (0.0, math.inf), 1.0, int(kept.size), int((~keep).sum()), offset)
    if np.ptp(kept) == 0.0:  # identical pairs (a noiseless replay): the interval is the value itself
        value = float(kept[0])
        p = 1.0 if value == offset else 0.0
        return PairedEffect(math.exp(value), (math.exp(value), math.exp(value)), p, int(kept.size),
                            int((~keep).sum()), offset)
    result = scipy_stats.ttest_1samp(kept - offset, 0.0)
    low, high = result.confidence_interval(confidence)
    return PairedEffect(
        ratio=float(np.exp(kept.mean())),
        ci=(float(np.exp(low + offset)), float(np.exp(high + offset))),
        p_value=float(result.pvalue),
        pairs=int(kept.size),
        dropped=int((~keep).sum()),
        offset=offset,
    )
