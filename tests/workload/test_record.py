"""The dense design of `pomt record` on a replayed device (no timing): every count in every pass, pairs back to
back as a replay must serve them (the end-to-end recording is in test_offline.py)."""

import pytest

from pomt.errors import GridError
from pomt.measurement.design import chained_units
from pomt.measurement.sources import MeasurementRun, ReplaySource
from pomt.workload.record import RecordSettings, dense_trace

from support.trace_data import N, linear_levels, synthetic_trace


def test_a_chained_recording_puts_every_two_neighbours_back_to_back_in_half_the_passes_both_ways():
    trace = synthetic_trace(linear_levels(), passes=32, noise=0.01)
    grid = list(range(150, N + 1))
    settings = RecordSettings(passes=4, reference_visits=2, chain=True)
    visits, _ = dense_trace(MeasurementRun(ReplaySource(trace)), grid, N, settings, progress=False)
    for number in range(4):
        units = chained_units(grid, number)
        assert sorted(n for unit in units for n in unit) == grid  # every count once a pass
    adjacent: dict[tuple[int, int], list[int]] = {}
    for a, b in zip(visits, visits[1:], strict=False):
        if a.pass_index == b.pass_index and abs(a.tokens - b.tokens) == 1:
            adjacent.setdefault((min(a.tokens, b.tokens), max(a.tokens, b.tokens)), []).append(b.tokens - a.tokens)
    for low, high in zip(grid, grid[1:], strict=False):  # by the design, not by chance of the shuffle
        assert (low, high) in adjacent and {1, -1} <= set(adjacent[(low, high)])
    assert sum(v.tokens == N for v in visits) >= 4 * 2  # the reference in every pass, as often as asked


def test_an_aligned_recording_visits_each_edge_back_to_back_in_alternating_order():
    trace = synthetic_trace(linear_levels(), passes=32, noise=0.01)
    grid = list(range(150, N + 1))
    settings = RecordSettings(passes=4, reference_visits=3)
    visits, reps = dense_trace(MeasurementRun(ReplaySource(trace)), grid, N, settings,
                               seed=1, progress=False)
    assert reps == 3  # the replayed trace's own
    assert len(visits) == 4 * (len(grid) - 1 + 3)  # every count in every pass, N three times
    for p in range(1, 5):
        order = [v.tokens for v in visits if v.pass_index == p]
        for n in range(152, N, 8):
            i = order.index(n)
            assert order[i - 1 if p % 2 == 1 else i + 1] == n - 1  # A B in the first pass, B A in the next


def test_a_grid_without_the_reference_is_refused():
    trace = synthetic_trace(linear_levels(), passes=2)
    with pytest.raises(GridError, match="reference"):
        dense_trace(MeasurementRun(ReplaySource(trace)), [150, 151], N, RecordSettings(), progress=False)
