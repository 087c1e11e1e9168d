"""Stage 4, verify: the chosen candidates measured on the patched model against the unpruned one in paired
shuffled rounds (journal `<stem>.verify.csv`), then once more in a fresh process; a schedule ships only where it
qualified in both. A policy's ranking is first redone with the reducer's own cost measured at its block."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pomt.device.allocator import STEADY_ADVICE
from pomt.device.fingerprint import Fingerprint
from pomt.errors import TraceError
from pomt.formats.schedule import Schedule
from pomt.frontier.candidates import FAMILIES, Candidate
from pomt.frontier.choice import Evaluated, verified_choice
from pomt.frontier.reducer_costs import cost_function, method_cost
from pomt.measurement.sources import LiveSource, MeasurementRun, journal_end_s
from pomt.offline.choose import (
    Evidence,
    FrontierFound,
    Ranking,
    build_schedule,
    candidate_schedule,
    effective_removal,
    frontier_decision,
    goal_of,
    nothing,
    rank,
    verification_removals,
)
from pomt.offline.config import OfflineConfig, Request
from pomt.offline.measure import Latency, Run
from pomt.policies import Decision
from pomt.runtimes import IN_PROCESS, Backend
from pomt.verification.fresh import FreshJob, held_in_both, placement_hint, verify_in_fresh_process
from pomt.verification.verify import (
    CandidateResult,
    Criterion,
    Rounds,
    TimedModel,
    Verification,
    choose,
    measure_gpu_work,
    schedule_forward_at,
)
from pomt.verification.verify import verify as verify_candidates
from pomt.workload.prepare import open_journal

COST_PASSES = 3  # rankings redone with the method's cost measured where the last one moved verification


@dataclass(frozen=True)
class Verdict:
    """The decision to ship and what it rests on (verifications here, narrowed to what ships, and fresh)."""

    decision: Decision
    verification: Verification | None = None
    fresh_verification: Verification | None = None
    method_cost: Mapping[int, float] = field(default_factory=dict)
    journal: Path | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FreshCheck:
    """The candidate that qualified here and in a fresh process (None: none did), and both verifications."""

    chosen: CandidateResult | None
    reason: str
    here: Verification
    fresh: Verification


def decide(request: Request, run: Run, ranking: Ranking) -> Verdict:
    """Nothing when nothing is ranked; the first, unverified, on a replay or with --no-verify; else the verified one."""
    config = request.config
    if not ranking.ranked:
        return Verdict(nothing(config, ranking))
    if run.replay is not None or not config.verify:
        note = ("replayed trace: the patched model was not measured, the schedule is unverified"
                if run.replay is not None else "--no-verify: the schedule is unverified")
        return Verdict(ranking.ranked[0], notes=(note,))
    return verify_ranked(request, run, ranking)


def verify_ranked(request: Request, run: Run, ranking: Ranking) -> Verdict:
    """Charge the method's cost and rank again, verify the best candidates here and in a fresh process."""
    config = request.config
    cost, ranking, notes = charge_method_cost(request, run, ranking)
    if not ranking.ranked:
        reason = (f"with its own cost at block {config.prune_block} measured, no removal is predicted to pay at "
                  f"least {config.min_gain:.1%}")
        return Verdict(nothing(config, ranking, reason, "method_cost"), method_cost=cost, notes=notes)
    schedules = candidate_schedules(run, config, ranking)
    n, setting = run.geometry.num_tokens, ranking.setting
    removals = sorted(n - kept for kept in schedules)
    what = (f"whole model patched through apply_schedule ({config.method} at block {config.prune_block}); "
            "tokens = tokens kept")
    predicted = {r: setting.predicted(n - r) / setting.baseline for r in removals}
    job = ToVerify(schedules, predicted, setting.baseline, ranking.search.reps, what, {"removals": removals})
    here, journal, opened = verify_here(request, run, job)
    fresh = None
    if here.chosen is not None and config.verify_fresh:
        fresh = verify_fresh(request, ranking, here, schedules)
    narrowed = here if fresh is None else fresh.here
    return Verdict(shipped(config, ranking, narrowed, fresh), verification=narrowed,
                   fresh_verification=None if fresh is None else fresh.fresh, method_cost=cost, journal=journal,
                   notes=notes + opened)


def charge_method_cost(request: Request, run: Run,
                       ranking: Ranking) -> tuple[dict[int, float], Ranking, tuple[str, ...]]:
    """The method's cost and the ranking redone with it where the live model runs; elsewhere none and a note."""
    workload, config = request.workload, request.config
    if workload.backend not in IN_PROCESS:
        return {}, ranking, (f"method cost not measured on {workload.backend} (only where the live model runs: "
                             f"{', '.join(IN_PROCESS)}); verification measures the patched model there",)

    def measure(removals: list[int]) -> dict[int, float]:
        timed = TimedModel(run.prepared.model, run.prepared.x, run.setup.device, workload.threads, workload.backend)
        return method_cost(timed, config.prune_block, config.method, removals, unpruned_ms=ranking.setting.baseline)

    cost, ranking = priced(config, ranking, measure)
    return cost, ranking, ()


def priced(config: OfflineConfig, ranking: Ranking, measure: Callable[[list[int]], dict[int, float]],
           passes: int = COST_PASSES) -> tuple[dict[int, float], Ranking]:
    """The method's cost at the removals verification would take and the ranking redone, up to `passes` times."""
    cost: dict[int, float] = {}
    unpriced = ranking.setting
    for _ in range(passes):
        removals = [r for r in verification_removals(ranking.ranked, config.verify_candidates) if r not in cost]
        if not removals:
            break
        cost |= measure(removals)
        ranking = rank(config, replace(unpriced, method_cost=cost_function(cost)), ranking.search)
    return cost, ranking


def candidate_schedules(run: Run, config: OfflineConfig, ranking: Ranking) -> dict[int, Schedule]:
    """The schedules verification patches the model with, by kept tokens."""
    n, first = run.geometry.num_tokens, ranking.ranked[0]
    evidence = Evidence(steps=ranking.search.steps)
    return {n - r: build_schedule(run, config, replace(first, remove=r, kept_tokens=n - r), evidence)
            for r in verification_removals(ranking.ranked, config.verify_candidates)}


def verify_fresh(request: Request, ranking: Ranking, here: Verification, schedules: dict[int, Schedule]) -> FreshCheck:
    """What qualified here measured in a fresh process; this process's verification narrowed to what ships."""
    config, settings = request.config, request.settings
    n = ranking.setting.num_tokens
    qualified = [c.remove for c in here.candidates if c.qualifies]
    rounds = config.rounds_for(ranking.setting.baseline, ranking.search.reps, len(qualified) + 1)
    job = FreshJob(request.workload, {n - r: schedules[n - r] for r in qualified},
                   Rounds(rounds, ranking.search.reps, request.workload.seed),
                   Criterion(config.min_gain, settings.min_step, settings.step_alpha))
    fresh = verify_in_fresh_process(job)
    chosen, reason = held_in_both(here, fresh, Criterion(config.min_gain, settings.min_step))
    if chosen is None:
        return FreshCheck(None, reason, replace(here, chosen=None, reason=f"{here.reason}; not {reason}"), fresh)
    mine = next(c for c in here.candidates if c.remove == chosen.remove)
    narrowed = replace(here, chosen=mine, reason=choose([mine], config.min_gain, settings.min_step)[1])
    return FreshCheck(chosen, reason, narrowed, fresh)


def shipped(config: OfflineConfig, ranking: Ranking, here: Verification, fresh: FreshCheck | None) -> Decision:
    """The decision the verification allows, its reason saying what was measured; else nothing, saying why."""
    if here.chosen is None and fresh is None:
        return nothing(config, ranking, here.reason, "not_faster")
    if fresh is not None and fresh.chosen is None:
        return nothing(config, ranking, f"verified here, not {fresh.reason}", "not_in_fresh_process")
    chosen = here.chosen if fresh is None else fresh.chosen
    first, n = ranking.ranked[0], ranking.setting.num_tokens
    beside = f"the other side of the step the policy's first choice targets ({first.reason})"
    by_remove = {d.remove: d for d in ranking.ranked}
    decision = by_remove.get(chosen.remove) or ranking.setting.decision(n - chosen.remove, first.policy, beside,
                                                                        first.code)
    fresh_reason = "" if fresh is None else fresh.reason
    verified = "; ".join(filter(None, [decision.reason, f"verified: {here.reason}", fresh_reason]))
    return replace(decision, reason=verified, code="verified")


def here_only_note(fingerprint: Fingerprint, latency: Latency, verdict: Verdict) -> str | None:
    """The allocator advice where something held here but not in the fresh process; None where it does not apply."""
    steps = [f for f in latency.fresh_steps if not f["held"]]
    what = [f"{len(steps)} of {len(latency.fresh_steps)} steps within reach"] if steps else []
    if verdict.fresh_verification is not None and verdict.verification is not None \
            and verdict.verification.chosen is None:
        what.append("the removal")
    return placement_hint(fingerprint, " and ".join(what)) if what else None


def with_gpu_work(request: Request, run: Run, schedule: Schedule) -> tuple[Schedule, str | None]:
    """The schedule with its GPU work where it ships verified on an eager GPU run, and a note if launch-bound."""
    verified = schedule.verified
    if not schedule.prune or verified is None or request.workload.backend != Backend.EAGER.value:
        return schedule, None
    work = measure_gpu_work(run.prepared.model, run.prepared.x, schedule, run.setup.device, verified.pruned_ms)
    if work is None:
        return schedule, None
    return replace(schedule, verified=replace(verified, gpu_work=work.to_dict())), work.note(verified.speedup)


PREDICTION_TOLERANCE = 0.03  # the latency model's goal for multi-block schedules (benchmarks/prediction_error.py)


@dataclass(frozen=True)
class FrontierVerdict:
    """The verdict, the schedule that ships (None: nothing), and every verified candidate's result here."""

    verdict: Verdict
    chosen: Evaluated | None = None
    measured: dict[Candidate, CandidateResult] = field(default_factory=dict)
    uniform: Evaluated | None = None  # the uniform schedule to beat: of those that may ship, the fastest measured


def fastest_uniform(points: Sequence[Evaluated], measured: Mapping[Candidate, CandidateResult]) -> Evaluated | None:
    """The uniform-family schedule among `points` measured fastest (None: none was)."""
    uniform = [p for p in points if p.family in FAMILIES and p.candidate in measured]
    return max(uniform, key=lambda p: (measured[p.candidate].speedup, p.candidate), default=None)


def reported_accuracy(point: Evaluated) -> float:
    """The accuracy a schedule reports: its held-out one where measured, else its search one."""
    return point.held_out.value if point.held_out is not None else point.accuracy


def decide_frontier(request: Request, run: Run, found: FrontierFound, goal: str) -> FrontierVerdict:
    """Nothing when no frontier schedule meets `goal` (words); unverified on a replay or --no-verify; else verified."""
    config, latency = request.config, found.latency
    if not found.shippable:
        certification = found.certification
        if certification is not None and certification.finalists:
            c = certification.certifier
            reason, code = (f"none of {len(certification.finalists)} finalists certified {goal} on up to {c.images} "
                            "held-out images"), "not_certified"
        else:
            reason, code = (f"no schedule on the frontier is predicted faster than the unpruned model and {goal} "
                            f"({len(found.result.evaluated)} schedules evaluated)"), "no_candidate"
        decision = frontier_decision(latency, None, reason, code, config, reported_accuracy(found.result.baseline))
        return FrontierVerdict(Verdict(decision), uniform=found.uniform)
    if run.replay is not None or not config.verify:
        note = ("replayed trace: the patched model was not measured, the schedule is unverified"
                if run.replay is not None else "--no-verify: the schedule is unverified")
        first = found.shippable[0]
        decision = frontier_decision(latency, first, f"the best frontier schedule, {first.candidate.key} "
                                     f"({first.family}), {goal}", "unverified", config, reported_accuracy(first))
        return FrontierVerdict(Verdict(decision, notes=(note,)), first, uniform=found.uniform)
    return verify_shippable(request, run, found)


def verify_shippable(request: Request, run: Run, found: FrontierFound) -> FrontierVerdict:
    """Verify `found.to_verify`: the best shippable schedules, each reducer's best and the best uniform one."""
    workload, config, settings = request.workload, request.config, request.settings
    n, latency = run.geometry.num_tokens, found.latency
    points = list(found.to_verify)
    schedules = {n - i: candidate_schedule(run, config, latency, p) for i, p in enumerate(points, start=1)}
    what = "whole model patched through apply_schedule (frontier schedules); tokens = N - candidate number"
    predicted = {i: p.predicted_ms / latency.baseline for i, p in enumerate(points, start=1)}
    job = ToVerify(schedules, predicted, latency.baseline, found.reps, what,
                   {"frontier": [p.candidate.key for p in points]})
    here, journal, notes = verify_here(request, run, job)
    notes += tuple(filter(None, [prediction_note(here.candidates, run.setup.fingerprint)]))
    by_index = {c.remove: c for c in here.candidates}
    measured = {p.candidate: by_index[i] for i, p in enumerate(points, start=1)}
    uniform = fastest_uniform(points, measured) or found.uniform
    shippable = list(range(1, len(points) + 1))  # the best uniform schedule meets the goal too
    qualified = [i for i in shippable if by_index[i].qualifies]
    fresh, held = None, None
    if qualified and config.verify_fresh:
        rounds = config.rounds_for(latency.baseline, found.reps, len(qualified) + 1)
        job = FreshJob(workload, {n - i: schedules[n - i] for i in qualified},
                       Rounds(rounds, found.reps, workload.seed),
                       Criterion(config.min_gain, settings.min_step, settings.step_alpha))
        fresh = verify_in_fresh_process(job)
        held = {c.remove for c in fresh.candidates if c.qualifies}
    index = verified_choice(shippable, {i: c.speedup for i, c in by_index.items()}, qualified, held, goal_of(config))
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
                                       journal=journal, notes=notes), None, measured, uniform)
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
                                   journal=journal, notes=notes), point, measured, uniform)


def prediction_note(measured: Sequence[CandidateResult], fingerprint: Fingerprint) -> str | None:
    """A note where the latency model missed a verified schedule by more than PREDICTION_TOLERANCE; else None."""
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


@dataclass(frozen=True)
class ToVerify:
    """What a verification measures: schedules by candidate number, their predicted latency ratio, what sizes rounds."""

    schedules: Mapping[int, Schedule]
    predicted: Mapping[int, float]
    baseline_ms: float
    reps: int
    what: str
    keys: dict


def verify_here(request: Request, run: Run, job: ToVerify) -> tuple[Verification, Path, tuple[str, ...]]:
    """The verification here, its journal's path, and a note where a resumed run's candidates changed."""
    workload, config, settings = request.workload, request.config, request.settings
    rounds = config.rounds_for(job.baseline_ms, job.reps, len(job.predicted) + 1)
    keys, notes = {**job.keys, "rounds": rounds, "reps": job.reps}, ()
    try:
        journal = open_journal(workload, run.prepared, "verify", job.what, keys)
    except TraceError:  # resumed, but the candidates (priced anew) changed: verify afresh
        journal = open_journal(replace(workload, resume=False), run.prepared, "verify", job.what, keys)
        notes = ("the verification started afresh: its candidates changed since the killed run",)
    timed = TimedModel(run.prepared.model, run.prepared.x, run.setup.device, workload.threads, workload.backend)
    forward_at = schedule_forward_at(timed, job.schedules, Path(workload.output_dir) / run.prepared.cache_dir)
    source = LiveSource(forward_at, run.setup.device, workload.threads, start_s=journal_end_s(journal),
                        backend=workload.backend)
    verification = verify_candidates(
        MeasurementRun(source, journal), run.geometry.num_tokens, job.predicted,
        Rounds(rounds, job.reps, workload.seed), Criterion(config.min_gain, settings.min_step, settings.step_alpha),
        progress=workload.progress,
    )
    return verification, journal.path, notes
