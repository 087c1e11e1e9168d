"""What ships from the frontier: its best schedules, each reducer's best and the best uniform one (the one to
beat, and a candidate too) measured against the unpruned model through `pomt.apply_schedule` in paired
shuffled rounds (journal `<stem>.verify.csv`), the ones that qualified once more in a fresh process; of those
that qualified in both, the fastest measured ships (with only a latency budget, the first in the order of preference;
see `pomt.frontier.choice.verified_choice`), the best uniform schedule included, else nothing, with the
reason. `pomt.verification.verify` names its candidates by kept tokens; here candidate i (1-based, in the order
verified) is named N - i, and the schedule's `verified` record names each by the tokens it removes in all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pomt.device.allocator import STEADY_ADVICE
from pomt.device.fingerprint import Fingerprint
from pomt.formats.schedule import Schedule
from pomt.frontier.candidates import Candidate
from pomt.frontier.choice import Evaluated, verified_choice
from pomt.offline.config import Request
from pomt.offline.frontier_schedule import candidate_schedule, effective_removal, frontier_decision
from pomt.offline.frontier_search import FrontierFound
from pomt.offline.frontier_setup import goal_of
from pomt.offline.prepare import Run
from pomt.offline.verdict import Verdict, verification_session
from pomt.verification.fresh import FreshJob, verify_in_fresh_process
from pomt.verification.verify import CandidateResult, Verification
from pomt.verification.verify import verify as verify_candidates

PREDICTION_TOLERANCE = 0.03  # the latency model's goal for multi-block schedules (benchmarks/prediction_error.py)


@dataclass(frozen=True)
class FrontierVerdict:
    """The verdict (decision, verification narrowed to what ships), the schedule that ships (None: nothing),
    and every verified candidate's result here."""

    verdict: Verdict
    chosen: Evaluated | None = None
    measured: dict[Candidate, CandidateResult] = field(default_factory=dict)


def reported_accuracy(point: Evaluated) -> float:
    """The accuracy a schedule reports: its held-out one where measured, else its search one."""
    return point.held_out.value if point.held_out is not None else point.accuracy


def decide_frontier(request: Request, run: Run, found: FrontierFound, goal: str) -> FrontierVerdict:
    """Nothing when no frontier schedule meets the goal (`goal`: in words); the first, unverified, on a
    replay or with --no-verify; else the first that measures faster here and in a fresh process."""
    config, latency = request.config, found.latency
    if not found.shippable:
        reason = (f"no schedule on the frontier is predicted faster than the unpruned model and {goal} "
                  f"({len(found.result.evaluated)} schedules evaluated)")
        decision = frontier_decision(latency, None, reason, "no_candidate", config,
                                     reported_accuracy(found.result.baseline))
        return FrontierVerdict(Verdict(decision))
    if run.replay is not None or not config.verify:
        note = ("replayed trace: the patched model was not measured, the schedule is unverified"
                if run.replay is not None else "--no-verify: the schedule is unverified")
        first = found.shippable[0]
        decision = frontier_decision(latency, first, f"the best frontier schedule, {first.candidate.key} "
                                     f"({first.family}), {goal}", "unverified", config, reported_accuracy(first))
        return FrontierVerdict(Verdict(decision, notes=(note,)), first)
    return verify_shippable(request, run, found)


def verify_shippable(request: Request, run: Run, found: FrontierFound) -> FrontierVerdict:
    """Verify the best `--verify-candidates` shippable schedules, each reducer's best and the best uniform one
    (`found.to_verify`, chosen by `pomt.frontier.choice.to_verify`; module docstring)."""
    workload, config, settings = request.workload, request.config, request.settings
    n, latency = run.geometry.num_tokens, found.latency
    points = list(found.to_verify)
    schedules = {n - i: candidate_schedule(run, config, latency, p) for i, p in enumerate(points, start=1)}
    here, journal, notes = verify_here(request, run, found, points, schedules)
    notes += tuple(filter(None, [prediction_note(here.candidates, run.setup.fingerprint)]))
    by_index = {c.remove: c for c in here.candidates}
    measured = {p.candidate: by_index[i] for i, p in enumerate(points, start=1)}
    shippable = list(range(1, len(points) + 1))  # the best uniform schedule meets the goal too
    qualified = [i for i in shippable if by_index[i].qualifies]
    fresh, held = None, None
    if qualified and config.verify_fresh:
        rounds = config.rounds_for(latency.baseline, found.reps, len(qualified) + 1)
        job = FreshJob(workload, {n - i: schedules[n - i] for i in qualified}, found.reps, rounds,
                       config.min_gain, settings.min_step, settings.step_alpha)
        fresh = verify_in_fresh_process(job)
        held = {c.remove for c in fresh.candidates if c.qualifies}
    index = verified_choice(shippable, {i: c.speedup for i, c in by_index.items()}, qualified, held,
                            goal_of(config))
    relabelled = relabel(here, points, found)
    fresh_record = None if fresh is None else relabel(fresh, [points[i - 1] for i in qualified], found, qualified)
    if index is None:
        best = max((by_index[i] for i in shippable), key=lambda c: c.speedup)
        where = "in a fresh process" if qualified else "here"
        reason = (f"no frontier schedule verified {where} as faster by {config.min_gain:.0%} or more: the best "
                  f"measured {best.speedup:.3f}x here (95% CI {best.speedup_ci[0]:.3f}-{best.speedup_ci[1]:.3f})")
        decision = frontier_decision(latency, None, reason, "not_in_fresh_process" if qualified else "not_faster",
                                     config, reported_accuracy(found.result.baseline))
        return FrontierVerdict(Verdict(decision, replace(relabelled, chosen=None, reason=reason), fresh_record,
                                       journal=journal, notes=notes), None, measured)
    point, result = points[index - 1], by_index[index]
    fallback = "" if index == shippable[0] else (
        f", measured faster than the predicted first, {points[0].candidate.key} ({by_index[1].speedup:.3f}x)"
        if by_index[1].speedup < result.speedup else
        f", after {shippable.index(index)} preferred schedule(s) did not verify")
    reason = (f"{point.candidate.key} ({point.family}): measured {result.speedup:.3f}x (95% CI "
              f"{result.speedup_ci[0]:.3f}-{result.speedup_ci[1]:.3f}){fallback}"
              + ("; held in a fresh process" if fresh is not None else ""))
    decision = frontier_decision(latency, point, reason, "verified", config, reported_accuracy(point))
    chosen = relabelled.candidates[index - 1]
    if fresh_record is not None:  # the fresh process's record speaks of what ships too
        fresh_record = replace(fresh_record, chosen=fresh_record.candidates[qualified.index(index)])
    return FrontierVerdict(Verdict(decision, replace(relabelled, chosen=chosen, reason=reason), fresh_record,
                                   journal=journal, notes=notes), point, measured)


def prediction_note(measured: Sequence[CandidateResult], fingerprint: Fingerprint) -> str | None:
    """A note where the latency model missed a verified schedule by more than PREDICTION_TOLERANCE (the
    measured speedups decide what ships; the frontier's order among the others rests on the prediction),
    with the allocator advice on a CPU under glibc's defaults, where this is most often why."""
    errors = [c.pruned_ms / c.predicted_ms - 1 for c in measured if c.predicted_ms]
    if not errors or max(map(abs, errors)) <= PREDICTION_TOLERANCE:
        return None
    worst = max(errors, key=abs)
    note = (f"the latency model missed the verified schedules by up to {worst:+.1%} (measured over predicted "
            "latency): their measured speedups decide, the order among the others is predicted")
    if fingerprint.kind == "cpu" and not fingerprint.allocator:
        note += ("; on CPU under glibc's defaults schedules that mix token counts ran up to 35% slower than their "
                 f"blocks measured alone: {STEADY_ADVICE}")
    return note


def relabel(verification: Verification, points: list[Evaluated], found: FrontierFound,
            numbers: list[int] | None = None) -> Verification:
    """The verification with each candidate named by the tokens its schedule removes in all (not its number)."""
    numbers = numbers or list(range(1, len(points) + 1))
    by_number = {c.remove: c for c in verification.candidates}
    candidates = tuple(replace(by_number[i], remove=sum(effective_removal(found.latency, p.candidate).values()))
                       for i, p in zip(numbers, points, strict=True))
    return replace(verification, candidates=candidates, chosen=None)


def verify_here(request: Request, run: Run, found: FrontierFound, points: list[Evaluated],
                schedules: dict[int, Schedule]) -> tuple[Verification, Path, tuple[str, ...]]:
    """The candidates verified in this process through the `verify` journal (started afresh where a resumed
    run's candidates changed)."""
    workload, config, settings = request.workload, request.config, request.settings
    n = run.geometry.num_tokens
    what = "whole model patched through apply_schedule (frontier schedules); tokens = N - candidate number"
    baseline = found.latency.baseline
    rounds = config.rounds_for(baseline, found.reps, len(points) + 1)
    keys = {"frontier": [p.candidate.key for p in points], "rounds": rounds, "reps": found.reps}
    session, journal, notes = verification_session(request, run, schedules, what, keys)
    verification = verify_candidates(
        session, n, list(range(1, len(points) + 1)), reps=found.reps, rounds=rounds,
        predicted_ratio={i: p.predicted_ms / baseline for i, p in enumerate(points, start=1)},
        min_gain=config.min_gain, min_step=settings.min_step, alpha=settings.step_alpha, seed=workload.seed,
        progress=workload.progress,
    )
    return verification, journal.path, notes
