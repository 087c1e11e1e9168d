"""Candidate steps on small synthetic curves: detection, order of examination, and what each needs next."""

import numpy as np
import pytest

from pomt.formats.curve import CurvePoint
from pomt.formats.trace import Visit
from pomt.measurement.candidates import (
    Candidate,
    detected,
    level_change,
    next_counts,
    ranked,
    sharpest,
    unmeasured_inside,
    unsettled,
)
from pomt.measurement.confirmation import accepted
from pomt.measurement.paired import paired_effect


def curve(levels, counts, se=0.002):
    return [CurvePoint(n, levels(n), levels(n), 1.0, 0.0, levels(n), 3, 9, se * levels(n)) for n in counts]


def line(n):
    return 5.0 + 0.1 * n


def stepped(n):
    return line(n) * (1.1 if n > 100 else 1.0)


def verdict(low, high, ratio):
    """An accepted step between low and high whose paired rounds read `ratio` (low over high)."""
    return accepted(low, high, paired_effect(np.ones(3), np.full(3, ratio)), 3, 5.0)


def test_a_candidate_names_its_span():
    assert Candidate(100, 101, 4.0).span == (100, 101)


def test_the_detector_sees_a_planted_step_and_a_confirmed_one_is_taken_out():
    points = curve(stepped, range(80, 121, 2))
    (found,) = detected(points, 3.0, [])
    assert found.low <= 100 < found.high and found.z > 3.0
    assert detected(points, 3.0, [verdict(100, 102, 1 / 1.1)]) == []
    assert detected(points[:3], 3.0, []) == []  # too few points to see anything


def test_candidates_within_reach_and_open_edges_go_first_then_the_most_significant():
    edge = Candidate(31, 32, 3.5)
    found = [Candidate(10, 12, 9.0), Candidate(150, 152, 4.0), Candidate(160, 162, 8.0), Candidate(160, 162, 3.1)]
    order = ranked([edge, *found], {edge.span}, reach=100)
    assert order == [Candidate(160, 162, 8.0), Candidate(150, 152, 4.0), edge, Candidate(10, 12, 9.0)]
    assert ranked([edge, *found], {edge.span}, reach=0)[0] == edge  # everything within reach: the edge first


def test_a_candidate_ending_at_a_confirmed_step_is_trimmed_to_its_other_side():
    points = curve(lambda n: stepped(n) * (1.1 if n > 110 else 1.0), range(80, 141, 2))
    confirmed = verdict(110, 112, 1 / 1.1)
    spans = [c.span for c in detected(points, 3.0, [confirmed])]
    assert spans and all(not (low < 111 < high) for low, high in spans)  # nothing spans the confirmed step


def test_the_sharpest_part_of_a_wide_candidate_is_judged_first():
    points = curve(stepped, range(96, 105, 2))
    assert sharpest(points, 96, 104, min_step=0.03) == (100, 102)
    assert level_change(points, 100, 102)[0] == pytest.approx(1 / 1.1 - 1, abs=0.002)
    assert sharpest(points, 96, 104, min_step=0.2) == (96, 104)  # no part alone reaches the minimum: judged whole
    assert sharpest(points, 100, 102, min_step=0.03) == (100, 102)


def visits(counts):
    return [Visit(n, 1, float(i), (1.0,)) for i, n in enumerate(counts)]


def test_a_candidate_is_bisected_then_settled_then_ready():
    grid = list(range(90, 111))
    seen = visits([90, 100, 110])
    assert unmeasured_inside(grid, seen, 90, 110) == list(range(91, 100)) + list(range(101, 110))
    assert next_counts(grid, seen, 90, 100) == [95]  # the middle unmeasured count
    seen = visits([90, 99, 100, 110])
    assert next_counts(grid, seen, 99, 100) == [90, 99, 100, 110]  # its counts and its neighbours, too few visits
    seen = visits([90, 90, 99, 99, 99, 100, 100, 100, 110])
    assert unsettled(seen, 99, 100) == [110]
    assert next_counts(grid, [*seen, *visits([110])], 99, 100) == []  # ready for its verdict
