"""Candidate steps: where the pooled curve shows them, in which order a search examines them, and what
each needs measured before its verdict. Pure functions of the curve and the visits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pomt.formats.curve import CurvePoint
from pomt.formats.trace import Visit
from pomt.measurement.confirmation import Confirmation
from pomt.measurement.steps import detect_steps
from pomt.measurement.trend import trend


@dataclass(frozen=True)
class Candidate:
    """A possible step between `low` and `high` tokens, `z` its significance (noise units)."""

    low: int
    high: int
    z: float

    @property
    def span(self) -> tuple[int, int]:
        return self.low, self.high


def expected_levels(points: list[CurvePoint]) -> dict[int, float]:
    """The curve's smooth trend at each of its counts (`pomt.measurement.trend.trend`, noise from the points)."""
    t = np.array([p.tokens for p in points], dtype=float)
    smooth = trend(t, np.array([p.latency_ms for p in points]), float(np.median([p.se_ms for p in points])))
    return dict(zip([p.tokens for p in points], smooth.tolist(), strict=True))


def level_change(points: list[CurvePoint], low: int, high: int,
                 expected: dict[int, float] | None = None) -> tuple[float, float]:
    """The curve's level change from `high` to `low` tokens over the trend's (a fraction, negative for
    a drop) and its standard error; `expected`: the curve's `expected_levels`, when already known."""
    level = {p.tokens: p for p in points}
    expected = expected if expected is not None else expected_levels(points)
    change = (level[low].latency_ms / expected[low]) / (level[high].latency_ms / expected[high]) - 1.0
    se = math.hypot(level[low].se_ms / level[low].latency_ms, level[high].se_ms / level[high].latency_ms)
    return change, se


def detected(points: list[CurvePoint], k: float, steps: list[Confirmation]) -> list[Candidate]:
    """Every candidate the detector sees at `k` on the pooled, drift-corrected curve (each point with its own
    standard error) with the confirmed `steps` taken out: a spike gives one candidate on each side; a
    candidate that ends at a confirmed step is trimmed to its other side."""
    if len(points) < 4:
        return []
    tokens = [p.tokens for p in points]
    factor = confirmed_factor(tokens, steps)
    report = detect_steps(tokens, [p.latency_ms * f for p, f in zip(points, factor, strict=True)], k=k,
                          noise_ms=[p.se_ms * f for p, f in zip(points, factor, strict=True)])
    found = [(step.tokens, step.upper_tokens, step.significance) for step in report.steps]
    for n in report.spikes:
        i = tokens.index(n)
        if 0 < i < len(tokens) - 1:
            found += [(tokens[i - 1], n, k), (n, tokens[i + 1], k)]
    return [Candidate(*span, z) for low, high, z in found if (span := outside_confirmed(low, high, steps))]


def confirmed_factor(tokens: list[int], steps: list[Confirmation]) -> list[float]:
    """Per count, what takes the confirmed steps below it out of its level: the product of their paired
    excess ratios (a step's high side then continues its low side's trend)."""
    return [math.prod(c.effect.excess for c in steps if c.high <= n) for n in tokens]


def outside_confirmed(low: int, high: int, steps: list[Confirmation]) -> tuple[int, int] | None:
    """The candidate span with a confirmed step at either end cut off, None when a confirmed step covers it."""
    for c in steps:
        if not (c.low < high and low < c.high):
            continue
        if c.high == high and c.low > low:
            high = c.low
        elif c.low == low and c.high < high:
            low = c.high
        else:
            return None
    return (low, high) if low < high else None


def ranked(candidates: Iterable[Candidate], open_edges: Iterable[tuple[int, int]], reach: int) -> list[Candidate]:
    """The most significant candidate of each span, in the order a search examines them: those that may hold
    a step within reach of the caller's policy (high side above `reach`) first, then the rest; within each,
    the open aligned edges first (their counts are settled and half their rounds taken, so a verdict costs a
    few visits where a detector candidate still needs bisection and all its rounds), then the most
    significant."""
    edges = set(open_edges)
    unique = {c.span: c for c in sorted(candidates, key=lambda c: c.z)}
    return sorted(unique.values(), key=lambda c: (c.high <= reach, c.span not in edges, -c.z, c.low))


def sharpest(points: list[CurvePoint], low: int, high: int, min_step: float) -> tuple[int, int]:
    """The adjacent measured counts inside a candidate with the largest change over the trend, when that
    change alone reaches `min_step`; else the candidate itself (a ramp of small changes is judged whole).
    Once the sharpest part is judged, the detector re-runs: the rest of the span is flagged again only if
    it holds more."""
    inside = [p.tokens for p in points if low <= p.tokens <= high]
    if len(inside) <= 2:
        return low, high
    expected = expected_levels(points)  # one trend fit for every interval inside
    size, a, b = max((abs(level_change(points, a, b, expected)[0]), a, b)
                     for a, b in zip(inside, inside[1:], strict=False))
    return (a, b) if size >= min_step else (low, high)


def unmeasured_inside(grid: list[int], visits: Sequence[Visit], low: int, high: int) -> list[int]:
    """The grid counts strictly between `low` and `high` that no visit measured yet."""
    measured = {v.tokens for v in visits}
    return [n for n in grid[grid.index(low) + 1 : grid.index(high)] if n not in measured]


def unsettled(visits: Sequence[Visit], low: int, high: int) -> list[int]:
    """Counts to measure again before a candidate is judged: its two counts until they have three visits (a
    median that one disturbed visit cannot move), its measured neighbours outside it until they have two.
    A bisection places candidates from single visits, which misplaces some."""
    counts: dict[int, int] = {}
    for visit in visits:
        counts[visit.tokens] = counts.get(visit.tokens, 0) + 1
    measured = sorted(counts)
    i, j = measured.index(low), measured.index(high)
    wanted = {n: 2 for n in measured[max(0, i - 1) : i] + measured[j + 1 : j + 2]}
    wanted.update({low: 3, high: 3})
    return sorted(n for n, least in wanted.items() if counts[n] < least)


def next_counts(grid: list[int], visits: Sequence[Visit], low: int, high: int) -> list[int]:
    """What a candidate needs measured next: the middle unmeasured grid count inside it, or, once there is
    none, the counts that are not yet settled (none: it is ready for its verdict)."""
    inside = unmeasured_inside(grid, visits, low, high)
    return [inside[len(inside) // 2]] if inside else unsettled(visits, low, high)


__all__ = ["Candidate", "detected", "expected_levels", "level_change", "next_counts", "ranked", "sharpest",
           "unmeasured_inside", "unsettled"]
