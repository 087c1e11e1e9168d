"""Windows over the counts within reach: their partition, the shifts they find, the limits they state, when the
paired rounds back a window's shift, and the power passes on replays (when they come first, where they go, when
they stop; no timing)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from pomt.errors import GridError
from pomt.formats.trace import read_trace
from pomt.measurement.confirmation import Confirmation, rejected
from pomt.measurement.design import Measurer
from pomt.measurement.drift import corrected_values, pool_visits, relative_noise, visit_noise
from pomt.measurement.level_shift import detection_limit_pct, visits_factor
from pomt.measurement.robust import PairedEffect
from pomt.measurement.search import LatencySearch, SearchScope, SearchSettings
from pomt.measurement.sources import MeasurementRun, ReplaySource
from pomt.measurement.windows import (
    BUDGET,
    EXHAUSTED,
    MARGIN,
    NOISY_VISIT,
    WINDOW_COUNTS,
    WindowShift,
    WindowTest,
    counts_to_strengthen,
    passes_first,
    power_passes,
    scan,
    scan_visits,
    window_span,
    window_verdicts,
    window_visits,
    windows,
)
from pomt.plots import NOTE_WIDTH, offline_notes

from conftest import DATA
from support.trace_data import N, linear_levels, synthetic_trace

GRID = list(range(2, N + 1))
REACH = (N - 48, N)


def visits(counts, per_count: int, noise: float, jump_at: int | None = None, jump: float = 0.0, seed: int = 0):
    """Drift-corrected visit values with the trend divided out (as `scan_visits` hands them to `scan`): flat but
    for a drop of `jump` (fraction) below `jump_at`."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in counts:
        level = 1.0
        if jump_at is not None and n >= jump_at:
            level *= 1.0 + jump
        out[n] = (level * np.exp(rng.normal(0.0, noise, per_count))).tolist()
    return out


def test_windows_overlap_by_half_and_the_last_ends_at_the_highest_count():
    counts = list(range(100, 131))
    spans = windows(counts)
    assert all(len(s) == WINDOW_COUNTS for s in spans)
    assert spans[0][0] == 100 and spans[-1][-1] == 130
    assert spans[1][0] == spans[0][WINDOW_COUNTS // 2]
    assert windows([1, 2, 3, 4]) == []  # too few counts for any window
    assert windows(list(range(7))) == [list(range(7))]


def test_a_clear_shift_is_found_where_it_is_and_none_where_there_is_none():
    counts = list(range(150, 198))
    found = scan(visits(counts, 4, 0.02, jump_at=165, jump=0.15), (150, 197), 0.02, WindowTest(0.01, 0.03))
    assert [s.span for s in found.shifts][:1] == [(164, 165)]
    assert found.shifts[0].saving_pct == pytest.approx(100 * (1 - 1 / 1.15), abs=3.0)
    flat = scan(visits(counts, 4, 0.02, seed=1), (150, 197), 0.02, WindowTest(0.01, 0.03))
    assert flat.shifts == ()


def test_the_stated_limit_falls_with_more_visits_and_never_goes_below_the_minimum_step():
    counts = list(range(150, 198))
    few = scan(visits(counts, 2, 0.05), (150, 197), 0.05, WindowTest(0.01, 0.03)).limit_pct
    many = scan(visits(counts, 12, 0.05), (150, 197), 0.05, WindowTest(0.01, 0.03)).limit_pct
    quiet = scan(visits(counts, 12, 0.001), (150, 197), 0.001, WindowTest(0.01, 0.03)).limit_pct
    assert few > many > 3.0
    assert quiet == pytest.approx(3.0)


@pytest.mark.parametrize(("size", "share"), [(12, 0.7), (WINDOW_COUNTS, 0.9)])
def test_a_window_on_trend_free_values_needs_no_slope_of_its_own_and_sees_a_smaller_step(size, share):
    """In 12 counts a slope of the window's own doubled the jump's standard error; in the default 20 it costs
    less, but still costs."""
    counts = list(range(150, 198))
    values = visits(counts, 3, 0.05)
    own = scan(values, (150, 197), 0.05, WindowTest(0.01, 0.03, size=size)).limit_pct
    sloped = scan(values, (150, 197), 0.05, WindowTest(0.01, 0.03, size=size, line=True)).limit_pct
    assert own < share * sloped


def test_a_count_with_a_value_at_or_below_zero_is_left_out_of_the_windows():
    values = visits(list(range(150, 198)), 3, 0.02, seed=2)
    without = {n: v for n, v in values.items() if n != 170}
    values[170] = [-values[170][0], *values[170][1:]]  # a trend bent below zero divided this count
    bent = scan(values, (150, 197), 0.02, WindowTest(0.01, 0.03))
    assert bent == scan(without, (150, 197), 0.02, WindowTest(0.01, 0.03)) and bent.regions


def test_the_sentence_states_the_limit_with_no_step_and_the_target_it_missed():
    counts = list(range(150, 198))
    found = scan(visits(counts, 3, 0.05), (150, 197), 0.05, WindowTest(0.01, 0.03))
    line = found.sentence(0, target_pct=1.0)
    assert line.startswith(f"within reach (150-197 tokens), steps of {found.limit_pct:.0f}% or more would have been "
                           "found; none was")
    assert "--detect 1% not reached" in line
    assert "too few counts" in scan({}, (150, 197), 0.05, WindowTest(0.01, 0.03)).sentence(0)
    assert found.to_dict()["limit_pct"] == round(found.limit_pct, 2)


def test_the_sentence_names_the_scatter_between_counts_where_it_kept_the_target_out_of_reach():
    """A launch-bound GPU count lands in a fast or a slow host state for all its visits: its neighbours differ by
    more than a visit's noise, and a run that said only "noise 2% a visit" beside a 24% limit explained nothing.
    Counts that scatter 6% from one to the next are named with about that size; with visit noise alone only
    the budget is named."""
    counts = list(range(150, 198))
    rng = np.random.default_rng(4)
    scattered = {n: (np.exp(rng.normal(0.0, 0.06)) * np.exp(rng.normal(0.0, 0.01, 3))).tolist() for n in counts}
    found = scan(scattered, (150, 197), 0.01, WindowTest(0.01, 0.03))
    assert 3.0 < found.scatter_pct < 12.0
    assert found.shown_scatter_pct == found.scatter_pct  # more than chance: their visits' own spread says so
    assert f"the counts there scatter {found.scatter_pct:.1f}% from one to the next" in found.sentence(0, 5.0)
    assert found.to_dict()["scatter_pct"] == found.to_dict()["shown_scatter_pct"] == round(found.scatter_pct, 2)
    plain = scan(visits(counts, 2, 0.05), (150, 197), 0.05, WindowTest(0.01, 0.03))
    assert plain.scatter_pct < 0.5 * plain.noise_pct  # chance reads a little scatter into plain noise
    assert plain.shown_scatter_pct == 0.0
    assert plain.sentence(0, 1.0).endswith("(--detect 1% not reached within the visit budget; no limit is stated "
                                           "below the minimum step, 3%)")
    assert found.sentence(0, 5.0).endswith("more visits of the same counts would not reach it)")


def test_chance_scatter_in_plain_noise_at_two_visits_a_count_is_not_named():
    """10% noise, two visits a count, the run's own noise model (which reads low at two visits): Paule-Mandel's
    tau reaches half that noise in many such scans; the analysis of variance on the visits' own spread names it
    in none."""
    counts = list(range(150, 198))
    named_before = named = 0
    for seed in range(20):
        values = visits(counts, 2, 0.10, seed=seed)
        found = scan(values, (150, 197), relative_noise(values), WindowTest(0.01, 0.03))
        named_before += found.scatter_pct >= 0.5 * found.noise_pct
        named += re.search(r"scatter \d", found.sentence(0, 5.0)) is not None
    assert named_before >= 5 and named == 0


def test_the_sentence_says_about_how_many_visits_would_reach_the_target_and_as_what_budget():
    """Plain noise: the limit falls as one over the root of the visits, so the sentence names a multiple of the
    visits within reach and the --budget it takes; a scan of that many visits states about the target. It says
    "at least": where the counts' scatter is real the visits do not average it away, and counted in (as where it is
    shown) every position needs as many visits or more."""
    counts = list(range(150, 198))
    found = scan(visits(counts, 2, 0.05, seed=3), (150, 197), 0.05, WindowTest(0.01, 0.03))
    assert found.visits == 2 * len(counts) and found.limit_pct > 8.0
    factor = found.visits_factor(8.0)
    assert 1.5 < factor < 8.0
    line = found.sentence(0, 8.0, spent=(200, 1000))
    budget = (200 + (factor - 1.0) * found.visits) / 1000
    assert line.endswith(f"at least about {factor:.1f} times the 96 visits its windows tested (--budget "
                         f"{budget:.2f} or more))")
    assert found.sentence(0, 8.0, spent=(900, 1000)).endswith("more than the full grid (--budget 1) holds)")
    assert found.visits_factor(found.limit_pct + 1.0) == 1.0
    rng = np.random.default_rng(5)
    scattered = scan({n: (np.exp(rng.normal(0.0, 0.02)) * np.exp(rng.normal(0.0, 0.05, 2))).tolist() for n in counts},
                     (150, 197), 0.05, WindowTest(0.01, 0.03))
    fits = [(fit, alpha, shift.positions) for shift, alpha in scattered.profiles for fit in shift.profile]
    assert any(fit.se_floor > 0 for fit, _, _ in fits)
    assert all(visits_factor(*f, 8.0, scattered=True) >= visits_factor(*f, 8.0, scattered=False) for f in fits)
    more = [scan(visits(counts, math.ceil(2 * factor), 0.05, seed=s), (150, 197), 0.05,
                 WindowTest(0.01, 0.03)).limit_pct for s in range(10, 15)]
    assert 0.7 * 8.0 < float(np.median(more)) < 1.3 * 8.0


def test_power_passes_visit_the_regions_above_the_target_or_all_of_reach():
    grid = list(range(2, 198))
    assert counts_to_strengthen(grid, [(160, 170)], (150, 197)) == list(range(160, 171))
    assert counts_to_strengthen(grid, [], (150, 197)) == list(range(150, 198))


def paired(low: int, high: int, pct: float, p: float) -> Confirmation:
    ratio = 1.0 - pct / 100.0
    effect = PairedEffect(ratio, (ratio * 0.97, ratio * 1.03), p, 6, standard_error=0.01)
    return rejected(low, high, "not significant", 3.0, effect)


@pytest.mark.parametrize(("pct", "p", "backed"), [(8.0, 0.1, True), (8.0, 0.5, False), (-8.0, 0.1, False),
                                                  (3.0, 0.1, True), (2.3, 0.1, False), (1.0, 0.1, False)])
def test_a_shift_is_accepted_when_the_paired_rounds_back_it(pct, p, backed):
    """Same sign, p < 0.2 and at least the minimum step at the pinned pair: deit_small_bs1_amd_chained_shuffled's
    windows read a 4.5% drop between 172 and 173 where the dense record has 1.6% there and 2.6% at 174 -> 173;
    the pair's +2.3% shipped as a step of the 3% minimum."""
    shift = WindowShift(160, 168, 12.0, 1e-4, 5.0)
    verdicts = window_verdicts([shift], {(163, 164): paired(163, 164, pct, p)}, min_step=0.03)
    assert bool(verdicts) is backed
    if backed:
        (v,) = verdicts
        assert v.accepted and v.kind == "drop" and (v.low, v.high) == (163, 164)
        assert "window test" in v.reason and math.isclose(v.paired_pct, pct, abs_tol=1e-9)


@pytest.mark.parametrize("detect", [0.0, -1.0, 100.0])
def test_a_detection_target_outside_0_100_percent_is_refused(detect):
    with pytest.raises(GridError, match="--detect"):
        SearchSettings(detect=detect).check()


def test_a_position_at_one_window_s_edge_is_stated_at_the_window_that_tests_it_best():
    """The edge positions of a window (two counts on one side) lie in the middle of the next: each position's
    limit is the best window's, and every window's stated limit the largest of its positions' best: the middle
    windows state less than their own worst edge (the reach's own edges stay as they are)."""
    counts = list(range(150, 198))
    values = visits(counts, 3, 0.05)
    found = scan(values, (150, 197), 0.05, WindowTest(0.01, 0.03))
    spans = windows(counts)
    per_window = [detection_limit_pct(window_visits(values, s, 0.05), 0.01 / len(spans), 0.03, line=False)
                  for s in spans]
    best = {p: min(limits[p] for limits in per_window if p in limits) for limits in per_window for p in limits}
    assert found.limit_pct == pytest.approx(max(best.values()))
    stated = [limit for _, _, limit in found.regions]
    assert stated == pytest.approx([max(best[p] for p in limits) for limits in per_window])
    assert all(s < max(limits.values()) for s, limits in zip(stated[1:-1], per_window[1:-1], strict=True))


def test_the_widest_windows_come_first_so_that_a_pass_cut_short_strengthens_them():
    counts = list(range(150, 198))
    values = visits(counts, 2, 0.05)
    values.update(visits(range(150, 170), 8, 0.05, seed=3))  # the low counts well measured
    found = scan(values, (150, 197), 0.05, WindowTest(0.01, 0.03))
    above = found.above(0.0)
    limits = {(lo, hi): limit for lo, hi, limit in found.regions}
    assert [limits[r] for r in above] == sorted(limits.values(), reverse=True)
    order = counts_to_strengthen(counts, above, (150, 197))
    assert order[0] == above[0][0] and sorted(order) == counts


def test_the_target_missed_travels_with_the_scan_into_the_schedule_and_the_plot():
    """Once the power passes ran (`short_of`), the scan carries the target it aimed at: the sentence says it
    without being told, the schedule's detection object keeps it, and the PNG's box holds the whole sentence,
    wrapped."""
    counts = list(range(150, 198))
    found = scan(visits(counts, 2, 0.05, seed=3), (150, 197), 0.05, WindowTest(0.01, 0.03))
    assert "not reached" not in found.sentence(0) and found.to_dict()["target_pct"] is None
    short = found.short_of(5.0, BUDGET)
    line = short.sentence(0, spent=(200, 1000))
    assert line == found.sentence(0, 5.0, spent=(200, 1000))
    assert "(--detect 5% not reached within the visit budget" in line
    assert short.to_dict()["target_pct"] == 5.0 and short.to_dict()["stopped"] == BUDGET
    box = offline_notes([], 0, 0, detection=line)
    wrapped = box[1:]
    assert len(wrapped) > 1 and all(len(row) <= NOTE_WIDTH for row in wrapped)
    assert " ".join(row.strip() for row in wrapped) == line
    reached = found.short_of(found.limit_pct + 1.0, BUDGET)
    assert reached.stopped == "" and "not reached" not in reached.sentence(0)


def test_the_windows_take_in_the_counts_below_the_reach_so_that_its_low_edge_has_two_sides():
    """A step just inside the reach's low edge (150 -> 149, the reach 149-197) was never tested with the reach's own
    counts alone (a jump needs two counts each side), the next positions had two or three counts below them, and that
    edge set the run's limit (the noisy deit_tiny_bs4 replay at --budget 0.4: 18.7% at 152 where the windows' middles
    read 9-12%). With the MARGIN grid counts below the reach in the windows it is found where it is, and the edge's
    limits are about a middle's; jumps are still tried only where landing below them keeps a count within reach. The
    lowest and highest regions reach the ends of those counts, measured or not, so the power passes visit them."""
    assert window_span(list(range(2, 198)), (149, 197)) == (149 - MARGIN, 197)
    assert window_span(list(range(2, 198)), (5, 197)) == (2, 197)  # the grid ends first
    assert window_span(list(range(2, 198)), (2, 197)) == (2, 197)
    counts = list(range(149 - MARGIN, 198))
    values = visits(counts, 3, 0.04, jump_at=150, jump=0.12, seed=2)
    alone = scan(values, (149, 197), 0.04, WindowTest(0.01, 0.03))
    found = scan(values, (149, 197), 0.04, WindowTest(0.01, 0.03), below=149 - MARGIN)
    assert not any(s.high == 150 for s in alone.shifts)
    assert [s.span for s in found.shifts][:1] == [(149, 150)]
    flat = visits(counts, 3, 0.04, seed=2)
    edge = scan(flat, (149, 197), 0.04, WindowTest(0.01, 0.03)).position_limits()
    wide = scan(flat, (149, 197), 0.04, WindowTest(0.01, 0.03), below=149 - MARGIN)
    limits = wide.position_limits()
    assert min(limits) == 150 and max(limits) <= 197 and min(edge) == 151
    assert limits[151] < 0.7 * edge[151]  # two counts below it before, six now
    assert max(limits.values()) == pytest.approx(wide.limit_pct)  # the regions state the same limits
    assert limits[151] < 1.2 * limits[170]  # about a middle's
    assert wide.visits == 3 * len(counts)
    reach_only = {n: v for n, v in flat.items() if n >= 152}  # the coarse scan measured neither the margin nor 149-151
    grid = list(range(2, 198))
    start = scan(reach_only, (149, 197), 0.04, WindowTest(0.01, 0.03), below=149 - MARGIN)
    assert start.regions[0][0] == 149 - MARGIN and start.regions[-1][1] == 197  # so the power passes visit them
    assert sorted(counts_to_strengthen(grid, start.above(0.0), window_span(grid, (149, 197)))) == list(range(144, 198))



def test_power_passes_come_first_only_on_a_noisy_machine_where_a_pass_over_the_reach_is_cheap():
    """A policy's narrow reach on a noisy machine: a pass over it costs less than half the budget, so the windows
    get their visits before the candidates' paired rounds. A quiet machine's candidates confirm in a few rounds,
    and a reach over the whole grid would spend the budget in one pass."""
    assert passes_first(GRID, REACH, 235, noise=0.08)
    assert not passes_first(GRID, REACH, 235, noise=0.02)
    assert not passes_first(GRID, (GRID[0], N), 235, noise=0.08)
    assert not passes_first(GRID, REACH, 80, noise=0.08)  # little budget left: the candidates first


@pytest.mark.parametrize(("name", "noisy"), [("deit_small_bs4_amd_shuffled", False),
                                             ("deit_tiny_bs1_amd_aligned_shuffled", False),
                                             ("deit_tiny_bs4_amd_noisy_chained", True),
                                             ("deit_small_bs1_shuffled", True)])
def test_the_coarse_scan_tells_the_banks_noisy_traces_from_its_quiet_ones(name, noisy):
    """The gate's noise is read on the coarse scan's three visits a count: unbiased there, it tells the bank's
    noisy traces (5.9-12% a visit over the whole recording) from its quiet ones (1.1-2.4%)."""
    trace = read_trace(DATA / f"{name}.csv")
    search = LatencySearch(MeasurementRun(ReplaySource(trace)),
                           SearchScope(trace.counts, trace.num_tokens, focus_from=trace.num_tokens - 48),
                           SearchSettings(), progress=False)
    search.measurer.measure_units(search.coarse, search.settings.coarse_passes)
    assert (visit_noise(corrected_values(search.measurer.visits())) > NOISY_VISIT) is noisy


def passes(budget, target_pct, reserve, trace=None):
    trace = trace or synthetic_trace(linear_levels(), passes=16, noise=0.05)
    measurer = Measurer(MeasurementRun(ReplaySource(trace)), N, budget=budget, progress=False)
    measurer.measure_passes(list(range(REACH[0], N, 4)), 2)  # a coarse scan

    def scan():
        visits = measurer.visits()
        return scan_visits(visits, pool_visits(visits, N), [], REACH, WindowTest(0.01, 0.03))

    return measurer, power_passes(measurer, GRID, REACH, target_pct, reserve, scan)


def test_passes_stop_at_the_target_and_leave_the_reserve():
    measurer, found = passes(None, 99.0, 0)  # the coarse scan already reaches a 99% target
    assert len(measurer.visits()) == 2 * (len(range(REACH[0], N, 4)) + 1) and found.limit_pct <= 99.0
    measurer, found = passes(200, 1.0, 40)  # an unreachable target: the budget stops them
    spent = len(measurer.visits())
    assert spent <= 200 - 40 and 200 - 40 - spent < WINDOW_COUNTS + 1
    assert {v.tokens for v in measurer.visits()} >= set(range(REACH[0], N + 1))  # every count within reach


def test_the_scan_says_why_the_passes_stopped_short_of_the_target():
    """The budget or a recording with no more visits of the counts: the run's line says which, and where the
    counts' own scatter (8% from one to the next beside 2% noise a visit) keeps the target out of reach of more
    visits, says that too."""
    assert passes(None, 99.0, 0)[1].stopped == ""  # reached
    assert passes(150, 4.0, 40)[1].stopped == BUDGET
    rng = np.random.default_rng(3)
    wiggle = {n: float(np.exp(rng.normal(0.0, 0.08))) for n in GRID}
    scattered = synthetic_trace(lambda n: linear_levels()(n) * wiggle[n], passes=16, noise=0.02)
    measurer, found = passes(300, 5.0, 0, scattered)
    assert found.stopped == BUDGET and found.limit_pct > 5.0
    line = found.sentence(0, 5.0)
    assert "not reached within the visit budget; the counts there scatter" in line
    assert line.endswith("more visits of the same counts would not reach it)")
    short = synthetic_trace(linear_levels(), passes=2, noise=0.05)  # the coarse scan takes both
    found = passes(None, 1.0, 0, short)[1]
    assert found.stopped == EXHAUSTED
    assert found.sentence(0, 5.0).endswith("not reached: the recording holds no more visits of these counts)")


def test_a_larger_budget_buys_a_lower_limit_where_the_counts_do_not_scatter():
    """Plain 8% noise a visit: each pass adds a few visits a count and lowers the limit by the root of their
    share, about 10% for a fifth more visits, which chance can read as less. Only the budget, the target or the
    recording's end stops the passes."""
    ratios = []
    for seed in range(3):
        noisy = synthetic_trace(linear_levels(), passes=40, noise=0.08, seed=seed)
        (small, found_small), (large, found_large) = passes(150, 3.5, 0, noisy), passes(300, 3.5, 0, noisy)
        assert found_small.stopped == found_large.stopped == BUDGET
        assert len(large.visits()) >= 2 * len(small.visits()) - 2
        ratios.append(found_large.limit_pct / found_small.limit_pct)
    assert float(np.median(ratios)) < 0.9, ratios  # twice the visits: about 0.71 where the visits set the limit
