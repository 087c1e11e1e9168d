"""The frontier of (predicted latency, accuracy) and the choices made on it."""

import pytest

from pomt.choice.binomial import Proportion
from pomt.choice.candidates import Candidate
from pomt.choice.pareto import Evaluated, fastest_within_drop, most_accurate_within, pareto_front
from pomt.errors import PolicyError


def point(ms: float, correct: int, remove: int = 1) -> Evaluated:
    return Evaluated(Candidate.of("pomt", {0: remove}), "test", ms, Proportion(correct, 1000))


POINTS = [point(10.0, 900, 0), point(9.0, 895, 1), point(8.0, 880, 2), point(8.5, 870, 3), point(7.0, 850, 4),
          point(7.0, 860, 5)]


def test_the_frontier_keeps_what_nothing_beats_fastest_first():
    assert [p.candidate.as_dict() for p in pareto_front(POINTS)] == [{0: 5}, {0: 2}, {0: 1}, {}]


def test_fastest_within_a_drop_of_the_unpruned_model():
    assert fastest_within_drop(POINTS, 0.9, 1.0).predicted_ms == 9.0
    assert fastest_within_drop(POINTS, 0.9, 2.0).predicted_ms == 8.0
    assert fastest_within_drop(POINTS, 0.9, 5.0).candidate.as_dict() == {0: 5}  # equal latency: more accurate
    with pytest.raises(PolicyError, match="reaches accuracy 0.95"):
        fastest_within_drop(POINTS, 0.9, 5.0, min_accuracy=0.95)
    with pytest.raises(PolicyError, match="within 1 points"):
        fastest_within_drop(POINTS[2:], 0.9, 1.0)


def test_most_accurate_within_a_latency_budget():
    assert most_accurate_within(POINTS, 8.6).predicted_ms == 8.0
    assert most_accurate_within(POINTS, 7.5, min_accuracy=0.86).candidate.as_dict() == {0: 5}
    with pytest.raises(PolicyError, match="fastest is predicted at 7 ms"):
        most_accurate_within(POINTS, 6.0)


def test_an_evaluated_schedule_reports_both_splits():
    record = point(9.0, 895).with_held_out(Proportion(440, 500)).to_dict()
    assert record["removal"] == {"0": 1} and record["search"]["accuracy"] == 0.895
    assert record["held_out"]["images"] == 500
