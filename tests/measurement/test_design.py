"""The measurement design on small grids: which counts, in which order, and the Measurer that visits them."""

import math

import pytest

from pomt.errors import GridError
from pomt.formats.trace import Visit
from pomt.measurement.design import (
    BudgetSpent,
    Measurer,
    aligned_units,
    anchor_pairs,
    chained_units,
    checked_grid,
    coarse_units,
    design_rounds,
    token_grid,
)
from pomt.measurement.sources import MeasurementRun, ReplaySource, TraceExhausted

from support.trace_data import N, linear_levels, synthetic_trace

SMALL = list(range(2, 41))  # 39 counts, reference 40


def test_token_grid():
    assert token_grid(197, 2, 1, min_tokens=2, max_tokens=197) == list(range(2, 198))
    grid = token_grid(197, 2, 50, min_tokens=2, max_tokens=197)
    assert grid == [2, 47, 97, 147, 197]  # counted down from the start, both ends kept
    assert token_grid(2, 197, 50, min_tokens=2, max_tokens=197) == [2, 52, 102, 152, 197]
    assert token_grid(100, 100, 1, min_tokens=2, max_tokens=197) == [100]


@pytest.mark.parametrize(("start", "stop", "stride"), [(198, 2, 1), (197, 1, 1), (197, 2, 0)])
def test_token_grid_errors(start, stop, stride):
    with pytest.raises(GridError, match=r"\[2, 197\]|stride"):
        token_grid(start, stop, stride, min_tokens=2, max_tokens=197)


def test_a_grid_is_sorted_once_each_and_holds_the_reference():
    assert checked_grid([40, 3, 2, 3], 40) == [2, 3, 40]
    with pytest.raises(GridError, match="empty"):
        checked_grid([], 40)
    with pytest.raises(GridError, match="reference"):
        checked_grid([2, 3], 40)


def test_anchor_pairs_are_the_aligned_edges_below_the_reference():
    assert anchor_pairs(SMALL, 40, 8) == [(7, 8), (15, 16), (23, 24), (31, 32)]  # 40 is the reference
    assert anchor_pairs(SMALL, 40, 0) == [] and anchor_pairs(SMALL, 40, 1) == []
    assert anchor_pairs([2, 8, 15, 16, 40], 40, 8) == [(15, 16)]  # 7 is not on the grid


def test_the_coarse_scan_is_strided_without_anchors_and_pairs_them_with_anchors():
    assert coarse_units(SMALL, [], 10, sparse_below=False) == [(2,), (12,), (22,), (32,), (40,)]
    assert coarse_units(SMALL, [], None, sparse_below=False)[:3] == [(2,), (8,), (14,)]  # stride sqrt(39) = 6
    anchors = anchor_pairs(SMALL, 40, 8)
    assert coarse_units(SMALL, anchors, 10, sparse_below=False) == [*anchors, (2,), (40,)]  # and the ends
    within = anchors[2:]  # a reach from 23 up: below it every 10th count from the first anchor down
    assert coarse_units(SMALL, within, 10, sparse_below=True) == [*within, (2,), (12,), (22,), (40,)]


def test_aligned_units_visit_every_count_once_with_the_edges_as_pairs():
    units = aligned_units(SMALL, 40, 8)
    assert units[:4] == anchor_pairs(SMALL, 40, 8)
    assert sorted(n for unit in units for n in unit) == SMALL


@pytest.mark.parametrize("number", range(4))
def test_a_chained_pass_visits_every_count_once(number):
    units = chained_units(SMALL, number)
    assert sorted(n for unit in units for n in unit) == SMALL
    pairs = [unit for unit in units if len(unit) == 2]
    assert all(abs(a - b) == 1 for a, b in pairs)
    assert all((a < b) == (number in (0, 1)) for a, b in pairs)  # ascending in passes 0 and 1, then descending


def visit(tokens, pass_index, t_s=0.0):
    return Visit(tokens, pass_index, t_s, (1.0,))


def test_design_rounds_are_the_pairs_visited_back_to_back_in_one_pass():
    design = [visit(7, 1), visit(8, 1), visit(3, 1), visit(8, 2), visit(7, 2), visit(7, 3), visit(3, 3),
              visit(8, 3), visit(8, 4), visit(7, 5)]  # the last two are back to back but in different passes
    rounds = design_rounds(design, 7, 8)
    assert [(a.pass_index, b.pass_index) for a, b in rounds] == [(1, 1), (2, 2)]
    assert all(a.tokens == 7 and b.tokens == 8 for a, b in rounds)  # always (low, high)


def replay(passes=32):
    return MeasurementRun(ReplaySource(synthetic_trace(linear_levels(), passes=passes, noise=0.01)))


def test_a_unit_of_two_counts_is_a_round_in_every_pass_in_alternating_order():
    measurer = Measurer(replay(), N, seed=0, progress=False)
    measurer.measure_units([(7, 8), (20,), (N,)], 4)
    assert [v.tokens == N for v in measurer.design].count(True) == 4  # the reference once a pass, no more
    rounds = design_rounds(measurer.design, 7, 8)
    order = {id(v): i for i, v in enumerate(measurer.design)}
    assert [order[id(b)] - order[id(a)] for a, b in rounds] == [1, -1, 1, -1]  # A B, B A, ...
    assert measurer.visits() == measurer.design and measurer.left() == math.inf


def test_paired_rounds_are_kept_apart_from_the_design_and_the_budget_stops_visits():
    measurer = Measurer(replay(), N, seed=0, budget=5, progress=False)
    measurer.measure_passes([30], 1)  # 30 and the reference
    taken = measurer.paired_round((31, 30))
    assert list(taken) == [31, 30] and taken[31].pass_index == taken[30].pass_index
    assert measurer.paired == [taken[31], taken[30]] and len(measurer.visits()) == 4
    assert measurer.left() == 1
    measurer.visit(30)
    with pytest.raises(BudgetSpent):
        measurer.visit(30)


def test_a_replay_serves_its_own_reps_and_a_setting_wins():
    measurer = Measurer(replay(), N, progress=False)
    measurer.calibrate(None, 0.1)
    assert measurer.reps == 3 and measurer.visits() == []  # the trace's own, nothing visited
    measurer.calibrate(5, 0.1)
    assert measurer.reps == 5


def test_a_pass_goes_on_without_the_counts_a_replay_has_used_up_and_stops_when_none_are_left():
    source = ReplaySource(synthetic_trace(linear_levels(), passes=2))
    measurer = Measurer(MeasurementRun(source), N, seed=0, progress=False)
    measurer.measure_passes([30, 31], 2)  # both recorded visits of 30 and 31 served
    measurer.measure_passes([30, 31, 32], 1)
    assert [v.tokens for v in measurer.design].count(32) == 1  # 32 visited, 30 and 31 left out, no error
    assert [v.tokens for v in measurer.design].count(30) == 2
    with pytest.raises(TraceExhausted, match="30, 31 tokens"):
        measurer.measure_passes([30, 31], 1)
