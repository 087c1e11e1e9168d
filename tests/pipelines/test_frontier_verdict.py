"""The frontier's verdict where nothing is measured: no schedule meets the goal (remove 0, saying why), or a
replay ships the best frontier schedule unverified; and the schedule that reports it."""

from __future__ import annotations

from pathlib import Path

from pomt.device.fingerprint import Fingerprint
from pomt.frontier.candidates import Candidate
from pomt.frontier.choice import Evaluated, Goal, pareto_front, preference
from pomt.frontier.latency import LatencyModel
from pomt.frontier.search import FrontierResult
from pomt.measurement.search import SearchSettings
from pomt.offline.config import OfflineConfig, Request
from pomt.offline.frontier_search import FrontierFound, stopped_note
from pomt.offline.frontier_verdict import decide_frontier, prediction_note
from pomt.stats import Proportion
from pomt.verification.verify import CandidateResult
from pomt.workload.prepare import Workload

from offline_data import N, make_run

LATENCY = LatencyModel({n: 1.0 + 0.05 * n for n in range(2, N + 1)}, N, 1, 12)
UNPRUNED = Evaluated(Candidate.of("pomt", {}), "unpruned", LATENCY.baseline, Proportion(180, 200),
                     Proportion(178, 200))
CUT = Candidate.of("topk", {3: 40, 6: 30})
FAST = Evaluated(CUT, "search-topk", LATENCY.predict(CUT), Proportion(179, 200), Proportion(177, 200))
REQUEST = Request(Workload(), OfflineConfig(), SearchSettings())


def found(goal: Goal) -> FrontierFound:
    evaluated = (UNPRUNED, FAST)
    result = FrontierResult(UNPRUNED, evaluated, tuple(pareto_front(evaluated)), 2)
    return FrontierFound(result, LATENCY, tuple(preference(result, goal)), None)


def test_no_schedule_within_the_goal_removes_nothing_and_says_why():
    verdict = decide_frontier(REQUEST, make_run(), found(Goal(max_drop_points=0.1)), Goal(0.1).describe())
    decision = verdict.verdict.decision
    assert verdict.chosen is None and decision.remove == 0 and decision.kept_tokens == N
    assert decision.code == "no_candidate" and decision.policy == "frontier"
    assert "within 0.1 points of the unpruned accuracy" in decision.reason and "2 schedules" in decision.reason
    assert decision.accuracy == 0.89  # the unpruned model's held-out accuracy


def test_a_replay_ships_the_best_frontier_schedule_unverified():
    verdict = decide_frontier(REQUEST, make_run(replay=Path("trace.csv")), found(Goal(1.0)), Goal(1.0).describe())
    decision = verdict.verdict.decision
    assert verdict.chosen == FAST and decision.code == "unverified" and decision.remove == 70
    assert decision.block == 3 and decision.kept_tokens == N - 70 and decision.accuracy == 0.885
    assert "unverified" in verdict.verdict.notes[0]


def _measured(predicted_ms: float, pruned_ms: float) -> CandidateResult:
    return CandidateResult(remove=1, pruned_ms=pruned_ms, speedup=10.0 / pruned_ms, speedup_ci=(1.0, 2.0),
                           p_value=0.001, qualifies=True, predicted_ms=predicted_ms)


def test_a_prediction_missed_by_more_than_the_tolerance_is_said_with_the_allocator_advice_where_it_applies():
    close = [_measured(5.0, 5.1), _measured(6.0, 5.9)]
    missed = [_measured(5.0, 5.1), _measured(6.0, 6.5)]
    assert prediction_note(close, Fingerprint(kind="cpu", allocator={})) is None
    note = prediction_note(missed, Fingerprint(kind="cpu", allocator={}))
    assert "up to +8.3%" in note and "--allocator steady" in note
    fixed = prediction_note(missed, Fingerprint(kind="cpu", allocator={"MALLOC_MMAP_THRESHOLD_": "33554432"}))
    assert "up to +8.3%" in fixed and "--allocator" not in fixed
    assert "--allocator" not in prediction_note(missed, Fingerprint(kind="cuda", allocator={}))
    assert prediction_note([_measured(None, 5.0)], Fingerprint(kind="cpu")) is None  # nothing predicted


def test_schedules_stopped_early_are_named_with_the_work_they_saved():
    stopped = Evaluated(CUT, "search-topk", 1.0, Proportion(10, 40, lost=30, gained=0))
    result = FrontierResult(UNPRUNED, (UNPRUNED, stopped), (UNPRUNED,), 2)
    (note,) = stopped_note(result, 200, 0.06)
    assert note == ("accuracy stopped early for 1 of 2 schedules (drop surely beyond 6 points): 160 of 400 image "
                    "evaluations (40%) not run")
    assert stopped_note(found(Goal()).result, 200, 0.06) == ()  # every schedule measured on every image
