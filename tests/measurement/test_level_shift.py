"""Level-shift tests over a window (pomt.measurement.level_shift), on synthetic windows with known truth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pomt.measurement.level_shift import (
    SCATTER_ALPHA,
    WindowVisits,
    detectable_jump,
    detection_limit_pct,
    fit_jump,
    level_shift,
    visits_factor,
)

COUNTS = list(range(150, 180, 2))
ALPHA = 0.01


def window(rng, *, noise=0.02, visits=3, tau=0.0, drop_pct=0.0, at=165, counts=COUNTS, slope=0.004):
    """Log latencies of a line through `counts`, the counts from `at` up slower by the given drop (the low side
    `drop_pct` % faster), count-level wiggles of SD `tau`, per-visit noise `noise`."""
    jump = -math.log(1.0 - drop_pct / 100.0)
    wiggle = {n: rng.normal(0.0, tau) for n in counts}
    tokens, values = [], []
    for n in counts:
        for _ in range(visits):
            tokens.append(n)
            values.append(slope * n + wiggle[n] + (jump if n >= at else 0.0) + rng.normal(0.0, noise))
    return WindowVisits.of(tokens, values, noise**2)


def test_a_clear_drop_is_found_where_it_is_with_its_size():
    shift = level_shift(window(np.random.default_rng(0), drop_pct=10.0))
    assert shift.best.position == 166 and shift.best.low == 164  # the first measured count at or above 165
    assert shift.p_value < 1e-6
    low, high = shift.interval_pct()
    assert low < 10.0 < high and shift.saving_pct > 0


def test_a_rise_is_a_jump_of_the_other_sign():
    shift = level_shift(window(np.random.default_rng(1), drop_pct=-8.0))
    assert shift.best.position == 166 and shift.p_value < ALPHA / 5 and shift.saving_pct < 0


@pytest.mark.parametrize("line", [True, False])
@pytest.mark.parametrize("noise, visits, tau", [(0.08, 3, 0.0), (0.015, 3, 0.0), (0.015, 3, 0.02)])
def test_without_a_step_the_false_step_rate_is_the_test_level(noise, visits, tau, line):
    rng = np.random.default_rng(2)
    slope = 0.004 if line else 0.0  # without a line of its own the window is handed trend-free values
    false = sum(level_shift(window(rng, noise=noise, visits=visits, tau=tau, slope=slope), line=line).p_value < ALPHA
                for _ in range(200))
    assert false <= 6  # 2 expected at ALPHA over 200 windows; a miscalibrated test gives tens


def test_a_level_without_a_slope_pins_the_jump_about_twice_as_well():
    flat = window(np.random.default_rng(8), slope=0.0)
    assert fit_jump(flat, 166, line=False).se < 0.6 * fit_jump(flat, 166).se


def test_one_visit_hit_by_interference_is_left_out():
    clean = window(np.random.default_rng(3))
    values = clean.values.copy()
    values[np.flatnonzero(clean.tokens == 170)[0]] += math.log(1.6)  # one visit 60% slow
    hit = WindowVisits(clean.tokens, values, clean.variances)
    assert fit_jump(hit, 170).dropped == 1
    assert level_shift(hit).p_value > ALPHA


def test_counts_that_scatter_more_than_the_noise_widen_the_test():
    rng = np.random.default_rng(4)
    steady = fit_jump(window(rng, noise=0.01), 166)
    wiggly = fit_jump(window(rng, noise=0.01, tau=0.03), 166)
    assert steady.tau == 0.0 or steady.tau < 0.01
    assert wiggly.tau > 0.015 and wiggly.se > 2 * steady.se


def test_a_stated_detection_limit_is_honest_and_shrinks_with_visits():
    rng = np.random.default_rng(5)
    limit = max(detection_limit_pct(window(rng, noise=0.08), ALPHA, min_step=0.03).values())
    more = max(detection_limit_pct(window(rng, noise=0.08, visits=12), ALPHA, min_step=0.03).values())
    assert more < 0.7 * limit
    found = 0
    for _ in range(100):  # a step of the stated size, anywhere in the window's middle
        shift = level_shift(window(rng, noise=0.08, drop_pct=limit, at=int(rng.integers(158, 172))))
        found += shift.p_value < ALPHA
    assert found >= 70  # the limit is stated for 80% power


def test_the_limit_never_reads_below_the_smallest_step_reported():
    limits = detection_limit_pct(window(np.random.default_rng(6), noise=0.001, visits=20), ALPHA, min_step=0.03)
    assert limits and min(limits.values()) == pytest.approx(3.0)


def test_a_window_too_small_for_a_jump_gives_no_verdict():
    small = window(np.random.default_rng(7), counts=[160, 162, 164])
    assert level_shift(small) is None and detection_limit_pct(small, ALPHA, 0.03) == {}


def test_counts_that_scatter_are_told_from_plain_noise_by_their_visits_own_spread():
    """At two visits a count the run's noise model reads low and Paule-Mandel finds some tau in plain noise; the
    analysis of variance on the visits' own spread calls that scatter about as often as its level says."""
    rng = np.random.default_rng(7)
    plain = [fit_jump(window(rng, noise=0.08, visits=2), 166) for _ in range(100)]
    assert sum(f.tau > 0 for f in plain) > 20  # chance reads scatter into plain noise
    assert sum(f.scatter_p < SCATTER_ALPHA for f in plain) <= 5
    wiggly = [fit_jump(window(rng, noise=0.05, visits=2, tau=0.08), 166) for _ in range(20)]
    assert sum(f.scatter_p < SCATTER_ALPHA and f.se_floor > 0 for f in wiggly) >= 16  # 8% scatter, 5% noise


def test_the_visits_a_target_needs_bring_the_limit_to_it_and_scatter_keeps_it_out_of_reach():
    rng = np.random.default_rng(8)
    fit = fit_jump(window(rng, noise=0.06, visits=2), 166)
    target = 100.0 * (1.0 - math.exp(-0.5 * detectable_jump(fit, ALPHA, 10)))  # half the jump it can show now
    factor = visits_factor(fit, ALPHA, 10, target, scattered=False)
    assert 3.0 < factor < 5.0  # about four: the jump's standard error falls as one over the root of the visits
    more = [fit_jump(window(rng, noise=0.06, visits=math.ceil(2 * factor)), 166) for _ in range(20)]
    reached = [100.0 * (1.0 - math.exp(-detectable_jump(f, ALPHA, 10))) for f in more]
    assert 0.8 * target < float(np.median(reached)) < 1.2 * target
    assert visits_factor(fit, ALPHA, 10, 2 * target, scattered=False) == 1.0  # a target it already reaches
    wiggly = fit_jump(window(rng, noise=0.05, visits=2, tau=0.08), 166)
    assert wiggly.scatter_p < SCATTER_ALPHA and visits_factor(wiggly, ALPHA, 10, 5.0, scattered=True) == math.inf
    assert visits_factor(wiggly, ALPHA, 10, 5.0, scattered=False) < math.inf  # where the window shows no scatter
