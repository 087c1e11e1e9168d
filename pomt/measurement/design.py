"""Which token counts to visit, in which order, and the object that visits them through a `MeasurementRun`.

A randomised block design, so that a machine whose speed drifts does not shape the curve: the counts are
visited in passes, each in a seeded random order with the reference count (N) in it, never in one
ascending sweep. Counts visited back to back form a unit whose order flips every other pass (A B, then
B A), so that each pass holds a paired round of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from tqdm import tqdm

from pomt.errors import GridError
from pomt.formats.trace import Visit
from pomt.measurement.sources import MeasurementRun, TraceExhausted, calibrate_reps

CALIBRATION_REPS = 3

Unit = tuple[int, ...]  # counts visited back to back in one pass


def token_grid(start: int, stop: int, stride: int, *, min_tokens: int, max_tokens: int) -> list[int]:
    """Counts from `start` towards `stop` every `stride` (both ends included), ascending; `min_tokens` is P + 1,
    `max_tokens` is N."""
    lo, hi = min(start, stop), max(start, stop)
    if stride < 1:
        raise GridError(f"token grid stride must be at least 1, got {stride}")
    if lo < min_tokens or hi > max_tokens:
        raise GridError(f"token grid {lo}..{hi} lies outside the allowed range [{min_tokens}, {max_tokens}] "
                        "(at least one patch token kept, at most all N tokens)")
    direction = 1 if stop >= start else -1
    counts = set(range(start, stop + direction, direction * stride))
    counts.add(stop)
    return sorted(counts)


def checked_grid(grid: Sequence[int], reference: int) -> list[int]:
    """The grid's counts ascending, once each; GridError when it is empty or lacks the reference."""
    if not grid:
        raise GridError("the token grid is empty")
    if reference not in grid:
        raise GridError(f"the token grid must include the reference count N = {reference}")
    return sorted(set(grid))


def anchor_pairs(grid: list[int], reference: int, align: int) -> list[tuple[int, int]]:
    """(a - 1, a) for every multiple a of `align` below the reference with both counts on the grid: kernels
    favour aligned sizes, so many real steps sit at these edges (none when `align` is below 2)."""
    if align < 2:
        return []
    on_grid = set(grid)
    return [(n - 1, n) for n in grid if n % align == 0 and n - 1 in on_grid and n < reference]


def coarse_units(grid: list[int], anchors: list[tuple[int, int]], stride: int | None, *,
                 sparse_below: bool) -> list[Unit]:
    """What an adaptive search's coarse passes visit: the anchor pairs and, with `sparse_below`, every `stride`-th
    count below the first one; else every `stride`-th count (default: sqrt of the grid's size); the ends always."""
    stride = stride or max(2, round(math.sqrt(len(grid))))
    ends = {grid[0], grid[-1]}
    if not anchors:
        return [(n,) for n in sorted(set(grid[::stride]) | ends)]
    taken = {n for pair in anchors for n in pair}
    below = set(grid[grid.index(anchors[0][0]) - 1 :: -stride]) if sparse_below else set()
    return [*anchors, *((n,) for n in sorted((below | ends) - taken))]


def aligned_units(grid: list[int], reference: int, align: int) -> list[Unit]:
    """Every grid count once, each aligned edge's two counts as one unit (`anchor_pairs`)."""
    pairs = anchor_pairs(grid, reference, align)
    paired = {n for pair in pairs for n in pair}
    return [*pairs, *((n,) for n in grid if n not in paired)]


def chained_units(grid: list[int], number: int) -> list[Unit]:
    """The units of pass `number` (from 0) of a chained recording: neighbouring pairs from the grid's first count in
    even passes, its second in odd ones, reversed in passes 2, 3, 6, 7, ..., so each pair comes in both orders."""
    start = number % 2
    pairs = [(grid[i], grid[i + 1]) for i in range(start, len(grid) - 1, 2)]
    if (number // 2) % 2:
        pairs = [(b, a) for a, b in pairs]
    paired = {n for pair in pairs for n in pair}
    return [*pairs, *((n,) for n in grid if n not in paired)]


def design_rounds(design: Sequence[Visit], low: int, high: int) -> list[tuple[Visit, Visit]]:
    """(low, high) visit pairs a design holds: the two counts visited back to back in one pass."""
    rounds = []
    for first, second in zip(design, design[1:], strict=False):
        if first.pass_index == second.pass_index and {first.tokens, second.tokens} == {low, high}:
            rounds.append((first, second) if first.tokens == low else (second, first))
    return rounds


class BudgetSpent(Exception):
    """Raised by a `Measurer` asked for a visit beyond its budget."""


class Measurer:
    """Visits counts through a `MeasurementRun` in shuffled passes and paired rounds, within an optional budget of
    visits, and keeps every visit: `design` (the passes) and `paired` (the rounds)."""

    def __init__(self, measuring: MeasurementRun, reference: int, *, seed: int = 0, budget: int | None = None,
                 total: int | None = None, progress: bool = True):
        self.measuring, self.reference, self.budget = measuring, reference, budget
        self.rng = np.random.default_rng(seed)
        self.reps = 1
        self.design: list[Visit] = []
        self.paired: list[Visit] = []
        self._pass = 0
        self._bar = tqdm(total=total, desc="latency", unit="visit", disable=not progress)

    def visits(self) -> list[Visit]:
        """Every visit so far: the design's passes and the paired rounds."""
        return self.design + self.paired

    def left(self) -> float:
        """Visits the budget still allows."""
        return math.inf if self.budget is None else self.budget - self.measuring.visits

    def visit(self, tokens: int, reps: int | None = None) -> Visit:
        if self.budget is not None and self.measuring.visits >= self.budget:
            raise BudgetSpent
        visit = self.measuring.visit(tokens, reps or self.reps, self._pass)
        self._bar.update(1)
        return visit

    def new_pass(self) -> int:
        self._pass += 1
        return self._pass

    def calibrate(self, reps: int | None, visit_s: float) -> None:
        """Timed forwards per visit: `reps`, a replayed trace's own, or so that a visit lasts about `visit_s`."""
        preferred = getattr(self.measuring.source, "preferred_reps", None)
        if reps is not None or preferred is not None:
            self.reps = reps or preferred
            return
        visit = self.visit(self.reference, CALIBRATION_REPS)
        self.reps = calibrate_reps(visit.median_ms / 1e3, visit_s)

    def measure_passes(self, counts: list[int], passes: int, reference_visits: int = 1) -> None:
        """`passes` shuffled passes over `counts` plus the reference (`reference_visits` times in each)."""
        self.measure_units([(n,) for n in counts], passes, reference_visits)

    def measure_units(self, units: list[Unit], passes: int, reference_visits: int = 1) -> None:
        """`passes` shuffled passes over `units` plus the reference (`reference_visits` times in each), each unit's
        counts back to back, reversed every other pass; a replay goes on without the units it cannot serve
        (`TraceExhausted` when none)."""
        asked = sorted(u for u in set(units) if u != (self.reference,))
        members = asked + [(self.reference,)] * reference_visits
        for p in range(passes):
            members = [u for u in members if all(self.measuring.can_visit(n) for n in u)]
            if asked and not any(u != (self.reference,) for u in members):
                counts = ", ".join(str(n) for n in sorted({n for u in asked for n in u}))
                raise TraceExhausted.of(counts)
            ordered = [members[i][:: 1 if p % 2 == 0 else -1] for i in self.rng.permutation(len(members))]
            pass_index = self.new_pass()
            self.measuring.begin_pass(pass_index, [n for unit in ordered for n in unit])
            for unit in ordered:
                if len(unit) > 1:
                    self.measuring.begin_unit(pass_index, unit)
                self.design.extend(self.visit(n) for n in unit)

    def paired_round(self, order: tuple[int, int]) -> dict[int, Visit]:
        """One paired round: the two counts visited back to back in `order`, in a pass of their own."""
        self.measuring.begin_pass(self.new_pass(), order)
        taken = {n: self.visit(n) for n in order}
        self.paired.extend(taken.values())
        return taken

    def close(self) -> None:
        self._bar.close()


__all__ = ["BudgetSpent", "Measurer", "aligned_units", "anchor_pairs", "chained_units", "checked_grid",
           "coarse_units", "design_rounds", "token_grid"]
