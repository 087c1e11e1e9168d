"""The search on replayed traces (no timing): shuffled passes, refinement, paired confirmation, budget, resume.

Synthetic traces have a known curve, known steps and a known drift; recorded traces (tests/data) have the
noise, drift and kernel steps of the machine they were measured on, and a ground truth from their own
paired analysis (`pomt.measurement.steps.steps_in_trace`).
"""

import functools

import pytest

from pomt.errors import GridError
from pomt.formats.trace import TraceWriter, inject_steps, read_trace
from pomt.measurement.confirmation import expected_levels
from pomt.measurement.design import design_rounds
from pomt.measurement.search import LatencySearch, SearchScope, SearchSettings
from pomt.measurement.sources import MeasurementRun, ReplaySource
from pomt.measurement.steps import steps_in_trace
from pomt.measurement.windows import WINDOW_COUNTS
from pomt.policies import Setting, rank_step

from conftest import DATA
from support.trace_data import N, linear_levels, slow_drift, synthetic_trace

GRID = list(range(2, N + 1))
PLANTED = {40: 1.08, 97: 0.9, 104: 1.12, 160: 1.08}  # a drop, a non-monotone band 98..104, a drop


def search(trace, adaptive=True, seed=0, focus_from=None, **settings):
    source = ReplaySource(trace)
    found = LatencySearch(MeasurementRun(source),
                          SearchScope(trace.counts, N, adaptive=adaptive, focus_from=focus_from),
                          SearchSettings(**settings), seed=seed, progress=False).run()
    return found, source


def near(steps, low, tolerance=1):
    return [s for s in steps if abs(s.tokens - low) <= tolerance]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adaptive_confirms_every_planted_step_and_invents_none(seed):
    """Four features at unaligned counts: the strided scan and bisection (align 0). With the default
    aligned anchors the coarse scan takes about 2/3 of the budget, and on this drifting replay one of
    the four is at times left unexamined (see test_dips_at_aligned_counts... for what anchors are for).
    The machine's speed swings by 30% over a 240 s period; a search reads a drift of 9-12% on the replay's clock."""
    trace = synthetic_trace(linear_levels(PLANTED), passes=32, drift=slow_drift(0.3, 240.0), noise=0.015, seed=seed)
    found, _ = search(trace, seed=seed, align=0)
    assert found.visits <= found.budget_visits == int(0.2 * 6 * len(GRID))
    kinds = {40: "drop", 97: "rise", 104: "drop", 160: "drop"}
    for low, kind in kinds.items():
        hits = near(found.steps, low)
        assert hits and hits[0].kind == kind, (low, [(s.tokens, s.kind) for s in found.steps])
    assert len(found.steps) == len(PLANTED)
    for step in found.steps:
        assert step.paired_ci_pct[0] <= step.paired_pct <= step.paired_ci_pct[1]
        assert step.p_value < 0.01 and step.pairs >= 3


def test_the_full_grid_finds_them_too_at_five_times_the_cost():
    """16 passes: a full grid's rounds of a pair are passes apart, so its confirmation needs six of its own, more
    than 12 passes leave after the grid's four and the bisection (the replay would run out at 98 tokens)."""
    trace = synthetic_trace(linear_levels(PLANTED), passes=16, drift=slow_drift(0.3, 240.0), noise=0.015)
    full, _ = search(trace, adaptive=False, passes=4)
    assert full.visits >= 4 * len(GRID)
    assert sorted(s.tokens for s in full.steps) == pytest.approx(sorted(PLANTED), abs=1)


@pytest.mark.parametrize("order", ["shuffled", "ascending"])
def test_drift_alone_makes_no_step(order):
    """A machine whose latency swings by half either way with a 20 s period, through most of one in the search's
    14 s on the replay's clock: no step is real."""
    trace = synthetic_trace(linear_levels(), passes=32, drift=slow_drift(0.5, 20.0), noise=0.01, order=order)
    found, _ = search(trace)
    assert found.steps == []
    assert found.drift.max_over_min > 1.3
    assert all(not c.accepted for c in found.candidates)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drift_alone_makes_no_step_at_the_low_end_either(seed):
    """The ascending replay of test_drift_alone_makes_no_step, with the pair 4 -> 3 examined directly after the
    coarse scan (its search never reaches it): the curve is a straight line, so no verdict may confirm it. The
    paired test subtracts the trend's predicted change with no uncertainty of its own. Served at their recorded
    times, this ascending recording's visits carried its drift along the token axis, the trend predicted -5.7%
    and -6.4% from 4 to 3 (seeds 0 and 1) where the line changes -1.9%, and three rounds confirmed rises of 3.3%
    and 4.8%; on the replay's clock it predicts -1.7% to -2.0% and every seed rejects the pair."""
    trace = synthetic_trace(linear_levels(), passes=32, drift=slow_drift(0.5, 20.0), noise=0.01, order="ascending",
                            seed=seed)
    run = LatencySearch(MeasurementRun(ReplaySource(trace)), SearchScope(trace.counts, N), SearchSettings(),
                        progress=False)
    run.measurer.reps = 1
    run.measurer.measure_units(run.coarse, run.settings.coarse_passes)
    run.judge_anchors()
    run.measurer.measure_passes([3, 4], 1)
    assert not run.confirm(3, 4, z=0.0).accepted


def test_small_steps_are_rejected_by_the_minimum_size():
    trace = synthetic_trace(linear_levels({100: 1.015}), passes=32, drift=lambda t: 1.0, noise=0.003)
    assert search(trace, min_step=0.03)[0].steps == []
    assert near(search(trace, min_step=0.005)[0].steps, 100)


def test_a_policy_reach_puts_the_coarse_scan_within_it():
    """A run without accuracy removes at most a quarter of the patch tokens: its coarse scan pairs the aligned
    edges from that reach up only, and measures every 14th count below it for the curve's shape, so the visits
    the 18 aligned edges below would have taken go to the counts a schedule can land on; an unaligned step
    there (171 -> 170, drift and noise as in the first test) is confirmed."""
    trace = synthetic_trace(linear_levels({170: 1.08}), passes=32, drift=slow_drift(0.3, 240.0), noise=0.015)
    whole = LatencySearch(MeasurementRun(ReplaySource(trace)), SearchScope(trace.counts, N), SearchSettings(),
                          progress=False)
    focused = LatencySearch(MeasurementRun(ReplaySource(trace)), SearchScope(trace.counts, N, focus_from=148),
                            SearchSettings(), progress=False)
    assert focused.anchors == [(a - 1, a) for a in range(152, N, 8)] and len(whole.anchors) == 24
    below = [n for unit in focused.coarse for n in unit if n < 148]
    assert below[0] == GRID[0] and 8 <= len(below) <= 12 and max(below) == 150 - 14
    assert 2 * sum(map(len, focused.coarse)) <= sum(map(len, whole.coarse))  # counts a coarse pass visits
    found = focused.run()
    assert [s.kind for s in near(found.steps, 170, 2)] == ["drop"]
    assert all(s.tokens >= 148 for s in found.steps)


def test_the_budget_caps_the_visits():
    trace = synthetic_trace(linear_levels(PLANTED), passes=32, noise=0.015)
    found, _ = search(trace, budget=0.1, align=0)
    coarse = 3 * (15 + 1)  # 15 strided counts and the reference in each of 3 passes
    assert found.visits <= found.budget_visits == max(int(0.1 * 6 * len(GRID)), coarse + 3 * (2 * 6 + 6))
    assert found.budget_spent
    assert any("budget" in c.reason for c in found.candidates)


def positions(search_state):
    return {id(v): i for i, v in enumerate(search_state.measurer.design)}


def test_anchor_pairs_are_visited_back_to_back_in_every_coarse_pass_in_alternating_order():
    trace = synthetic_trace(linear_levels(), passes=32, noise=0.01)
    state = LatencySearch(MeasurementRun(ReplaySource(trace)), SearchScope(GRID, N), SearchSettings(), progress=False)
    assert state.anchors == [(n - 1, n) for n in range(8, N, 8)]
    state.measurer.measure_units(state.coarse, 3)
    where = positions(state)
    for low, high in state.anchors:
        rounds = design_rounds(state.measurer.design, low, high)
        assert [where[id(b)] - where[id(a)] for a, b in rounds] == [1, -1, 1]  # A B, B A, A B
    replay = MeasurementRun(ReplaySource(trace))
    assert LatencySearch(replay, SearchScope(GRID, N), SearchSettings(align=0)).anchors == []
    assert LatencySearch(replay, SearchScope(GRID[::2] + [N], N), SearchSettings()).anchors == []


def test_dips_at_aligned_counts_are_confirmed_from_the_coarse_rounds_alone():
    """Every multiple of 16 runs 7% faster than its neighbours (a kernel's aligned fast path). A steady
    machine: on a drifting recording the replay cannot serve every round's two visits in one state."""
    levels = lambda n: linear_levels()(n) * (0.93 if n % 16 == 0 else 1.0)  # noqa: E731
    trace = synthetic_trace(levels, passes=32, drift=lambda t: 1.0, noise=0.01)
    found, _ = search(trace)
    confirmed = {(c.low, c.high): c for c in found.candidates if c.accepted}
    dips = [(n - 1, n) for n in range(16, N, 16)]
    assert all(pair in confirmed and confirmed[pair].kind == "rise" for pair in dips)
    assert all(confirmed[pair].effect.pairs == 3 for pair in dips)  # no round beyond the coarse passes
    assert not [pair for pair in confirmed if pair[1] % 16 == 8]  # the other anchors have no step
    strided, _ = search(trace, align=0)
    assert len([s for s in strided.steps if s.tokens % 16 == 15]) < len(dips)


def test_the_same_seed_gives_the_same_answer_and_another_seed_a_consistent_one():
    trace = synthetic_trace(linear_levels(PLANTED), passes=32, drift=slow_drift(0.3, 240.0), noise=0.015)
    first, second, other = search(trace)[0], search(trace)[0], search(trace, seed=5)[0]
    assert [s.to_dict() for s in first.steps] == [s.to_dict() for s in second.steps]
    assert [s.tokens for s in other.steps] == pytest.approx([s.tokens for s in first.steps], abs=2)


class Killed(Exception):
    pass


class DiesAfter:
    """A replayed device that dies after `limit` visits (as a killed run would)."""

    def __init__(self, trace, limit):
        self.inner, self.limit, self.calls = ReplaySource(trace), limit, 0
        self.preferred_reps = self.inner.preferred_reps

    def begin_pass(self, pass_index, members):
        self.inner.begin_pass(pass_index, members)

    def begin_unit(self, pass_index, members):
        self.inner.begin_unit(pass_index, members)

    def visit(self, tokens, reps, pass_index):
        if self.calls >= self.limit:
            raise Killed
        self.calls += 1
        return self.inner.visit(tokens, reps, pass_index)


def test_a_killed_search_resumes_into_the_same_answer(tmp_path):
    trace = synthetic_trace(linear_levels(PLANTED), passes=32, drift=slow_drift(0.3, 240.0), noise=0.015)
    meta = {"model": "deit_tiny", "batch_size": 1, "input_size": [224, 224], "num_tokens": N, "prefix_tokens": 1}
    path = tmp_path / "run.trace.csv"
    settings = SearchSettings()
    killed = DiesAfter(trace, 120)
    with pytest.raises(Killed):
        LatencySearch(MeasurementRun(killed, TraceWriter(path, meta, {"seed": 0})), SearchScope(GRID, N), settings,
                      progress=False).run()
    source = DiesAfter(trace, 10**6)
    source.inner = killed.inner  # the process died, the machine (here: the replayed device) did not
    resumed = LatencySearch(MeasurementRun(source, TraceWriter(path, meta, {"seed": 0}, resume=True)),
                            SearchScope(GRID, N), settings, progress=False).run()
    straight, _ = search(trace)
    assert [s.to_dict() for s in resumed.steps] == [s.to_dict() for s in straight.steps]
    assert source.calls == straight.visits - 120  # nothing measured twice
    assert resumed.measured == straight.visits - 120 and resumed.visits == straight.visits


def test_a_run_that_drifted_more_than_its_effects_says_so():
    """A drift of 40 s period: the search's 17 s on the replay's clock read a drift of 24%, four times the 6% step.
    (The replay serves the drift of the recording at its clock: a period of minutes drifts a search by a few
    percent, as live.)"""
    trace = synthetic_trace(linear_levels({100: 1.06}), passes=32, drift=slow_drift(0.25, 40.0), noise=0.01)
    found, _ = search(trace)
    assert near(found.steps, 100)
    sentence = found.drift_exceeds([s.paired_pct for s in found.steps])
    assert sentence and "drifted" in sentence
    assert found.drift_exceeds([500.0]) is None


def test_settings_that_cannot_work_are_refused():
    with pytest.raises(GridError, match="passes"):
        SearchSettings(passes=1).check()
    with pytest.raises(GridError, match="budget"):
        SearchSettings(budget=0).check()
    with pytest.raises(GridError, match="reference"):
        LatencySearch(MeasurementRun(ReplaySource(synthetic_trace(linear_levels(), passes=2))), SearchScope([2, 3], N),
                      SearchSettings())


def test_injected_steps_into_a_synthetic_trace_read_as_steps():
    trace = inject_steps(synthetic_trace(linear_levels(), passes=32, noise=0.01), {120: 1.07})
    found, _ = search(trace)
    assert [(s.tokens, s.kind) for s in found.steps] == [(120, "drop")]


DEEP = ["deit_tiny_bs1_amd_shuffled", "deit_small_bs1_amd_shuffled", "deit_tiny_bs4_amd_shuffled",
        "deit_small_bs4_amd_shuffled", "deit_tiny_bs1_amd_aligned_shuffled", "deit_small_bs1_amd_aligned_shuffled",
        "deit_tiny_bs1_amd_chained_shuffled", "deit_small_bs1_amd_chained_shuffled",
        "deit_tiny_bs4_amd_chained_shuffled"]
SHALLOW = {"passes": 2, "coarse_passes": 2, "confirm_rounds": 3}  # what a 5-6 pass trace can serve


FALSE_STEP = ("deit_small_bs4_amd_chained_shuffled (1 timed forward a visit): on the replay's clock three rounds of 7 "
              "and 8 confirm a 6.1% rise (p = 0.0047 at the first look's 0.005) that the dense trace does not show. "
              "Served at recorded times the false step was 119 -> 120 (coarse rounds +5.0% and +4.7% back to back, "
              "+8.7% from visits 8 s apart, p = 0.0024; the trace's 12 back-to-back rounds read +0.5%); on the clock "
              "six rounds reject it (p = 0.065)")


def truth(trace, min_step=0.02):
    """What the dense trace confirms by its own paired analysis. A confirmed step is real when the dense
    trace shows a significant change of 2% or more there: a step near the 3% minimum may read a point
    or so larger in a search's three rounds than in the trace's sixteen (deit_small bs1: 135->136,
    3.5% against 2.6%)."""
    return steps_in_trace(trace.visits, min_step=min_step)


def matches(step, steps, tolerance=2):
    return any(abs(step.tokens - s.tokens) <= tolerance or abs(step.upper_tokens - s.upper_tokens) <= tolerance
               for s in steps)


@pytest.mark.parametrize(("name", "settings"), [*((n, {}) for n in DEEP),
                                                ("deit_tiny_bs1_shuffled", SHALLOW),
                                                ("deit_small_bs1_shuffled", SHALLOW),
                                                ("deit_base_bs64_fp16_h100_shuffled", SHALLOW),
                                                pytest.param("deit_small_bs4_amd_chained_shuffled", {},
                                                             marks=pytest.mark.xfail(strict=True, reason=FALSE_STEP))])
def test_on_recorded_traces_every_confirmed_step_is_real(name, settings):
    """Real noise, drift and (Intel deit_small) an interference burst: nothing the dense trace does not show.
    Each candidate is confirmed at a false-step rate of `step_alpha` (0.01), and a search tests some 25
    aligned edges on their coarse rounds alone, so a false step now and then is the design's rate, not a
    bug; the one this bank shows is marked (FALSE_STEP), and the test fails when it goes away."""
    trace = read_trace(DATA / f"{name}.csv")
    found, _ = search(trace, **settings)
    real = truth(trace)
    assert all(matches(step, real) for step in found.steps), [(s.upper_tokens, s.tokens) for s in found.steps]
    assert found.visits <= found.budget_visits


def test_a_gpu_trace_whose_launch_bound_counts_flip_host_states_shows_no_step():
    """H100, float16, batch 64: below about 100 kept tokens visits read 3.2 or 5-6 ms by host state, not by
    count. Those flips must not leak into the drift correction of the steady counts (they once read as a
    +8.9% step at 140->139, where the raw visits of both counts agree within 1%)."""
    trace = read_trace(DATA / "deit_base_bs64_fp16_h100_shuffled.csv")
    assert not steps_in_trace(trace.visits, min_step=0.05)


def test_a_replayed_round_far_from_its_pair_cannot_carry_a_step_alone():
    """The H100 trace holds only its aligned edges back to back: a replayed round of 174 and 175 pairs
    visits recorded seconds apart, one of them (seed 2) in a slow host state. Its three rounds read -2.4%,
    -3.6% and -12.3% (p = 0.002), a false 5.6% step that shipped R = 23 where every other seed shipped 0;
    without that round the rest read less than the minimum step, so three rounds do not settle it."""
    trace = read_trace(DATA / "deit_base_bs64_fp16_h100_shuffled.csv")
    found, _ = search(trace, seed=2, focus_from=148)
    assert not [s for s in found.steps if s.tokens >= 148], [(s.upper_tokens, s.tokens) for s in found.steps]


CLIFF_UNFOCUSED = ("a search of the whole grid (no policy reach) on the replay's clock spends its budget at the low "
                   "end, where the dense trace confirms steps at 2-10 tokens, and the cliff's candidates (191..197) "
                   "are never examined; seeds 0 and 1 find the cliff, seed 2 does not")


@pytest.mark.parametrize(("seed", "focus_from"), [(0, 148), (1, 148), (3, 148), (0, None), (1, None),
                                                  pytest.param(2, None, marks=pytest.mark.xfail(strict=True,
                                                                                                reason=CLIFF_UNFOCUSED))])
def test_the_cliff_next_to_n_is_confirmed_and_one_more_token_pays(seed, focus_from):
    """deit_small at batch 4 on the AMD VM runs about 9% faster at 194 kept tokens than at 196-197, whatever
    visits a run is served (the seed), when its policy looks first at the counts its removal can reach (offline
    without accuracy: N - 49). Six rounds of some seeds left the cliff at p = 0.009, just short of the second
    look's level, and shipped R = 0 where others shipped R = 3: a promising step earns a third look."""
    trace = read_trace(DATA / "deit_small_bs4_amd_shuffled.csv")
    found, _ = search(trace, seed=seed, focus_from=focus_from)
    cliff = [s for s in found.steps if s.kind == "drop" and 191 <= s.tokens <= 196 and s.upper_tokens >= 195]
    assert cliff and cliff[0].paired_pct > 5 and cliff[0].paired_ci_pct[0] > 3
    setting = Setting(curve={p.tokens: p.latency_ms for p in found.points}, num_tokens=N, prefix_tokens=1, depth=12,
                      block=3, max_remove=49)  # the reach of a run without accuracy (a quarter of 196)
    (choice, *_) = rank_step(setting, found.steps, min_gain=0.03)
    assert 1 <= choice.remove <= 6 and choice.gain > 0.03  # a handful of tokens, a real gain


def test_steps_injected_into_real_noise_are_found():
    trace = inject_steps(read_trace(DATA / "deit_tiny_bs4_amd_shuffled.csv"), {120: 1.09, 160: 0.92})
    found, _ = search(trace)
    assert near(found.steps, 120, 2) and near(found.steps, 160, 2)
    assert {s.kind for s in near(found.steps, 120, 2)} == {"drop"}
    assert {s.kind for s in near(found.steps, 160, 2)} == {"rise"}


@pytest.mark.parametrize("name", ["deit_tiny_bs1_amd_shuffled", "deit_tiny_bs4_amd_shuffled"])
def test_the_saved_curve_shows_across_every_rejected_pair_what_its_rounds_measured(name):
    """An aligned edge judged on its coarse rounds once borrowed the other pairs' noise; later visits moved
    the drift profile, the rounds no longer counted as steady, and the curve reconciled them as loose
    evidence: 40 -> 39 read +4.3% on the saved curve against a paired interval of +0.4..+3.4%."""
    trace = read_trace(DATA / f"{name}.csv")
    found, _ = search(trace)
    level = {p.tokens: p.latency_ms for p in found.points}
    judged = [c for c in found.rejected if c.effect is not None]
    assert judged
    for c in judged:
        low, high = c.effect.ci
        assert low <= level[c.low] / level[c.high] <= high, (c.high, c.low, level[c.low] / level[c.high], c.effect.ci)


@pytest.mark.parametrize("name", ["deit_small_bs1_amd_aligned_shuffled", "deit_tiny_bs1_amd_chained_shuffled"])
def test_aligned_edges_left_open_are_judged_before_the_budget_goes_to_bisection(name):
    """An aligned edge the coarse rounds left open needs a few more rounds; a detector candidate between
    anchors needs bisection, settling and all its rounds. Ranked by significance alone, four or five open
    edges of the AMD traces (among them real steps: 31 -> 32 and 63 -> 64 of deit_tiny) were never examined
    while the budget went to bisection. Now no visit goes elsewhere while an open edge waits. The traces are
    those whose coarse rounds leave the most edges open on the replay's clock (7 and 4); those of
    deit_small_bs1_amd_shuffled and deit_tiny_bs1_amd_aligned_shuffled judge every edge there."""
    trace = read_trace(DATA / f"{name}.csv")
    source = ReplaySource(trace)
    run = LatencySearch(MeasurementRun(source), SearchScope(trace.counts, N), SearchSettings(), progress=False)
    found = run.run()
    verdict = {(c.low, c.high): c.reason for c in found.candidates}
    waiting = [pair for pair in run.pending if verdict[pair].startswith("not examined")]
    coarse = 3 * (len({n for unit in run.coarse for n in unit} - {N}) + 1)  # and the reference in each pass
    elsewhere = [c for c in found.candidates if (c.low, c.high) not in run.anchors and c.effect is not None]
    assert run.pending
    design = run.measurer.design
    assert not waiting or (len(design) == coarse and not elsewhere), (waiting, len(design) - coarse)


SAWTOOTHS = ["deit_tiny_bs1_amd_shuffled", "deit_small_bs1_amd_aligned_shuffled"]


@functools.cache
def sawtooth(name):
    """The search's curve on an AMD trace and its trend (`expected_levels`)."""
    found, _ = search(read_trace(DATA / f"{name}.csv"))
    return found, expected_levels(found.points)


@pytest.mark.parametrize("name", SAWTOOTHS)
def test_the_trend_of_a_sawtooth_stays_a_rising_curve_through_it(name):
    """An adaptive search's curve on these AMD traces is a sawtooth of aligned pairs: 7 tokens rising, then
    a drop at the aligned count. The trend set aside ever more of the rising intervals as steps, until they
    covered 177 of the 195 tokens, and fell below zero (deit_small: -228 ms at N); offsets from it turned a
    flat 8 -> 7 into a confirmed 76% step. Steps are outliers: they cover at most half the span."""
    found, expected = sawtooth(name)
    levels = [expected[p.tokens] for p in found.points]
    assert all(b > a > 0 for a, b in zip(levels, levels[1:], strict=False))
    assert all(abs(s.paired_pct) < 20 for s in found.steps), [(s.upper_tokens, s.paired_pct) for s in found.steps]


TREND_ABOVE_THE_TEETH = ("on the replay's clock the search confirms 19 of deit_tiny_bs1_amd_shuffled's steps, most of "
                         "them aligned drops of 4-9% within two tokens of one the dense trace confirms; the trend "
                         "takes each out as an offset and ends 1.84 times the curve at N (33.3 ms against 18.1; 1.82 "
                         "while every visit began with an untimed forward); at recorded times it confirmed 20 and "
                         "ended 1.42 times it")


TREND_BELOW_THE_TEETH = ("on deit_small_bs1_amd_aligned_shuffled the whole-grid search confirms 18 rises at the teeth "
                         "and no drop since a step must clear the minimum by a standard error: 7 -> 8 "
                         "took its extra look, and the budget left 14 -> 15's drop unexamined; the trend takes each "
                         "rise out as an offset and ends at 0.46 of the curve. The trend was as fragile before, by "
                         "seed: at seeds 0 to 3 its lowest was 0.88, 0.86, 0.26 and 0.86 of the curve before, 0.46, "
                         "0.94, 0.19 and 0.94 after")


@pytest.mark.parametrize("name", [pytest.param(SAWTOOTHS[0], marks=pytest.mark.xfail(strict=True,
                                                                                     reason=TREND_ABOVE_THE_TEETH)),
                                  pytest.param(SAWTOOTHS[1], marks=pytest.mark.xfail(strict=True,
                                                                                     reason=TREND_BELOW_THE_TEETH))])
def test_the_trend_of_a_sawtooth_stays_near_its_curve(name):
    """The trend through the sawtooth of test_the_trend_of_a_sawtooth_stays... stays within a factor of 1.5 of the
    curve at every count: the drops it takes out as steps do not carry it away from the levels."""
    found, expected = sawtooth(name)
    assert all(0.67 < expected[p.tokens] / p.latency_ms < 1.5 for p in found.points), max(
        expected[p.tokens] / p.latency_ms for p in found.points)


def test_a_replay_whose_reference_visits_are_used_up_goes_on_without_it():
    """deit_tiny_bs1_shuffled holds 6 visits of N, one per recorded pass; the coarse passes and three rounds
    of refinement used them all, and the search stopped at 177 of its 235 visits, its best candidate (56 -> 57,
    -20%) never examined. A refinement pass has the drift profile of every visit to correct it; it goes on
    without the reference the trace no longer holds, so the search continues."""
    trace = read_trace(DATA / "deit_tiny_bs1_shuffled.csv")
    source = ReplaySource(trace)
    run = LatencySearch(MeasurementRun(source), SearchScope(trace.counts, N), SearchSettings(), progress=False)
    found = run.run()
    assert source.left(N) == 0
    assert not any(f"visits of {N} tokens" in c.reason for c in found.candidates)
    passes = {v.pass_index for v in run.measurer.design}  # coarse and refinement passes (confirmation rounds apart)
    with_reference = {v.pass_index for v in run.measurer.design if v.tokens == N}
    assert passes - with_reference  # refinement passes measured after the trace had no more of N


def test_a_pair_tested_on_its_own_spread_needs_six_rounds_and_a_pass_over_new_counts_is_no_failed_power_pass():
    """deit_tiny_bs1_amd_noisy_long (12% noise a visit): three rounds of 175 and 176, one of them from visits 2 s
    apart (so the pair borrows no noise), read -10.5%, -11.6% and -10.5%, p = 0.001 on their own spread; the 24
    passes' pairs read +1.5% +- 3.6%. Its power passes once stopped after the first, which cut the reach into
    seven windows where there had been two and so read a higher limit. The passes go on until what is left of
    the budget cannot pay a window's worth of counts and a verdict."""
    trace = read_trace(DATA / "deit_tiny_bs1_amd_noisy_long.csv")
    found, _ = search(trace, focus_from=148)
    assert not near(found.steps, 175)
    assert found.visits >= found.budget_visits - (WINDOW_COUNTS + 1 + SearchSettings().verdict_cost)
