"""Pooling on a drifting machine, on traces with a known curve and known drift."""

import math

import numpy as np
import pytest

from pomt.formats.curve import CurvePoint
from pomt.formats.trace import Visit
from pomt.measurement.drift import (
    MEDIAN_SE,
    Drift,
    corrected_values,
    drift,
    drift_profile,
    pool_visits,
    reconcile_levels,
    relative_noise,
    visit_noise,
)

from support.trace_data import N, linear_levels, slow_drift, synthetic_trace


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


def test_visit_noise_is_unbiased_at_three_visits_a_count_where_relative_noise_reads_low():
    """Three visits a count, as the coarse scan takes: the gate of the power passes needs the noise itself."""
    trace = synthetic_trace(linear_levels(), passes=3, reps=1, drift=lambda t: 1.0, noise=0.05)
    values = corrected_values(trace.visits)
    assert visit_noise(values) == pytest.approx(0.05, rel=0.15)
    assert relative_noise(values) < 0.8 * visit_noise(values)


def test_drift_reports_the_reference_per_pass_in_time_order():
    trace = synthetic_trace(linear_levels(), counts=[2, N], passes=4, drift=lambda t: 1.0 + t, noise=0.0)
    seen = drift(trace.visits, N)
    assert seen.reference_tokens == N
    assert list(seen.reference_ms) == sorted(seen.reference_ms)  # the machine slowed down steadily
    assert seen.max_over_min == pytest.approx(seen.reference_ms[-1] / seen.reference_ms[0])
    assert drift(trace.visits[:2], N) is None


def test_one_disturbed_pass_is_named_beside_the_drift_it_makes():
    # seven passes within 10%, one read while another process ran
    seen = Drift(197, 1277.69 / 504.94, (510.0, 504.94, 1277.69, 530.0, 555.0, 520.0, 515.0, 540.0))
    assert seen.one_pass == (pytest.approx(555.0 / 504.94), "slowest")
    assert seen.one_pass_words() == ", 1.10 without its slowest pass"
    assert seen.to_dict()["max_over_min_but_one"] == pytest.approx(1.0992, abs=1e-4)
    assert seen.to_dict()["left_out"] == "slowest"
    fast_blip = Drift(197, 1.5, (600.0, 610.0, 400.0, 590.0, 605.0))
    assert fast_blip.one_pass[1] == "fastest"


@pytest.mark.parametrize("reference_ms", [
    (500.0, 560.0, 620.0, 680.0, 750.0),  # a machine that slows down steadily: every pass makes the drift
    (500.0, 505.0, 520.0),  # 4%: too small to look for a disturbed pass
    (500.0, 900.0),  # two passes: nothing to compare a pass with
])
def test_a_drift_that_no_single_pass_makes_is_reported_whole(reference_ms):
    seen = Drift(197, max(reference_ms) / min(reference_ms), reference_ms)
    assert seen.one_pass is None
    assert seen.one_pass_words() == ""
    assert "left_out" not in seen.to_dict()


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
