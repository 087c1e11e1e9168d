"""Power passes on replays: when they come first, where they go, and when they stop (no timing)."""

from pomt.measurement.design import Measurer
from pomt.measurement.drift import pool_visits
from pomt.measurement.power import cheap_pass, power_passes
from pomt.measurement.sources import ReplaySource, Session
from pomt.measurement.windows import WINDOW_COUNTS, scan_visits

from trace_data import N, linear_levels, synthetic_trace

GRID = list(range(2, N + 1))
REACH = (N - 48, N)


def test_power_passes_come_first_only_where_a_pass_over_the_reach_is_cheap():
    """A policy's narrow reach: a pass over it costs less than half the budget, so the windows get their visits
    before the candidates' paired rounds; a reach over the whole grid would spend the budget in one pass."""
    assert cheap_pass(GRID, REACH, 235)
    assert not cheap_pass(GRID, (GRID[0], N), 235)
    assert not cheap_pass(GRID, REACH, 80)  # little budget left: the candidates first


def passes(budget, target_pct, reserve):
    measurer = Measurer(Session(ReplaySource(synthetic_trace(linear_levels(), passes=16, noise=0.05))), N,
                        budget=budget, progress=False)
    measurer.measure_passes(list(range(REACH[0], N, 4)), 2)  # a coarse scan

    def scan():
        visits = measurer.visits()
        return scan_visits(visits, pool_visits(visits, N), [], REACH, alpha=0.01, min_step=0.03)

    return measurer, power_passes(measurer, GRID, REACH, target_pct, reserve, scan)


def test_passes_stop_at_the_target_and_leave_the_reserve():
    measurer, found = passes(None, 99.0, 0)  # the coarse scan already reaches a 99% target
    assert len(measurer.visits()) == 2 * (len(range(REACH[0], N, 4)) + 1) and found.limit_pct <= 99.0
    measurer, found = passes(200, 1.0, 40)  # an unreachable target: the budget stops them
    spent = len(measurer.visits())
    assert spent <= 200 - 40 and 200 - 40 - spent < WINDOW_COUNTS + 1
    assert {v.tokens for v in measurer.visits()} >= set(range(REACH[0], N + 1))  # every count within reach
