"""Pooling on a drifting machine and paired effects, on traces with a known curve and known drift."""

import math

import numpy as np
import pytest

from pomt.formats.trace import Visit
from pomt.measurement.stats import (
    MEDIAN_SE,
    CurvePoint,
    corrected_values,
    drift,
    drift_profile,
    paired_effect,
    pool_visits,
    pooled_pair_noise,
    reconcile_levels,
    relative_noise,
)

from trace_data import N, linear_levels, slow_drift, synthetic_trace


def test_the_drift_profile_recovers_a_known_drift():
    trace = synthetic_trace(linear_levels(), passes=6, drift=slow_drift(0.25, 40.0), noise=0.01)
    levels, g = drift_profile(trace.visits)
    truth = np.log([slow_drift(0.25, 40.0)(v.t_s) for v in trace.visits])
    estimated = g - np.median(g)
    assert np.corrcoef(estimated, truth)[0, 1] > 0.95
    offset = np.median([levels[n] - math.log(linear_levels()(n)) for n in levels])
    assert all(abs(levels[n] - offset - math.log(linear_levels()(n))) < 0.02 for n in levels)


def test_pooling_cancels_drift_that_raw_medians_keep():
    levels = linear_levels()
    trace = synthetic_trace(levels, passes=4, drift=slow_drift(0.3, 25.0), noise=0.01)
    points = pool_visits(trace.visits, N)
    scale = points[-1].latency_ms / levels(N)
    corrected = [abs(p.latency_ms / (scale * levels(p.tokens)) - 1) for p in points]
    raw = [abs(p.median_ms / (scale * levels(p.tokens)) - 1) for p in points]
    assert max(corrected) < 0.03 < max(raw)
    assert points[-1].relative == pytest.approx(1.0)
    assert all(p.se_ms > 0 and p.visits == 4 for p in points)


def test_a_count_seen_only_during_a_sudden_slowdown_carries_the_doubt_in_its_band():
    """The run's last visits come after the machine went 2.5x slower; 101 is visited only then. The drift
    correction cannot tell its level from the slowdown (half its neighbours in time read the old speed),
    so its band must cover its true level instead of a narrow band around a level 2.5x too high (make
    run's PNG once showed such a spike, 193 tokens at 2.8x, with a 1.3% band)."""
    levels = linear_levels()
    trace = synthetic_trace(levels, counts=range(2, N + 1, 5), passes=4, drift=lambda t: 1.0, noise=0.01)
    rng = np.random.default_rng(1)
    t, late = trace.visits[-1].t_s, []
    for n in [N, 101, 52, 152]:
        t += 1.0
        late.append(Visit(n, 4, t, tuple(levels(n) * 2.5 * math.exp(rng.normal(0, 0.01)) for _ in range(3))))
    points = {p.tokens: p for p in pool_visits([*trace.visits, *late], N)}
    doubtful = points[101]
    assert abs(math.log(doubtful.latency_ms / levels(101))) < 1.96 * doubtful.se_ms / doubtful.latency_ms
    assert all(points[n].se_ms / points[n].latency_ms < 0.01 for n in (N, 52, 152, 97))  # their medians hold


@pytest.mark.parametrize(("amplitude", "period_s"), [(0.3, 25.0), (0.5, 20.0)])
def test_a_smooth_drift_barely_widens_the_bands(amplitude, period_s):
    """The correction follows a smooth drift, however fast: the bands stay what the noise alone gives."""
    trace = synthetic_trace(linear_levels(), passes=4, drift=slow_drift(amplitude, period_s), noise=0.01)
    noise = relative_noise(corrected_values(trace.visits))
    points = pool_visits(trace.visits, N)
    widening = [p.se_ms / (noise * p.latency_ms * MEDIAN_SE / math.sqrt(p.visits)) for p in points]
    assert np.median(widening) < 1.15


def test_relative_noise_matches_the_simulated_noise():
    trace = synthetic_trace(linear_levels(), passes=6, reps=1, drift=lambda t: 1.0, noise=0.02)
    assert relative_noise(corrected_values(trace.visits)) == pytest.approx(0.02, rel=0.25)


def test_drift_reports_the_reference_per_pass_in_time_order():
    trace = synthetic_trace(linear_levels(), counts=[2, N], passes=4, drift=lambda t: 1.0 + t, noise=0.0)
    seen = drift(trace.visits, N)
    assert seen.reference_tokens == N
    assert list(seen.reference_ms) == sorted(seen.reference_ms)  # the machine slowed down steadily
    assert seen.max_over_min == pytest.approx(seen.reference_ms[-1] / seen.reference_ms[0])
    assert drift(trace.visits[:2], N) is None


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


def point(tokens, ms, se):
    return CurvePoint(tokens, ms, ms, 1.0, 0.0, ms, 3, 3, se)


def test_a_saved_curve_shows_across_a_tested_pair_what_its_paired_rounds_saw():
    """Pooled visits put 101 tokens 10% above 100; paired rounds measured no difference."""
    points = [point(50, 5.0, 0.05), point(100, 10.0, 0.1), point(101, 11.0, 0.11), point(197, 20.0, 0.2)]
    reconciled = reconcile_levels(points, [(100, 101, 0.0, 0.002)], reference=197)
    level = {p.tokens: p for p in reconciled}
    assert level[101].latency_ms / level[100].latency_ms == pytest.approx(1.0, abs=0.003)
    assert 10.0 < level[100].latency_ms < 11.0  # the pooled visits still set the pair's common level
    assert level[50].latency_ms == pytest.approx(5.0) and level[197].relative == pytest.approx(1.0)
    assert level[100].se_ms < 0.1  # the pair's precision carries over
    assert reconcile_levels(points, [], reference=197) == points
