"""The verify stage: what ships, decided from the ranking and the verifications (hand-made here, measured in
test_offline), and the frontier's verdict where nothing is measured."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pomt.device import Fingerprint
from pomt.frontier.candidates import Candidate
from pomt.frontier.choice import Evaluated, Goal, pareto_front, preference
from pomt.frontier.latency import LatencyModel
from pomt.frontier.search import FrontierResult
from pomt.measurement.search import SearchSettings
from pomt.offline.choose import FrontierFound, policy_setting, rank, stopped_note, verification_removals
from pomt.offline.config import OfflineConfig, Request
from pomt.offline.measure import Latency
from pomt.offline.verify import (
    FreshCheck,
    Verdict,
    decide,
    decide_frontier,
    here_only_note,
    prediction_note,
    priced,
    shipped,
)
from pomt.stats import Proportion
from pomt.verification.fresh import placement_hint
from pomt.verification.verify import CandidateResult, Verification
from pomt.workload.prepare import Workload

from support.offline_data import GEOMETRY, N, make_run, search_result

REQUEST = Request(Workload(progress=False), OfflineConfig(), SearchSettings())
RANKING = rank(REQUEST.config, policy_setting(REQUEST.config, GEOMETRY, search_result(), None), search_result())
FIRST = RANKING.ranked[0]  # lands below the drop 151 -> 150


def candidate(remove: int, speedup: float, qualifies: bool) -> CandidateResult:
    return CandidateResult(remove, 10.0 / speedup, speedup, (speedup - 0.02, speedup + 0.02), 1e-4, qualifies)


def verification(chosen: CandidateResult | None, *candidates: CandidateResult, reason: str = "ok") -> Verification:
    return Verification(10.0, tuple(candidates), chosen, reason, 10, 3, None)


def test_a_removal_measured_slower_ships_nothing():
    here = verification(None, candidate(N - 150, 1.01, False), reason="no candidate is measurably faster")
    decision = shipped(REQUEST.config, RANKING, here, None)
    assert (decision.remove, decision.code, decision.reason) == (0, "not_faster", "no candidate is measurably faster")


def test_the_verified_removal_ships_with_what_was_measured_in_its_reason():
    chosen = candidate(N - 150, 1.2, True)
    decision = shipped(REQUEST.config, RANKING, verification(chosen, chosen, reason="measured 1.200x"), None)
    assert decision == replace(FIRST, reason=f"{FIRST.reason}; verified: measured 1.200x", code="verified")


def test_the_other_side_of_the_targeted_step_ships_as_what_it_is():
    chosen = candidate(N - 151, 1.2, True)
    decision = shipped(REQUEST.config, RANKING, verification(chosen, chosen, reason="measured 1.200x"), None)
    assert (decision.kept_tokens, decision.policy, decision.code) == (151, "step", "verified")
    assert decision.reason == (f"the other side of the step the policy's first choice targets ({FIRST.reason}); "
                               "verified: measured 1.200x")


def test_a_removal_needs_the_fresh_process_too():
    chosen = candidate(N - 150, 1.2, True)
    here = verification(chosen, chosen, reason="measured 1.200x")
    fresh = verification(None, candidate(N - 150, 1.0, False))
    failed = FreshCheck(None, "in a fresh process: no gain", replace(here, chosen=None), fresh)
    decision = shipped(REQUEST.config, RANKING, failed.here, failed)
    assert (decision.remove, decision.code) == (0, "not_in_fresh_process")
    assert decision.reason == "verified here, not in a fresh process: no gain"
    held = FreshCheck(chosen, "in a fresh process: measured 1.190x", here, fresh)
    decision = shipped(REQUEST.config, RANKING, here, held)
    assert decision.remove == N - 150 and decision.reason.endswith(
        "; verified: measured 1.200x; in a fresh process: measured 1.190x")


def test_a_replay_or_no_verify_ships_the_first_ranked_unverified_and_nothing_ranked_ships_nothing():
    replayed = decide(REQUEST, make_run(replay=Path("trace.csv")), RANKING)
    assert replayed == Verdict(FIRST, notes=("replayed trace: the patched model was not measured, the schedule is "
                                             "unverified",))
    unverified = decide(replace(REQUEST, config=OfflineConfig(verify=False)), make_run(), RANKING)
    assert unverified == Verdict(FIRST, notes=("--no-verify: the schedule is unverified",))
    empty = decide(REQUEST, make_run(), replace(RANKING, ranked=()))
    assert empty.decision.code == "no_step" and empty.verification is None and empty.notes == ()


def test_the_allocator_advice_names_what_held_here_only():
    cpu = Fingerprint(kind="cpu", allocator={})
    steps = ({"low": 150, "high": 151, "held": False}, {"low": 120, "high": 121, "held": True})
    latency, quiet = Latency(search_result(), 1.0, fresh_steps=steps), Latency(search_result(), 1.0)
    chosen = candidate(N - 150, 1.2, True)
    removal = Verdict(FIRST, verification=verification(None, chosen), fresh_verification=verification(None, chosen))
    shipped_both = Verdict(FIRST, verification=verification(chosen, chosen), fresh_verification=verification(chosen))
    assert here_only_note(cpu, latency, shipped_both) == placement_hint(cpu, "1 of 2 steps within reach")
    assert here_only_note(cpu, quiet, removal) == placement_hint(cpu, "the removal")
    assert here_only_note(cpu, latency, removal) == placement_hint(cpu, "1 of 2 steps within reach and the removal")
    assert here_only_note(cpu, quiet, shipped_both) is None
    assert here_only_note(Fingerprint(kind="cuda", allocator={}), latency, removal) is None


def test_the_method_cost_is_measured_again_where_it_moved_verification():
    """The cost is held beyond the removals it was measured at; where charging it sends verification to others,
    they are measured too, so every removal verified is priced at its own cost."""
    points = [replace(p, latency_ms=10.0 - 0.04 * (N - p.tokens), median_ms=10.0 - 0.04 * (N - p.tokens))
              for p in search_result().points]
    search = replace(search_result(), points=points, steps=[])
    config = OfflineConfig(latency_budget_ms=9.0)
    ranking = rank(config, policy_setting(config, GEOMETRY, search, None), search)
    asked = []

    def measure(removals):  # any cost sends the budget policy to larger removals than it was measured at
        asked.append(removals)
        return {r: 0.2 + 0.001 * r for r in removals}

    cost, priced_ranking = priced(config, ranking, measure)
    assert asked[0] == verification_removals(ranking.ranked, config.verify_candidates)
    verified = verification_removals(priced_ranking.ranked, config.verify_candidates)
    assert len(asked) >= 2 and verified and set(verified) <= set(cost)
    assert all(priced_ranking.setting.predicted(N - r) <= 9.0 for r in verified[-1:])
    _, once = priced(config, ranking, measure, passes=1)
    assert not set(verification_removals(once.ranked, config.verify_candidates)) <= set(asked[0])


LATENCY = LatencyModel({n: 1.0 + 0.05 * n for n in range(2, N + 1)}, N, 1, 12)
UNPRUNED = Evaluated(Candidate.of("pomt", {}), "unpruned", LATENCY.baseline, Proportion(180, 200),
                     Proportion(178, 200))
CUT = Candidate.of("topk", {3: 40, 6: 30})
FAST = Evaluated(CUT, "search-topk", LATENCY.predict(CUT), Proportion(179, 200), Proportion(177, 200))
FRONTIER_REQUEST = Request(Workload(), OfflineConfig(), SearchSettings())


def found(goal: Goal) -> FrontierFound:
    evaluated = (UNPRUNED, FAST)
    result = FrontierResult(UNPRUNED, evaluated, tuple(pareto_front(evaluated)), 2)
    return FrontierFound(result, LATENCY, tuple(preference(result, goal)), None)


def test_no_schedule_within_the_goal_removes_nothing_and_says_why():
    verdict = decide_frontier(FRONTIER_REQUEST, make_run(), found(Goal(max_drop_points=0.1)), Goal(0.1).describe())
    decision = verdict.verdict.decision
    assert verdict.chosen is None and decision.remove == 0 and decision.kept_tokens == N
    assert decision.code == "no_candidate" and decision.policy == "frontier"
    assert "within 0.1 points of the unpruned accuracy" in decision.reason and "2 schedules" in decision.reason
    assert decision.accuracy == 0.89  # the unpruned model's held-out accuracy


def test_a_replay_ships_the_best_frontier_schedule_unverified():
    replayed = make_run(replay=Path("trace.csv"))
    verdict = decide_frontier(FRONTIER_REQUEST, replayed, found(Goal(1.0)), Goal(1.0).describe())
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
