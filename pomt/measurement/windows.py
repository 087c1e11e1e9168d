"""Level-shift windows over the counts within reach: the steps the visits show, the smallest step they could have
shown (the run's detection limit), and the power passes that spend visits where a window needs them.

The counts within reach and the MARGIN grid counts below it are cut into overlapping windows of WINDOW_COUNTS
counts, each tested for a jump at the positions within reach, Bonferroni-corrected over windows and positions. A
position's limit is the smallest step its best window would show with 80% power; the run's limit is the largest.
Power passes visit the windows whose limit is above the target, widest first, while the budget leaves room.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pomt.formats.curve import CurvePoint
from pomt.formats.trace import Visit
from pomt.measurement.confirmation import Confirmation, confirmed_factor, expected_levels
from pomt.measurement.design import Measurer
from pomt.measurement.drift import corrected_values, relative_noise
from pomt.measurement.level_shift import (
    MIN_SIDE,
    LevelShift,
    WindowVisits,
    level_shift,
    limits_of,
    scatter_pct,
    scatter_shown,
    visits_factor,
)
from pomt.measurement.sources import TraceExhausted

WINDOW_COUNTS = 20  # measured counts a window spans (about ten each side of a jump in its middle)
MARGIN = 5  # grid counts below the reach the windows take in (`window_span`): a step at its low edge has counts below
LEAST_COUNTS = 2 * MIN_SIDE + 1  # fewer measured counts leave no window to test
SECOND_LOOK_P = 0.2  # the paired rounds' p-value under which they back a window's shift
# why the power passes (`power_passes`) stopped short of the target, as `WindowScan.stopped` says it
BUDGET, EXHAUSTED = "budget", "exhausted"


@dataclass(frozen=True)
class WindowTest:
    """How the windows test: at `alpha` (corrected for the windows), no limit below `min_step` (a fraction),
    `size` measured counts a window, and with `line` a slope fitted in each window as well."""

    alpha: float
    min_step: float
    size: int = WINDOW_COUNTS
    line: bool = False


@dataclass(frozen=True)
class WindowShift:
    """A jump between `low` (the highest measured count below it) and `high` tokens that a window shows, significant
    after the correction for every window and position tried."""

    low: int
    high: int
    saving_pct: float  # > 0: the fewer tokens run faster (a drop); < 0: a rise
    p_value: float  # corrected for the positions and the windows
    z: float

    @property
    def span(self) -> tuple[int, int]:
        return self.low, self.high


@dataclass(frozen=True)
class WindowScan:
    """Every window's limit over the counts within reach, and the shifts found."""

    reach: tuple[int, int]
    regions: tuple[tuple[int, int, float], ...]  # (first count, last count, limit %) per window
    shifts: tuple[WindowShift, ...]
    scatter_pct: float = 0.0  # the most a window's counts scatter beyond a visit's noise (`level_shift.scatter_pct`)
    noise_pct: float = 0.0  # a visit's noise, as the windows modelled it
    shown_scatter_pct: float = 0.0  # the same over the windows whose scatter is more than chance (`scatter_shown`)
    visits: int = 0  # visits the windows tested (the counts within reach and the margin below it, `window_span`)
    min_step_pct: float = 0.0  # no limit is stated below the smallest step pomt reports
    stopped: str = ""  # why the power passes stopped short of the target (BUDGET, EXHAUSTED), if they ran
    target_pct: float | None = None  # the limit the run aimed at (--detect), once the passes have run (`short_of`)
    profiles: tuple[tuple[LevelShift, float], ...] = field(default=(), repr=False)  # each window's fit, its alpha

    @property
    def limit_pct(self) -> float | None:
        return max((limit for _, _, limit in self.regions), default=None)

    def above(self, target_pct: float) -> list[tuple[int, int]]:
        """The (first, last) counts of the windows whose limit is above `target_pct`, the widest limit first."""
        return [(lo, hi) for lo, hi, limit in sorted(self.regions, key=lambda r: -r[2]) if limit > target_pct]

    def short_of(self, target_pct: float, stopped: str) -> WindowScan:
        """This scan with the target the power passes aimed at, and why they `stopped` where it is not reached."""
        short = self.limit_pct is None or self.limit_pct > target_pct
        return replace(self, stopped=stopped if short else "", target_pct=target_pct)

    def visits_factor(self, target_pct: float) -> float:
        """How many times the visits within reach the windows would need for every position to show a step of
        `target_pct`: 1 when reached, inf when the counts' own scatter keeps some position out of reach."""
        best = best_by_position({fit.position: visits_factor(fit, alpha, shift.positions, target_pct,
                                                             scattered=scatter_shown(shift))
                                 for fit in shift.profile} for shift, alpha in self.profiles)
        return max(best.values(), default=math.inf)

    def position_limits(self) -> dict[int, float]:
        """{position: its detection limit in %, at the best of the windows that test it}."""
        return best_by_position(limits_of(shift, alpha, self.min_step_pct / 100.0) for shift, alpha in self.profiles)

    def sentence(self, found: int, target_pct: float | None = None, spent: tuple[int, int] | None = None) -> str:
        """What the run could see, in one line, and the target it missed, if any, with what would reach it (`spent`:
        the run's visits and its full grid's, to say it as a --budget). The target: `target_pct`, else the run's."""
        lo, hi = self.reach
        target_pct = self.target_pct if target_pct is None else target_pct
        limit = self.limit_pct
        if limit is None:
            return f"within reach ({lo}-{hi} tokens) too few counts were measured to state a detection limit"
        seen = "none was" if found == 0 else f"{found} confirmed within reach"
        line = f"within reach ({lo}-{hi} tokens), steps of {limit:.0f}% or more would have been found; {seen}"
        if target_pct is not None and limit > target_pct:
            line += f" (--detect {target_pct:g}% not reached{self._why(target_pct, spent)})"
        return line

    def _why(self, target_pct: float, spent: tuple[int, int] | None) -> str:
        """Why the target was not reached, from where the power passes stopped, and what would reach it."""
        if self.stopped == EXHAUSTED:
            return ": the recording holds no more visits of these counts"
        return f" within the visit budget{self._scatter()}{self._more(target_pct, spent)}"

    def _more(self, target_pct: float, spent: tuple[int, int] | None) -> str:
        """What the target would take: at least about how many times the visits the windows tested, as a --budget
        where the run's visits are known, or that no number of visits would."""
        if target_pct < self.min_step_pct:
            return f"; no limit is stated below the minimum step, {self.min_step_pct:g}%"
        factor = self.visits_factor(target_pct)
        if not math.isfinite(factor):
            named = "" if self._scatter() else "; the counts there scatter beyond a visit's noise"
            return f"{named}; more visits of the same counts would not reach it"
        if factor <= 1.0 or not self.visits:
            return ""
        line = f"; it would take at least about {factor:.1f} times the {self.visits} visits its windows tested"
        if spent is not None and spent[1] > 0:
            budget = (spent[0] + (factor - 1.0) * self.visits) / spent[1]
            line += (f" (--budget {budget:.2f} or more)" if budget <= 1.0
                     else ", more than the full grid (--budget 1) holds")
        return line

    def _scatter(self) -> str:
        """The counts' own scatter beyond a visit's noise, where there is enough to name."""
        if self.shown_scatter_pct < max(0.5, 0.5 * self.noise_pct):  # too little to matter, or chance
            return ""
        return f"; the counts there scatter {self.shown_scatter_pct:.1f}% from one to the next, beyond a visit's noise"

    def to_dict(self) -> dict:
        limit = self.limit_pct
        return {"reach": list(self.reach), "limit_pct": None if limit is None else round(limit, 2),
                "regions": [[lo, hi, round(limit, 2)] for lo, hi, limit in self.regions],
                "scatter_pct": round(self.scatter_pct, 2), "shown_scatter_pct": round(self.shown_scatter_pct, 2),
                "stopped": self.stopped or None, "target_pct": self.target_pct}


def windows(counts: Sequence[int], size: int = WINDOW_COUNTS) -> list[list[int]]:
    """Overlapping runs of `size` consecutive measured counts, half a window apart, the last ending at the highest."""
    counts = sorted(counts)
    if len(counts) < LEAST_COUNTS:
        return []
    if len(counts) <= size:
        return [counts]
    half = max(size // 2, 1)
    starts = list(range(0, len(counts) - size + 1, half))
    if starts[-1] != len(counts) - size:
        starts.append(len(counts) - size)
    return [counts[s:s + size] for s in starts]


def window_visits(values_by_count: Mapping[int, Sequence[float]], counts: Sequence[int], noise: float) -> WindowVisits:
    """The log of every visit value (ms, drift corrected) of `counts`, each with the variance noise^2."""
    tokens = [n for n in counts for _ in values_by_count[n]]
    values = [math.log(v) for n in counts for v in values_by_count[n]]
    return WindowVisits.of(tokens, values, max(noise, 1e-4) ** 2)


def window_span(grid: Sequence[int], reach: tuple[int, int]) -> tuple[int, int]:
    """(first, last) of the counts the windows over `reach` take in: the reach and the MARGIN grid counts below it."""
    below = [n for n in grid if n < reach[0]]
    return (below[-MARGIN] if len(below) >= MARGIN else (below[0] if below else reach[0])), reach[1]


def scan(values_by_count: Mapping[int, Sequence[float]], reach: tuple[int, int], noise: float, test: WindowTest, *,
         below: int | None = None) -> WindowScan:
    """Test every window over the counts from `below` (default: the reach's first) to the reach's last, and state
    each window's detection limit, at `test.alpha` corrected for the windows; jumps are tried only at positions within
    `reach`. The values are flat but for steps (the trend divided out); counts with a value at or below zero are out."""
    alpha, min_step = test.alpha, test.min_step
    lo, hi = reach
    first = lo if below is None else min(below, lo)
    counts = [n for n in sorted(values_by_count)
              if first <= n <= hi and values_by_count[n] and min(values_by_count[n]) > 0.0]
    spans = windows(counts, test.size)
    share = alpha / max(len(spans), 1)
    by_window, shifts, scatter, shown, profiles = [], [], 0.0, 0.0, []
    for span in spans:
        within = [n for n in span if lo < n <= hi]
        shift = level_shift(window_visits(values_by_count, span, noise), within, line=test.line)
        by_window.append((span, {} if shift is None else limits_of(shift, share, min_step)))
        if shift is None:
            continue
        profiles.append((shift, share))
        scatter = max(scatter, scatter_pct(shift))
        shown = max(shown, scatter_pct(shift) if scatter_shown(shift) else 0.0)
        if shift.p_value * len(spans) < alpha and abs(shift.saving_pct) >= 100.0 * min_step:
            best = shift.best
            shifts.append(WindowShift(best.low, best.position, shift.saving_pct,
                                      min(1.0, shift.p_value * len(spans)), best.z))
    visits = sum(len(values_by_count[n]) for n in counts)
    return WindowScan(reach, tuple(_regions(by_window, (first, hi))), tuple(_distinct(shifts)), scatter, 100.0 * noise,
                      shown_scatter_pct=shown, visits=visits, min_step_pct=100.0 * min_step, profiles=tuple(profiles))


def _regions(by_window: list[tuple[list[int], dict[int, float]]],
             ends: tuple[int, int]) -> list[tuple[int, int, float]]:
    """(first count, last count, limit) per window, a window's limit the largest of its positions' best; the outer
    regions reach to the `ends` of the counts the windows take in, so that the power passes visit them."""
    best = best_by_position(limits for _, limits in by_window)
    regions = [[span[0], span[-1], max(best[position] for position in limits)] for span, limits in by_window if limits]
    if regions:
        regions[0][0], regions[-1][1] = min(ends[0], regions[0][0]), max(ends[1], regions[-1][1])
    return [(lo, hi, limit) for lo, hi, limit in regions]


def best_by_position(per_window: Iterable[Mapping[int, float]]) -> dict[int, float]:
    """{position: the least of the windows' values there}: a step is found by whichever window tests it best."""
    best: dict[int, float] = {}
    for values in per_window:
        for position, value in values.items():
            best[position] = min(value, best.get(position, math.inf))
    return best


def _supports(pin: Confirmation, shift: WindowShift, min_step: float) -> bool:
    """The paired second look backs the window: same sign, at least the minimum step itself, and p < SECOND_LOOK_P."""
    paired = pin.paired_pct or 0.0
    return (paired * shift.saving_pct > 0 and abs(paired) >= 100.0 * min_step
            and pin.effect is not None and pin.effect.p_value < SECOND_LOOK_P)


def scan_visits(visits: Sequence[Visit], points: list[CurvePoint], confirmed: list[Confirmation],
                reach: tuple[int, int], test: WindowTest, *, below: int | None = None) -> WindowScan:
    """`scan` on a search's visits with drift, the `confirmed` steps and the trend of `points` taken out; a count whose
    trend reads at or below zero is left out."""
    values = corrected_values(visits)
    factor = dict(zip(values, confirmed_factor(list(values), confirmed), strict=True))
    expected = expected_levels(points)
    values = {n: [v * factor[n] / expected[n] for v in vs] for n, vs in values.items() if expected.get(n, 0.0) > 0.0}
    return scan(values, reach, relative_noise(values), test, below=below)


def _distinct(shifts: list[WindowShift]) -> list[WindowShift]:
    """One shift per span (overlapping windows may see the same one), the most significant kept."""
    best: dict[tuple[int, int], WindowShift] = {}
    for s in shifts:
        if s.span not in best or s.p_value < best[s.span].p_value:
            best[s.span] = s
    return sorted(best.values(), key=lambda s: s.p_value)


def counts_to_strengthen(grid: Sequence[int], regions: Sequence[tuple[int, int]],
                         windowed: tuple[int, int]) -> list[int]:
    """The grid counts a power pass visits among the `windowed` ones (first, last): every count of `regions`, in the
    order given, or, while no window exists yet, all of them."""
    lo, hi = windowed
    inside = [n for n in grid if lo <= n <= hi]
    chosen = {n: None for a, b in regions for n in inside if a <= n <= b}
    return list(chosen) or inside


def window_verdicts(shifts: Sequence[WindowShift], judged: Mapping[tuple[int, int], Confirmation],
                    min_step: float) -> list[Confirmation]:
    """Steps the windows show and the paired rounds did not confirm on their own: for each shift with no accepted
    verdict inside its span, the largest paired verdict inside it that `_supports` it, accepted."""
    out = []
    for shift in shifts:
        inside = [c for c in judged.values() if shift.low <= c.low and c.high <= shift.high]
        if any(c.accepted for c in inside):
            continue
        agreeing = [c for c in inside if c.effect is not None and _supports(c, shift, min_step)]
        if not agreeing:
            continue
        pin = max(agreeing, key=lambda c: abs(c.paired_pct or 0.0))
        kind = "drop" if shift.saving_pct > 0 else "rise"
        reason = (f"confirmed by the window test: {kind} of {abs(shift.saving_pct):.1f}% between {shift.low} and "
                  f"{shift.high} (p = {shift.p_value:.2g}, corrected for the windows and positions); the paired "
                  f"rounds of {pin.low}/{pin.high} agree ({pin.paired_pct:+.1f}%)")
        out.append(Confirmation(pin.low, pin.high, pin.effect, True, kind, reason, pin.candidate_z))
    return out


NOISY_VISIT = 0.04  # a visit's noise (unbiased, `drift.visit_noise`) above which power passes come first


def passes_first(grid: Sequence[int], windowed: tuple[int, int], left: float, noise: float) -> bool:
    """Whether power passes come before the candidates: on a noisy machine (visits scatter more than NOISY_VISIT),
    where a pass over the `windowed` counts and the reference costs at most half the `left` budget."""
    inside = sum(windowed[0] <= n <= windowed[1] for n in grid)
    return noise > NOISY_VISIT and inside + 1 <= left / 2


def power_passes(measurer: Measurer, grid: Sequence[int], windowed: tuple[int, int], target_pct: float,
                 reserve: int, scan: Callable[[], WindowScan]) -> WindowScan:
    """Visit the counts of the windows that could miss a step of `target_pct`, a pass at a time, while the budget
    leaves `reserve` visits after the pass; returns the last `scan`, with why the passes stopped short, if they did."""
    while True:
        found = scan()
        limit = found.limit_pct
        if limit is not None and limit <= target_pct:
            return found
        counts = counts_to_strengthen(grid, found.above(target_pct), windowed)
        room = measurer.left() - 1 - reserve  # the reference visits each pass too
        if room < len(counts):
            counts = counts[:max(0, int(room))]
        if len(counts) < WINDOW_COUNTS:  # the budget left cannot strengthen a window
            return replace(found, stopped=BUDGET)
        try:
            measurer.measure_passes(counts, 1)
        except TraceExhausted:  # a replay holds no more of these counts
            return replace(found, stopped=EXHAUSTED)


__all__ = ["BUDGET", "EXHAUSTED", "MARGIN", "NOISY_VISIT", "WINDOW_COUNTS", "WindowScan", "WindowShift", "WindowTest",
           "best_by_position", "counts_to_strengthen", "passes_first", "power_passes", "scan", "scan_visits",
           "window_span", "window_verdicts", "window_visits", "windows"]
