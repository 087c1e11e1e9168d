"""Verification in a fresh process: a removal ships only where it qualified in both processes."""

import math

import numpy as np

from pomt.choice.fresh import FreshJob, held_in_both, placement_hint, step_holds, verify_in_fresh_process
from pomt.choice.verify import verify
from pomt.formats.schedule import BlockRemoval, Schedule
from pomt.formats.trace import Visit
from pomt.measurement.confirmation import Confirmation
from pomt.measurement.drift import CurvePoint
from pomt.measurement.paired import paired_effect
from pomt.measurement.search import SearchResult, SearchSettings
from pomt.measurement.sources import ReplaySource, Session
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.pipelines.offline import OfflineResult, check_steps_in_fresh_process, here_only_note
from pomt.workload.prepare import Workload

from tiny_data import MODEL, SIZE
from trace_data import N, synthetic_trace


def measured(latency: dict[int, float]):
    """A verification of removals 3 and 5 on a replayed device at the given latencies."""
    trace = synthetic_trace(lambda k: latency[k], counts=list(latency), passes=14, noise=0.005,
                            drift=lambda t: 1.0 + 0.2 * math.sin(t / 5))
    return verify(Session(ReplaySource(trace)), N, [3, 5], reps=3, progress=False)


def test_a_removal_ships_only_where_it_qualified_in_both_processes():
    """The process that found the step: 3 removed is 8% faster. A fresh one: 3 removed gains nothing, 5
    removed is 9% faster in both (deit_small bs4 on the VM: the drop by N sits at a different count in each
    process, while five tokens below N is faster in all)."""
    here = measured({N: 20.0, N - 3: 18.4, N - 5: 18.3})
    fresh = measured({N: 20.0, N - 3: 19.9, N - 5: 18.2})
    assert here.chosen is not None and here.chosen.remove == 3
    chosen, reason = held_in_both(here, fresh, min_gain=0.03, min_step=0.03)
    assert chosen is not None and chosen.remove == 5
    assert reason.startswith("in a fresh process: measured")


def test_nothing_ships_when_the_fresh_process_has_no_gain():
    here = measured({N: 20.0, N - 3: 18.4, N - 5: 19.9})
    fresh = measured({N: 20.0, N - 3: 19.95, N - 5: 19.9})
    chosen, reason = held_in_both(here, fresh, min_gain=0.03, min_step=0.03)
    assert chosen is None and "no candidate is measurably faster" in reason


def test_the_fresh_process_rebuilds_the_workload_and_measures_the_patched_model(tmp_path):
    geometry = model_geometry(create_model(MODEL, input_size=SIZE))
    schedule = Schedule(model=geometry.model, input_size=geometry.input_size, batch_size=2,
                        num_tokens=geometry.num_tokens, prefix_tokens=geometry.prefix_tokens, depth=geometry.depth,
                        method="pomt", prune=(BlockRemoval(1, 20),))
    workload = Workload(model=MODEL, batch_size=2, input_size=SIZE, threads=1, output_dir=tmp_path, progress=False)
    job = FreshJob(workload, {geometry.num_tokens - 20: schedule}, reps=2, rounds=3, min_gain=0.03, min_step=0.03,
                   alpha=0.01)
    found = verify_in_fresh_process(job)
    assert [c.remove for c in found.candidates] == [20] and found.rounds == 3
    (candidate,) = found.candidates
    assert candidate.pruned_ms > 0 and candidate.speedup_ci[0] <= candidate.speedup <= candidate.speedup_ci[1]


def test_a_cpu_user_under_the_default_allocator_is_told_about_placement():
    assert "MALLOC_MMAP_THRESHOLD_" in placement_hint({"kind": "cpu", "allocator": {}})
    assert placement_hint({"kind": "cpu", "allocator": {"MALLOC_MMAP_THRESHOLD_": "1073741824"}}) is None
    assert placement_hint({"kind": "cuda", "allocator": {}}) is None


def rounds_of(low_ms: list[float], high_ms: list[float]) -> list[tuple[Visit, Visit]]:
    return [(Visit(10, i, 2.0 * i, (a,)), Visit(11, i, 2.0 * i + 1.0, (b,)))
            for i, (a, b) in enumerate(zip(low_ms, high_ms, strict=True))]


def test_a_step_holds_in_a_fresh_process_only_when_it_shows_there_in_the_same_direction():
    """Confirmed here: 10 tokens 8% faster than 11 beyond a trend that predicts 1%. Fresh readings: the step
    again; no step; the other way; a real but tiny 1% (significant, under half the 3% minimum); and 2.8%
    from noisy rounds, significant one-sided only (the direction is known before the rounds: 192 -> 191 of
    deit_small bs4 read +2.7% [+1.0, +4.5] fresh and was turned away by the two-sided test)."""
    offset = math.log(0.99)
    here = paired_effect([20.0] * 6, [18.3, 18.5, 18.4, 18.2, 18.4, 18.3], offset=offset)
    noise = np.array([0.003, -0.002, 0.001, -0.003, 0.002, -0.001])
    wide = np.array([0.012, -0.008, 0.004, -0.012, 0.008, -0.004])

    def holds(low_ms: float, spread: np.ndarray = noise) -> bool:
        return step_holds(here, rounds_of(list(low_ms * (1 + spread)), list(20.0 * (1 - spread))), alpha=0.01,
                          min_step=0.03)[1]

    assert holds(18.4) and not holds(19.8) and not holds(21.0)
    assert not holds(19.6)  # 1% beyond the trend, however significant
    fresh = step_holds(here, rounds_of(list(19.25 * (1 + wide)), list(20.0 * (1 - wide))), 0.01, 0.03)[0]
    assert 0.01 < fresh.p_value < 0.02 and holds(19.25, wide)


def claimed(low: int, high: int, ratio: float) -> Confirmation:
    effect = paired_effect([1.0] * 6, [ratio * (1 + e) for e in (0.01, -0.01, 0.005, -0.005, 0.0, 0.002)])
    kind = "drop" if ratio < 1 else "rise"
    return Confirmation(low, high, effect, True, kind, f"confirmed: {kind}", 10.0)


def point(tokens: int, ms: float) -> CurvePoint:
    return CurvePoint(tokens=tokens, latency_ms=ms, median_ms=ms, relative=1.0, spread_ms=0.0, min_ms=ms, visits=3,
                      samples=6, se_ms=0.01 * ms)


def test_a_confirmed_step_the_fresh_process_does_not_show_is_rejected_before_the_policy_sees_it(tmp_path):
    """Two claims within the policy's reach on test_vit at 224 px (197 tokens), measured again in a new
    process: 100 tokens far faster than 197 (true) and 101 far slower (false). The false one leaves the
    steps, rejected with both measurements in its reason; a claim out of reach (3 -> 2) is not measured."""
    workload = Workload(model=MODEL, batch_size=2, input_size=224, threads=1, output_dir=tmp_path, progress=False)
    true, false, beyond = claimed(100, 197, 0.5), claimed(101, 197, 2.0), claimed(2, 3, 0.9)
    search = SearchResult(points=[point(n, ms) for n, ms in ((2, 1.8), (3, 2.0), (100, 2.5), (101, 10.0),
                                                               (197, 5.0))],
                          steps=[], candidates=[true, false, beyond], drift=None, noise=0.01, reps=2, visits=10,
                          measured=10, full_grid_visits=100, budget_visits=20, budget_spent=False)
    result = OfflineResult(geometry=model_geometry(create_model(MODEL, input_size=224)),
                           device={"kind": "cpu", "allocator": {}}, batch_size=2)
    checked = check_steps_in_fresh_process(workload, SearchSettings(), search, reach=100, result=result)
    assert {(s.tokens, s.upper_tokens) for s in checked.steps} == {(100, 197), (2, 3)}
    (rejected,) = checked.rejected_candidates
    assert (rejected.low, rejected.high) == (101, 197) and "here only: in a fresh process" in rejected.reason
    records = {(f["low"], f["high"]): f for f in result.fresh_steps}
    assert records.keys() == {(100, 197), (101, 197)}
    assert records[(100, 197)]["held"] and not records[(101, 197)]["held"]
    assert records[(100, 197)]["rounds"] >= 3 and records[(100, 197)]["fresh_pct"] > 20
    # under the default allocator the run notes the advice for the step that held here only
    assert here_only_note(result) == placement_hint(result.device, "1 of 2 steps within reach")
