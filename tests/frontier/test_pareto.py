"""The frontier of (predicted latency, accuracy), and whether a schedule meets an accuracy goal."""

from pomt.frontier.candidates import Candidate
from pomt.frontier.choice import Evaluated, accuracy_at_least, drop_within, pareto_front
from pomt.stats import Proportion


def point(ms: float, correct: int, remove: int = 1) -> Evaluated:
    return Evaluated(Candidate.of("pomt", {0: remove}), "test", ms, Proportion(correct, 1000))


POINTS = [point(10.0, 900, 0), point(9.0, 895, 1), point(8.0, 880, 2), point(8.5, 870, 3), point(7.0, 850, 4),
          point(7.0, 860, 5)]


def test_the_frontier_keeps_what_nothing_beats_fastest_first():
    assert [p.candidate.as_dict() for p in pareto_front(POINTS)] == [{0: 5}, {0: 2}, {0: 1}, {}]


def paired(correct: int, lost: int, gained: int, images: int = 400) -> Evaluated:
    return Evaluated(Candidate.of("tome", {0: 2}), "test", 5.0, Proportion(correct, images, lost, gained))


def test_a_drop_is_judged_on_its_bound_where_measured_paired():
    # both measured 0.5 points below an unpruned 0.8 on 400 images: 2 net images lost
    few = paired(318, lost=2, gained=0)  # changed 2 images
    many = paired(318, lost=21, gained=19)  # changed 40: the same net loss is far less certain
    assert drop_within(few, 0.8, 1.0, 0.5) and drop_within(many, 0.8, 1.0, 0.5)  # 0.5: the measured drop
    assert drop_within(few, 0.8, 1.25, 0.95) and not drop_within(few, 0.8, 1.2, 0.95)  # bound 1.22 points
    assert not drop_within(many, 0.8, 3.1, 0.95) and drop_within(many, 0.8, 3.15, 0.95)  # bound 3.12 points


def test_without_pairing_the_measured_drop_decides():
    assert drop_within(POINTS[2], 0.9, 2.0, 0.95) and not drop_within(POINTS[2], 0.9, 1.9, 0.95)


def test_a_floor_on_accuracy_is_judged_on_the_lower_bound():
    assert accuracy_at_least(POINTS[1], 0.895, 0.5)
    assert not accuracy_at_least(POINTS[1], 0.895, 0.95)
    assert accuracy_at_least(POINTS[1], 0.87, 0.95)  # the one-sided 95% bound of 895 of 1000 is 0.878


def test_an_evaluated_schedule_reports_both_splits():
    record = point(9.0, 895).with_held_out(Proportion(440, 500)).to_dict()
    assert record["removal"] == {"0": 1} and record["search"]["accuracy"] == 0.895
    assert record["held_out"]["images"] == 500
