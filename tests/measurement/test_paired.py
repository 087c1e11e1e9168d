"""Paired effects: known ratios, shared drift, interference, and the pooled noise prior."""

import math

import numpy as np
import pytest

from pomt.measurement.paired import paired_effect, pooled_pair_noise


def test_a_paired_effect_finds_a_known_ratio_and_its_interval_covers_it():
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(400):
        a = 10 * np.exp(rng.normal(0, 0.01, 8))
        b = 1.1 * a * np.exp(rng.normal(0, 0.01, 8))
        effect = paired_effect(a, b)
        covered += effect.ci[0] < 1.1 < effect.ci[1]
        assert effect.p_value < 1e-5 and effect.pairs + effect.dropped == 8
    assert 0.92 <= covered / 400 <= 0.98  # a 95% interval, honestly


def test_pairing_cancels_drift_shared_by_both_sides():
    drift_factor = np.linspace(1.0, 1.6, 8)  # the machine slows by 60% during the comparison
    a = 10 * drift_factor
    b = 10.3 * drift_factor * np.exp(np.random.default_rng(1).normal(0, 0.002, 8))
    effect = paired_effect(a, b)
    assert effect.ratio == pytest.approx(1.03, abs=0.003) and effect.p_value < 1e-6


def test_the_trend_offset_is_what_the_test_judges():
    a = np.array([10.0, 10.1, 9.9, 10.0, 10.05, 9.95])
    b = a * 1.02 * np.array([1.001, 0.999, 1.0, 1.002, 0.998, 1.0])
    assert paired_effect(a, b).p_value < 1e-4
    expected = paired_effect(a, b, offset=math.log(1.02))
    assert expected.p_value > 0.5 and expected.excess == pytest.approx(1.0, abs=2e-3)


def test_a_pair_hit_by_interference_is_dropped():
    a = np.full(7, 10.0) * np.exp(np.random.default_rng(2).normal(0, 0.005, 7))
    b = 1.05 * a
    b[3] *= 3.0  # a burst hit one side of one pair
    effect = paired_effect(a, b)
    assert effect.dropped == 1 and effect.pairs == 6
    assert effect.ratio == pytest.approx(1.05, rel=1e-6)


def test_too_few_or_identical_pairs():
    assert paired_effect([1.0], [2.0]).p_value == 1.0
    same = paired_effect([1.0, 1.0, 1.0], [1.1, 1.1, 1.1])
    assert same.p_value == 0.0 and same.ci == pytest.approx((1.1, 1.1))
    with pytest.raises(ValueError):
        paired_effect([1.0, 2.0], [1.0])


def test_pooled_pair_noise_recovers_one_spread_from_many_small_pairs():
    rng = np.random.default_rng(3)
    groups = [rng.normal(0.05 * k, 0.01, 3) for k in range(40)]  # every pair its own ratio, one spread
    sd, df = pooled_pair_noise(groups)
    assert sd == pytest.approx(0.01, rel=0.3) and df == 80
    assert pooled_pair_noise([[0.1], []]) == (0.0, 0)


@pytest.mark.parametrize("sizes", [(3,), (2, 3, 4, 6, 12)])
def test_pooled_pair_noise_is_unbiased_on_groups_of_any_size(sizes):
    """Three rounds an aligned edge in the coarse scan: residuals about each group's own median read 0.58
    of the spread on groups of three, which made the paired tests look surer than they were."""
    rng = np.random.default_rng(7)
    groups = [rng.normal(rng.uniform(-0.1, 0.1), 0.02, sizes[k % len(sizes)]) for k in range(600)]
    sd, _ = pooled_pair_noise(groups)
    assert sd == pytest.approx(0.02, rel=0.08)


def test_a_pooled_prior_lends_three_rounds_the_power_of_many():
    a = np.full(3, 10.0)
    b = a * 1.05 * np.exp(np.array([0.008, -0.011, 0.004]))
    alone, helped = paired_effect(a, b), paired_effect(a, b, prior=(0.01, 40))
    assert helped.p_value < 1e-5 and alone.p_value > 1e-3
    assert helped.ci[0] < 1.05 < helped.ci[1] and helped.standard_error < 0.01
    assert helped.ratio == pytest.approx(alone.ratio)


def test_three_rounds_with_a_pooled_prior_keep_the_false_step_rate():
    """No step, three rounds a pair, the prior pooled from ten other pairs of three (an aligned edge's coarse
    rounds): the test's p < 0.05 in about 5% of pairs. With the prior read about each pair's own median
    it was 20%."""
    rng = np.random.default_rng(11)
    false_steps = 0
    for _ in range(2000):
        prior = pooled_pair_noise([rng.normal(0.0, 0.02, 3) for _ in range(10)])
        effect = paired_effect(np.ones(3), np.exp(rng.normal(0.0, 0.02, 3)), prior=prior)
        false_steps += effect.p_value < 0.05
    assert 0.02 < false_steps / 2000 < 0.08


def test_a_pair_noisier_than_the_prior_is_tested_on_its_own_rounds():
    a = np.full(3, 10.0)
    b = a * np.exp(np.array([0.0, 0.12, 0.06]))  # a spread of 6%
    narrow, agreeing = paired_effect(a, b, prior=(0.02, 40)), paired_effect(a, b, prior=(0.06, 40))
    assert narrow.dropped == 0 and narrow.p_value == pytest.approx(paired_effect(a, b).p_value)
    assert agreeing.p_value < paired_effect(a, b).p_value  # a prior that agrees lends its degrees of freedom


def test_with_a_prior_three_rounds_screen_out_one_hit_by_interference():
    a = np.full(3, 10.0)
    b = a * 1.05 * np.array([1.0, 1.002, 2.5])  # a burst hit one side of the third round
    effect = paired_effect(a, b, prior=(0.01, 40))
    assert effect.dropped == 1 and effect.pairs == 2
    assert effect.ratio == pytest.approx(1.05 * math.sqrt(1.002), rel=1e-6)
    assert paired_effect(a, b).dropped == 0  # without a prior, three rounds cannot tell
