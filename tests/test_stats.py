"""Wilson intervals of measured accuracies, paired drop bounds and the chance a fresh count bounds its drop."""

import math

import numpy as np
import pytest

from pomt.stats import (
    Proportion,
    chance_bound_within,
    difference_interval,
    half_width,
    largest_lost_within,
    one_sided_interval,
    paired_difference_interval,
    paired_drop_bound,
    trials_for_half_width,
    wilson_interval,
)


def test_wilson_matches_the_textbook_values():
    # reference values: statsmodels' proportion_confint(method="wilson")
    assert wilson_interval(90, 100) == pytest.approx((0.825634, 0.944771), abs=1e-6)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson_interval(10, 10) == pytest.approx((0.722467, 1.0), abs=1e-6)
    assert wilson_interval(5, 10, confidence=0.9) == pytest.approx((0.2692, 0.7308), abs=1e-4)


def test_the_interval_always_holds_the_measured_share():
    """All right or all wrong: the interval reaches 1 or 0 exactly (rounding put it an ulp short for about half of
    all counts, and the benchmark's accuracy panel refused the negative error bar that made)."""
    for trials in range(1, 400):
        assert wilson_interval(trials, trials)[1] == 1.0 and wilson_interval(0, trials)[0] == 0.0
        for successes in range(trials + 1):
            low, high = wilson_interval(successes, trials)
            assert low <= successes / trials <= high


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


def test_a_one_sided_bound_is_the_two_sided_interval_at_twice_the_tail():
    assert one_sided_interval(90, 100, 0.975) == pytest.approx(wilson_interval(90, 100, 0.95))
    assert one_sided_interval(90, 100, 0.5) == (0.9, 0.9)
    low, high = one_sided_interval(90, 100, 0.8)
    assert wilson_interval(90, 100)[0] < low < 0.9 < high < wilson_interval(90, 100)[1]
    with pytest.raises(ValueError):
        one_sided_interval(9, 10, 0.4)


def test_the_paired_drop_bound_grows_with_the_images_changed():
    # 282 of 404 right, 0.5 points below the unpruned model (2 images net), at 0.5: the measured drop
    assert paired_drop_bound(282, 2, 0, 404, 0.5) == pytest.approx(2 / 404)
    assert paired_drop_bound(282, 21, 19, 404, 0.5) == pytest.approx(2 / 404)
    # the same net loss is known far better when those 2 were all it changed than when it changed 40
    few, many = paired_drop_bound(282, 2, 0, 404, 0.95), paired_drop_bound(282, 21, 19, 404, 0.95)
    assert 2 / 404 < few < many
    assert 0 <= paired_drop_bound(282, 0, 0, 404, 0.95) < 0.5 / 100  # changed nothing: within half a point
    assert paired_drop_bound(282, 0, 10, 404, 0.95) < 0  # only gained
    with pytest.raises(ValueError):
        paired_drop_bound(282, 200, 0, 404, 0.95)


def test_with_agreement_the_drop_bound_is_one_minus_the_agreement_bound():
    # agreement: the unpruned model agrees with itself on every image, so nothing is correlated
    assert paired_drop_bound(396, 8, 0, 404, 0.95) == pytest.approx(1 - one_sided_interval(396, 404, 0.95)[0])


def test_uncorrelated_outcomes_give_the_unpaired_interval():
    # a table whose two outcomes are independent (phi = 0): 100 right/right, 100 lost, 100 gained, 100 wrong/wrong
    bound = paired_drop_bound(200, 100, 100, 400, 0.975)
    assert bound == pytest.approx(difference_interval(Proportion(200, 400), Proportion(200, 400))[1])


def test_the_paired_difference_interval_is_two_paired_bounds():
    """On the same images: a 600 right, b 598, 4 right by a alone, 2 by b alone, of 800. The paired interval
    is a fraction of the unpaired one's width (the benchmark printed [-4.7, +4.0] points for such pairs), holds
    the measured difference, is mirrored when a and b swap, and on independent outcomes is the unpaired one."""
    low, high = paired_difference_interval(600, 598, 4, 2, 800)
    unpaired = difference_interval(Proportion(600, 800), Proportion(598, 800))
    assert low < 2 / 800 < high and high - low < 0.25 * (unpaired[1] - unpaired[0])
    assert paired_difference_interval(598, 600, 2, 4, 800) == pytest.approx((-high, -low))
    assert paired_difference_interval(200, 200, 100, 100, 400) == pytest.approx(
        difference_interval(Proportion(200, 400), Proportion(200, 400)))


def test_a_paired_proportion_states_its_drop_with_a_two_sided_interval():
    record = Proportion(318, 400, lost=21, gained=19)
    low, high = record.drop_interval()
    assert low < 2 / 400 < high and high == pytest.approx(record.drop_bound(0.975))
    assert Proportion.from_dict(record.to_dict()) == record
    assert Proportion(318, 400).drop_interval() is None


def test_the_drop_floor_is_the_lower_end_of_the_interval_at_twice_the_tail():
    record = Proportion(318, 400, lost=21, gained=19)
    assert record.drop_floor(0.975) == pytest.approx(record.drop_interval(0.95)[0])
    assert record.drop_floor(0.999) < record.drop_floor(0.975) < 2 / 400 < record.drop_bound(0.975)
    assert Proportion(318, 400).drop_floor(0.99) is None


def test_a_paired_proportion_reports_what_it_changed():
    record = Proportion(318, 400, lost=21, gained=19).to_dict()
    assert record["lost"] == 21 and record["gained"] == 19
    assert "lost" not in Proportion(318, 400).to_dict() and Proportion(318, 400).drop_bound(0.95) is None


def test_images_to_bound_is_where_the_same_rates_would_meet_the_goal():
    # a search split's schedule: 12 lost, 14 gained of 404 (measured -0.50 points), bound 1.59 at 95%
    churn = Proportion(288, 404, 12, 14)
    assert churn.drop_bound(0.95) > 0.01
    needed = churn.images_to_bound(0.01, 0.95)
    assert 404 < needed < 2000

    def scaled(images: int) -> Proportion:  # the same rates on `images`
        lost, gained = round(12 * images / 404), round(14 * images / 404)
        return Proportion(round(274 * images / 404) + gained, images, lost, gained)

    assert scaled(needed).drop_bound(0.95) <= 0.01 < scaled(needed - 1).drop_bound(0.95)
    assert scaled(2 * needed).drop_bound(0.95) <= 0.01  # and the bound goes on shrinking
    assert churn.images_to_bound(0.02, 0.95) == 404  # within the goal already: its own images
    assert churn.images_to_bound(0.01, 0.5) == 404  # at 0.5 the bound is the measured drop
    assert churn.images_to_bound(0.01, 0.95, most=500) is None  # beyond what was asked for
    assert Proportion(280, 404, 10, 4).images_to_bound(0.01, 0.95) is None  # measured 1.49 points: more would show it
    assert Proportion(286, 404, 6, 2).images_to_bound(0.01, 0.95) is None  # exactly the goal: never bounded within
    assert Proportion(286, 404).images_to_bound(0.01, 0.95) is None  # not measured paired


def test_the_measured_drop_is_lost_less_gained_over_the_images():
    assert Proportion(288, 404, 12, 14).drop == pytest.approx(-2 / 404)
    assert Proportion(288, 404).drop is None


@pytest.mark.parametrize(("base", "gained", "images", "max_drop", "confidence"), [
    (800, 0, 1000, 0.01, 0.95), (800, 5, 1000, 0.01, 0.99), (1150, 3, 1200, 0.02, 0.9), (500, 40, 600, 0.05, 0.95),
])
def test_the_largest_loss_within_the_drop_sits_at_the_bounds_edge(base, gained, images, max_drop, confidence):
    lost = largest_lost_within(base, gained, images, max_drop, confidence)
    assert lost >= 0
    assert paired_drop_bound(base - lost + gained, lost, gained, images, confidence) <= max_drop
    assert paired_drop_bound(base - lost - 1 + gained, lost + 1, gained, images, confidence) > max_drop


def test_no_loss_is_within_a_drop_the_images_cannot_bound():
    assert largest_lost_within(90, 0, 100, 0.01, 0.99) == -1


@pytest.mark.parametrize(("base_rate", "lost_rate", "gained_rate", "images"), [
    (0.875, 0.005, 0.004, 1200), (0.8, 0.01, 0.003, 800), (0.95, 0.002, 0.0, 2000), (0.9, 0.02, 0.015, 600),
])
def test_the_chance_of_a_bound_within_the_drop_matches_sampled_counts(base_rate, lost_rate, gained_rate, images):
    rng = np.random.default_rng(7)
    base = round(base_rate * images)
    lost = rng.binomial(base, lost_rate / base_rate, 4000)
    gained = rng.binomial(images - base, gained_rate / (1 - base_rate), 4000)
    pairs = zip(lost.tolist(), gained.tolist(), strict=True)
    within = np.mean([paired_drop_bound(base - a + b, a, b, images, 0.99) <= 0.01 for a, b in pairs])
    chance = chance_bound_within(base_rate, lost_rate, gained_rate, images, 0.01, 0.99)
    assert abs(chance - within) <= 4 * math.sqrt(max(chance * (1 - chance), 1e-4) / 4000) + 0.005


def test_the_chance_of_a_bound_within_the_drop_grows_with_images_and_falls_with_losses():
    by_images = [chance_bound_within(0.9, 0.004, 0.002, n, 0.01, 0.99) for n in (500, 1000, 2000, 4000)]
    by_losses = [chance_bound_within(0.9, rate, 0.002, 1000, 0.01, 0.99) for rate in (0.0, 0.004, 0.008, 0.012)]
    assert by_images == sorted(by_images) and by_images[-1] > 0.9 > by_images[0]
    assert by_losses == sorted(by_losses, reverse=True) and by_losses[-1] < 0.05
    assert chance_bound_within(0.9, 0.0, 0.0, 4000, 0.01, 0.99) == pytest.approx(1.0)
