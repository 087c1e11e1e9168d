"""Level shifts in a window of counts, and the smallest shift a window could have shown (pure maths).

A step shows in every count on its side. The window's drift-corrected log visits are fitted with a level (with
`line`, a slope too) and a jump at position p: y_ij = a + b (n_i - c) + h [n_i >= p] + u_i + e_ij, e_ij ~ N(0, v_ij)
the run's noise model for one visit, u_i ~ N(0, tau^2) what a count departs by itself (Paule-Mandel). Without
`line`, b = 0: values with the trend already divided out would only spend precision on a slope. Visits beyond
OUTLIER_SD are interference and left out. z = h / se(h) (normal, or t once tau is estimated) is profiled over every
position with MIN_SIDE counts each side, Bonferroni-corrected; the detection limit at a position is the shift that
test finds with the given power: (critical value + power quantile) x se(h).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as scipy_stats

OUTLIER_SD = 5.0  # a visit this many SDs from the window's fit was hit by interference
MIN_SIDE = 2  # measured counts a jump needs on each side
POWER = 0.8
SCATTER_ALPHA = 0.01  # analysis-of-variance level under which a window's counts scatter beyond their visits' spread


@dataclass(frozen=True)
class WindowVisits:
    """The visits of the counts in a window, one entry per visit: count, log latency, its variance."""

    tokens: np.ndarray
    values: np.ndarray
    variances: np.ndarray

    @classmethod
    def of(cls, tokens: Sequence[int], values: Sequence[float], variances: Sequence[float] | float) -> WindowVisits:
        t = np.asarray(tokens, dtype=int)
        v = np.broadcast_to(np.asarray(variances, dtype=float), t.shape).copy()
        return cls(t, np.asarray(values, dtype=float), v)

    @property
    def counts(self) -> np.ndarray:
        return np.unique(self.tokens)

    def positions(self, min_side: int = MIN_SIDE) -> list[int]:
        """Jump positions (the first count of the high side) with `min_side` counts on each side."""
        counts = self.counts
        return [int(counts[i]) for i in range(min_side, counts.size - min_side + 1)]


@dataclass(frozen=True)
class JumpFit:
    """The line-with-a-jump fit at one position; `jump` is log(L(high side) / L(low side)) beyond the line (> 0: a
    drop)."""

    position: int
    low: int  # the highest measured count below the jump
    jump: float
    se: float
    tau: float
    df: int  # counts less the parameters
    dropped: int  # visits left out as interference
    se_floor: float = 0.0  # what se would be with every count's visits infinitely many: tau's part alone
    scatter_p: float = 1.0  # chance of the counts scattering so far from the fit by their visits' own spread

    @property
    def z(self) -> float:
        return self.jump / self.se if self.se > 0 else 0.0

    @property
    def reference_df(self) -> float:
        """Degrees of freedom of the test's reference: normal (inf) while tau is 0, else t with the window's df."""
        return math.inf if self.tau == 0.0 else float(max(self.df, 1))

    def p_value(self) -> float:
        return float(2.0 * _sf(abs(self.z), self.reference_df))

    @property
    def saving_pct(self) -> float:
        """How much faster the low side runs than the line predicts across the jump, in %."""
        return 100.0 * (1.0 - math.exp(-self.jump))


@dataclass(frozen=True)
class LevelShift:
    """The window's verdict: the best position and its test, corrected for the positions tried."""

    best: JumpFit
    p_value: float  # Bonferroni over `positions`
    positions: int
    profile: tuple[JumpFit, ...]

    @property
    def saving_pct(self) -> float:
        return self.best.saving_pct

    def interval_pct(self, confidence: float = 0.95) -> tuple[float, float]:
        """Confidence interval of the saving in % (not corrected for the positions)."""
        half = _ppf(0.5 + confidence / 2, self.best.reference_df) * self.best.se
        low, high = self.best.jump - half, self.best.jump + half
        return 100.0 * (1.0 - math.exp(-low)), 100.0 * (1.0 - math.exp(-high))


def _sf(x: float, df: float) -> float:
    return float(scipy_stats.norm.sf(x) if math.isinf(df) else scipy_stats.t.sf(x, df))


def _ppf(q: float, df: float) -> float:
    return float(scipy_stats.norm.ppf(q) if math.isinf(df) else scipy_stats.t.ppf(q, df))


def parameters(line: bool) -> int:
    """Coefficients the fit estimates: level and jump, and the slope with `line`."""
    return 3 if line else 2


def _design(counts: np.ndarray, position: int, line: bool) -> np.ndarray:
    """Columns: the level, the slope (with `line`), the jump last."""
    centre = 0.5 * (counts.min() + counts.max())
    scale = max(float(np.ptp(counts)), 1.0)
    slope = [(counts - centre) / scale] if line else []
    return np.column_stack([np.ones(counts.size), *slope, (counts >= position).astype(float)])


def _wls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted least squares: coefficients, their covariance, weighted residuals."""
    xw = x * np.sqrt(w)[:, None]
    normal = xw.T @ xw
    cov = np.linalg.pinv(normal)
    beta = cov @ (xw.T @ (y * np.sqrt(w)))
    return beta, cov, (y - x @ beta) * np.sqrt(w)


def _tau_squared(x: np.ndarray, y: np.ndarray, v: np.ndarray) -> float:
    """Paule-Mandel: the count-level variance that makes the weighted residuals' sum of squares equal its df."""
    df = y.size - x.shape[1]
    if df < 1:
        return 0.0

    def excess(tau2: float) -> float:
        return float(np.sum(_wls(x, y, 1.0 / (v + tau2))[2] ** 2)) - df

    if excess(0.0) <= 0:
        return 0.0
    high = max(float(np.var(y)), float(v.max()), 1e-12)
    while excess(high) > 0:
        high *= 4.0
    return float(optimize.brentq(excess, 0.0, high, xtol=1e-12 * high))


def _levels(t: np.ndarray, y: np.ndarray, v: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per count: the precision-weighted mean of its kept visits and that mean's variance."""
    counts = np.unique(t[keep])
    means, variances = np.empty(counts.size), np.empty(counts.size)
    for i, n in enumerate(counts):
        m = keep & (t == n)
        w = 1.0 / v[m]
        means[i], variances[i] = float(np.sum(w * y[m]) / w.sum()), float(1.0 / w.sum())
    return counts, means, variances


def fit_jump(window: WindowVisits, position: int, line: bool = True) -> JumpFit:
    """The level (the line, with `line`) with a jump at `position`, fitted to the window's count levels."""
    t, y, v = window.tokens, window.values, window.variances
    keep = np.ones(t.size, dtype=bool)
    for _ in range(2):  # fit, leave out visits far from the fit, fit again
        counts, means, variances = _levels(t, y, v, keep)
        x = _design(counts, position, line)
        tau2 = _tau_squared(x, means, variances)
        beta, _, _ = _wls(x, means, 1.0 / (variances + tau2))
        fitted = dict(zip(counts.tolist(), (x @ beta).tolist(), strict=True))
        expected = np.array([fitted.get(int(n), np.nan) for n in t])
        again = np.abs(y - expected) <= OUTLIER_SD * np.sqrt(v + tau2)
        again &= np.isin(t, counts)
        if np.array_equal(again, keep) or len(np.unique(t[again])) < counts.size:
            break
        keep = again
    counts, means, variances = _levels(t, y, v, keep)
    x = _design(counts, position, line)
    tau2 = _tau_squared(x, means, variances)
    beta, cov, _ = _wls(x, means, 1.0 / (variances + tau2))
    below = counts[counts < position]
    floor = math.sqrt(tau2 * float(np.linalg.pinv(x.T @ x)[-1, -1]))
    df = int(counts.size - parameters(line))
    return JumpFit(position=position, low=int(below.max()), jump=float(beta[-1]), se=float(math.sqrt(cov[-1, -1])),
                   tau=math.sqrt(tau2), df=df, dropped=int((~keep).sum()), se_floor=floor,
                   scatter_p=_scatter_p(t[keep], y[keep], x, means))


def _scatter_p(t: np.ndarray, y: np.ndarray, x: np.ndarray, means: np.ndarray) -> float:
    """One-way analysis of variance: the chance that the count levels `means` sit so far from their fit `x` by their
    visits' own spread within a count alone (not the run's noise model); 1 where no count has two visits."""
    counts, index, visits = np.unique(t, return_inverse=True, return_counts=True)
    within_df = int(t.size - counts.size)
    between_df = int(counts.size - x.shape[1])
    if within_df < 1 or between_df < 1:
        return 1.0
    within = float(np.sum((y - means[index]) ** 2)) / within_df
    if within <= 0.0:
        return 0.0
    fit = x @ np.linalg.lstsq(x * np.sqrt(visits)[:, None], means * np.sqrt(visits), rcond=None)[0]
    between = float(np.sum(visits * (means - fit) ** 2)) / between_df
    return float(scipy_stats.f.sf(between / within, between_df, within_df))


def level_shift(window: WindowVisits, positions: Sequence[int] | None = None,
                min_side: int = MIN_SIDE, line: bool = True) -> LevelShift | None:
    """The jump profiled over `positions` (default: every position with `min_side` counts each side): the largest
    |z|, its p-value corrected for the positions tried. None when the window leaves no position."""
    allowed = set(window.positions(min_side))
    tried = sorted(allowed if positions is None else allowed & set(positions))
    if not tried or window.counts.size < parameters(line) + 2:
        return None
    profile = tuple(fit_jump(window, p, line) for p in tried)
    best = max(profile, key=lambda f: abs(f.z))
    return LevelShift(best, min(1.0, len(tried) * best.p_value()), len(tried), profile)


def critical_z(alpha: float, positions: int, df: float = math.inf) -> float:
    """|z| a two-sided test at `alpha`, Bonferroni-corrected over `positions`, must exceed."""
    return _ppf(1.0 - alpha / (2.0 * max(positions, 1)), df)


def detectable_jump(fit: JumpFit, alpha: float, positions: int, power: float = POWER) -> float:
    """The smallest |jump| (log) the test at `fit`'s position finds with probability `power`, on the t reference
    (a window with a step in it may need tau where this one did not)."""
    return _power_multiplier(fit, alpha, positions, power) * fit.se


def _power_multiplier(fit: JumpFit, alpha: float, positions: int, power: float) -> float:
    df = float(max(fit.df, 1))
    return critical_z(alpha, positions, df) + _ppf(power, df)


def visits_factor(fit: JumpFit, alpha: float, positions: int, target_pct: float, *, scattered: bool,
                  power: float = POWER) -> float:
    """How many times its visits the window would need for `fit`'s position to show a step of `target_pct` with
    `power` (1 when it already does; inf when scatter keeps it out of reach): se^2 = floor^2 + (se^2 - floor^2) / k,
    the floor tau's part where the counts are `scattered`, else none."""
    needed = -math.log(1.0 - target_pct / 100.0) / _power_multiplier(fit, alpha, positions, power)
    floor = fit.se_floor if scattered else 0.0
    if fit.se <= needed:
        return 1.0
    if floor >= needed:
        return math.inf
    return (fit.se ** 2 - floor ** 2) / (needed ** 2 - floor ** 2)


def detection_limit_pct(window: WindowVisits, alpha: float, min_step: float, power: float = POWER,
                        min_side: int = MIN_SIDE, line: bool = True) -> dict[int, float]:
    """{position: the smallest step in % the window would have confirmed there with `power`}, at least `min_step`."""
    shift = level_shift(window, min_side=min_side, line=line)
    return {} if shift is None else limits_of(shift, alpha, min_step, power)


def limits_of(shift: LevelShift, alpha: float, min_step: float, power: float = POWER) -> dict[int, float]:
    """`detection_limit_pct` of a window whose jump profile is already fitted."""
    return {f.position: max(100.0 * (1.0 - math.exp(-detectable_jump(f, alpha, shift.positions, power))),
                            100.0 * min_step)
            for f in shift.profile}


def scatter_pct(shift: LevelShift) -> float:
    """How far the window's counts scatter beyond a visit's noise, in %: the least tau over the positions fitted."""
    return 100.0 * math.expm1(min(f.tau for f in shift.profile))


def scatter_shown(shift: LevelShift) -> bool:
    """Whether the window's counts scatter beyond their visits' own spread even at the position of least tau, by the
    analysis of variance (`JumpFit.scatter_p` < SCATTER_ALPHA)."""
    return min(shift.profile, key=lambda f: f.tau).scatter_p < SCATTER_ALPHA
