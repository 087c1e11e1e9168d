"""Wilson intervals of measured accuracies."""

import pytest

from pomt.choice.binomial import Proportion, half_width, trials_for_half_width, wilson_interval


def test_wilson_matches_the_textbook_values():
    # reference values: statsmodels' proportion_confint(method="wilson")
    assert wilson_interval(90, 100) == pytest.approx((0.825634, 0.944771), abs=1e-6)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson_interval(10, 10) == pytest.approx((0.722467, 1.0), abs=1e-6)
    assert wilson_interval(5, 10, confidence=0.9) == pytest.approx((0.2692, 0.7308), abs=1e-4)


def test_no_trials_is_no_information_and_bad_counts_are_refused():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    with pytest.raises(ValueError):
        wilson_interval(1, 10, confidence=1.0)


def test_trials_for_half_width_is_the_fewest_that_reach_it():
    for accuracy, width in [(0.9, 0.01), (0.99, 0.005), (0.5, 0.05)]:
        trials = trials_for_half_width(accuracy, width)
        assert half_width(accuracy, trials) <= width
        assert half_width(accuracy, trials - 1) > width or trials == 1


def test_a_proportion_reports_its_interval():
    record = Proportion(45, 50).to_dict()
    assert record["accuracy"] == 0.9 and record["images"] == 50 and record["correct"] == 45
    low, high = record["ci"]
    assert low < 0.9 < high
