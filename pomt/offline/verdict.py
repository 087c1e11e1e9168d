"""What ships: the ranked removals checked on the patched model. The method's own cost at its block is
measured and the candidates ranked again with it; the best are verified against the unpruned model here
(journal `<stem>.verify.csv`) and, with `--verify-fresh`, once more in a fresh process (`pomt.verification.fresh`;
not journalled: a resumed run repeats it). A removal ships only where it qualified."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pomt.device.fingerprint import Fingerprint
from pomt.errors import TraceError
from pomt.formats.schedule import Schedule
from pomt.frontier.reducer_costs import cost_function, method_cost
from pomt.measurement.sources import LiveSource, Session, journal_end_s
from pomt.offline.assemble import Evidence, build_schedule
from pomt.offline.config import OfflineConfig, Request
from pomt.offline.latency import Latency
from pomt.offline.prepare import Run
from pomt.offline.ranking import Ranking, nothing, rank, verification_removals
from pomt.policies import Decision
from pomt.runtimes import IN_PROCESS, Backend
from pomt.verification.fresh import FreshJob, held_in_both, placement_hint, verify_in_fresh_process
from pomt.verification.launch_bound import measure_gpu_work
from pomt.verification.verify import CandidateResult, Verification, choose, schedule_forward_at
from pomt.verification.verify import verify as verify_candidates
from pomt.workload.prepare import open_journal

COST_PASSES = 3  # rankings redone with the method's cost measured where the last one moved verification


@dataclass(frozen=True)
class Verdict:
    """The decision to ship and what it rests on: the verification here (narrowed to the shipped
    candidate), the one in a fresh process, the method's cost by removal, the verification's journal."""

    decision: Decision
    verification: Verification | None = None
    fresh_verification: Verification | None = None
    method_cost: Mapping[int, float] = field(default_factory=dict)
    journal: Path | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FreshCheck:
    """The candidates that qualified here, measured in a fresh process: the one that qualified in both
    (None: none did), the fresh verdict in a sentence, this process's verification narrowed to it."""

    chosen: CandidateResult | None
    reason: str
    here: Verification
    fresh: Verification


def decide(request: Request, run: Run, ranking: Ranking) -> Verdict:
    """Nothing when no removal is ranked; the first one, unverified, on a replay or with --no-verify; else
    the one the patched model's measurements allow (`verify_ranked`)."""
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
    here, journal, opened = verify_here(request, run, ranking, schedules)
    fresh = None
    if here.chosen is not None and config.verify_fresh:
        fresh = verify_fresh(request, ranking, here, schedules)
    narrowed = here if fresh is None else fresh.here
    return Verdict(shipped(config, ranking, narrowed, fresh), verification=narrowed,
                   fresh_verification=None if fresh is None else fresh.fresh, method_cost=cost, journal=journal,
                   notes=notes + opened)


def charge_method_cost(request: Request, run: Run,
                       ranking: Ranking) -> tuple[dict[int, float], Ranking, tuple[str, ...]]:
    """Where the live model runs (eager, CUDA graphs: `IN_PROCESS`), the method's cost at its block for the
    removals verification would measure, in that runtime, and the ranking redone with it (`priced`); elsewhere
    no cost and a note (the verification measures the patched model)."""
    workload, config = request.workload, request.config
    if workload.backend not in IN_PROCESS:
        return {}, ranking, (f"method cost not measured on {workload.backend} (only where the live model runs: "
                             f"{', '.join(IN_PROCESS)}); verification measures the patched model there",)

    def measure(removals: list[int]) -> dict[int, float]:
        return method_cost(run.prepared.model, run.prepared.x, config.prune_block, config.method, removals,
                           run.setup.device, workload.threads, unpruned_ms=ranking.setting.baseline,
                           backend=workload.backend)

    cost, ranking = priced(config, ranking, measure)
    return cost, ranking, ()


def priced(config: OfflineConfig, ranking: Ranking, measure: Callable[[list[int]], dict[int, float]],
           passes: int = COST_PASSES) -> tuple[dict[int, float], Ranking]:
    """The method's cost measured (`measure`) at the removals verification would take, and the ranking redone
    with it. Where the cost moves the ranking to removals it was not measured at (beyond them it is only held
    at the last value), it is measured there too and the ranking redone, at most `passes` times: on an H100 the
    budget policy's ToMe cost, measured at 29 and 30 removed, sent verification to 76 and 77, priced there 8-14%
    slow."""
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
    """The schedules verification patches the model with, by kept tokens: the first-ranked decision at
    each removal `verification_removals` picks."""
    n, first = run.geometry.num_tokens, ranking.ranked[0]
    evidence = Evidence(steps=ranking.search.steps)
    return {n - r: build_schedule(run, config, replace(first, remove=r, kept_tokens=n - r), evidence)
            for r in verification_removals(ranking.ranked, config.verify_candidates)}


def verify_here(request: Request, run: Run, ranking: Ranking,
                schedules: dict[int, Schedule]) -> tuple[Verification, Path, tuple[str, ...]]:
    """The candidates verified in this process through its journal: the verification, the journal's path
    and a note where a resumed run's journal could not be continued."""
    workload, config, settings = request.workload, request.config, request.settings
    n, search = run.geometry.num_tokens, ranking.search
    removals = sorted(n - kept for kept in schedules)
    what = (f"whole model patched through apply_schedule ({config.method} at block {config.prune_block}); "
            "tokens = tokens kept")
    setting = ranking.setting
    rounds = config.rounds_for(setting.baseline, search.reps, len(removals) + 1)
    keys = {"removals": removals, "rounds": rounds, "reps": search.reps}
    session, journal, notes = verification_session(request, run, schedules, what, keys)
    verification = verify_candidates(
        session, n, removals, reps=search.reps, rounds=rounds,
        predicted_ratio={r: setting.predicted(n - r) / setting.baseline for r in removals},
        min_gain=config.min_gain, min_step=settings.min_step, alpha=settings.step_alpha, seed=workload.seed,
        progress=workload.progress,
    )
    return verification, journal.path, notes


def verification_session(request: Request, run: Run, schedules: Mapping[int, Schedule], what: str,
                         keys: dict) -> tuple[Session, object, tuple[str, ...]]:
    """A live session over the patched `schedules` (candidate number -> schedule) journalled as `verify`, its
    journal, and a note when a resumed run's candidates changed (the verification then starts afresh)."""
    workload, notes = request.workload, ()
    try:
        journal = open_journal(workload, run.prepared, "verify", what, keys)
    except TraceError:  # resumed, but the candidates (priced anew) changed: verify afresh
        journal = open_journal(replace(workload, resume=False), run.prepared, "verify", what, keys)
        notes = ("the verification started afresh: its candidates changed since the killed run",)
    forward_at = schedule_forward_at(run.prepared.model, run.prepared.x, schedules, backend=workload.backend,
                                     device=run.setup.device, threads=workload.threads,
                                     cache_dir=Path(workload.output_dir) / run.prepared.cache_dir)
    source = LiveSource(forward_at, run.setup.device, workload.threads, start_s=journal_end_s(journal),
                        backend=workload.backend)
    return Session(source, journal), journal, notes


def verify_fresh(request: Request, ranking: Ranking, here: Verification,
                 schedules: dict[int, Schedule]) -> FreshCheck:
    """The candidates that qualified here measured once more in a fresh process (`pomt.verification.fresh`); this
    process's verification is narrowed to the candidate that ships (or to none), so the schedule's
    `verified` speaks of what ships."""
    config, settings = request.config, request.settings
    n = ranking.setting.num_tokens
    qualified = [c.remove for c in here.candidates if c.qualifies]
    rounds = config.rounds_for(ranking.setting.baseline, ranking.search.reps, len(qualified) + 1)
    job = FreshJob(request.workload, {n - r: schedules[n - r] for r in qualified}, ranking.search.reps,
                   rounds, config.min_gain, settings.min_step, settings.step_alpha)
    fresh = verify_in_fresh_process(job)
    chosen, reason = held_in_both(here, fresh, config.min_gain, settings.min_step)
    if chosen is None:
        return FreshCheck(None, reason, replace(here, chosen=None, reason=f"{here.reason}; not {reason}"), fresh)
    mine = next(c for c in here.candidates if c.remove == chosen.remove)
    narrowed = replace(here, chosen=mine, reason=choose([mine], config.min_gain, settings.min_step)[1])
    return FreshCheck(chosen, reason, narrowed, fresh)


def shipped(config: OfflineConfig, ranking: Ranking, here: Verification, fresh: FreshCheck | None) -> Decision:
    """The decision the verification allows (`here` narrowed by `fresh` where a fresh process measured): the
    candidate that qualified, its reason saying what was measured; else nothing, saying why."""
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
    """The allocator advice (`placement_hint`) where steps within reach, or the removal, held in this process
    but not in the fresh one; None where none failed there or the advice does not apply."""
    steps = [f for f in latency.fresh_steps if not f["held"]]
    what = [f"{len(steps)} of {len(latency.fresh_steps)} steps within reach"] if steps else []
    if verdict.fresh_verification is not None and verdict.verification is not None \
            and verdict.verification.chosen is None:
        what.append("the removal")
    return placement_hint(fingerprint, " and ".join(what)) if what else None


def with_gpu_work(request: Request, run: Run, schedule: Schedule) -> tuple[Schedule, str | None]:
    """On a GPU, eager, where a schedule ships verified: the schedule with its GPU work against its verified
    latency (`pomt.verification.launch_bound`) and a note where it was launch-bound here; elsewhere as it was."""
    verified = schedule.verified
    if not schedule.prune or verified is None or request.workload.backend != Backend.EAGER.value:
        return schedule, None
    work = measure_gpu_work(run.prepared.model, run.prepared.x, schedule, run.setup.device, verified.pruned_ms)
    if work is None:
        return schedule, None
    return replace(schedule, verified=replace(verified, gpu_work=work.to_dict())), work.note(verified.speedup)
