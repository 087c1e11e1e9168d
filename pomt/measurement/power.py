"""Power passes: visits spent where the level-shift windows within reach need them (`pomt.measurement.windows`).

A pass visits the counts of the windows whose detection limit is above the target, the widest limits first, so
that a pass the budget cuts short strengthens those. Passes go on while the budget leaves room for a window's
worth of counts and the visits reserved for what comes after, until the limit reaches the target.

Until 2026-11-30 the passes also stopped after one that lowered the limit by less than 10%, taken as the counts'
own scatter setting it. A pass adding a fifth to the visits lowers a limit the visits set by about 10% (the square
root of 5/6), so that rule stopped on the limit's own noise: the noisy deit_tiny_bs4 replay spent 395 visits at
`--budget 0.4` and `0.8` alike, and the analysis of variance shows no scatter in its dense record. Stopping where
the windows' analysis of variance shows scatter instead stopped a scan of plain noise at two visits a count in 2
of 6 seeds; the run's line says where scatter keeps the target out of reach (`WindowScan.sentence`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from pomt.measurement.design import Measurer
from pomt.measurement.sources import TraceExhausted
from pomt.measurement.windows import BUDGET, EXHAUSTED, WINDOW_COUNTS, WindowScan, counts_to_strengthen

NOISY_VISIT = 0.04  # a visit's noise (unbiased, `drift.visit_noise`) above which power passes come first


def passes_first(grid: Sequence[int], windowed: tuple[int, int], left: float, noise: float) -> bool:
    """Whether power passes come before the candidates: on a noisy machine (the coarse scan's visits scatter
    more than NOISY_VISIT) and where a pass over the counts the windows take in (`windowed`, first and last:
    `pomt.measurement.windows.window_span`) and the reference costs at most half the `left` budget.

    On a noisy machine the paired rounds of one candidate cost as much as such a pass and confirm far less. On a
    quiet one they confirm in a few rounds, and passes first left the candidates too little budget where several
    steps lie within reach (the curve bank's recall within reach 0.815 -> 0.679, 2026-11-27). Where one pass
    would take most of the budget (a reach over the whole grid), the candidates come first: the earlier form of
    this rule spent the whole budget in one pass there, and a synthetic replay missed a planted step. The
    coarse scan's unbiased noise read 1.0-2.9% on the bank's quiet traces (one outlier at 6.4%) and 4.8-16% on
    the noisy ones; the threshold lies between."""
    inside = sum(windowed[0] <= n <= windowed[1] for n in grid)
    return noise > NOISY_VISIT and inside + 1 <= left / 2


def power_passes(measurer: Measurer, grid: Sequence[int], windowed: tuple[int, int], target_pct: float,
                 reserve: int, scan: Callable[[], WindowScan]) -> WindowScan:
    """Visit the counts the windows take in (`windowed`, first and last) of the windows that could miss a step of
    `target_pct`, one pass at a time, while the budget leaves `reserve` visits after the pass; `scan` states the
    windows on every visit so far.
    Returns the last scan, with why the passes stopped short of the target (`WindowScan.stopped`) where they did."""
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


__all__ = ["NOISY_VISIT", "passes_first", "power_passes"]
