"""Stage 3, choose, with one of two choosers: a policy ranking removals at one block on the measured curve
(`pomt.policies`), or the frontier search across blocks and reducers. A decision is built as the schedule it would
ship as (`build_schedule`, `as_schedule`)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pomt.accuracy import AccuracyCurve
from pomt.errors import CalibrationError, PolicyError, SettingError
from pomt.formats.curve import rounded
from pomt.formats.schedule import BlockRemoval, Schedule, utc_now
from pomt.formats.schedule_parts import MeasurementRecord, Prediction, SchedulePolicy, Verified
from pomt.frontier.cache import AccuracyCache, canonical_json, default_cache_path
from pomt.frontier.calibration import (
    HELD_OUT,
    SEARCH,
    Calibration,
    Classifier,
    HostedCalibration,
    model_identity,
    split_indices,
)
from pomt.frontier.candidates import NONE, REDUCERS, Candidate
from pomt.frontier.certify import (
    EXPLORE,
    Certification,
    certification_notes,
    certification_promise,
    certified,
    certified_uniform,
    check_certifiable,
    held_out_size,
)
from pomt.frontier.choice import Evaluated, Goal, best_uniform, preference, to_verify
from pomt.frontier.distributed import ShardedCalibration
from pomt.frontier.latency import LatencyModel, MixedCounts, ReducerCost
from pomt.frontier.reducer_costs import COST_ROUNDS, measure_mixed_counts, measure_reducer_costs
from pomt.frontier.search import FrontierResult, FrontierSettings, search_frontier, with_held_out
from pomt.io import atomic_write_json
from pomt.measurement.robust import priced_curve
from pomt.measurement.search import SearchResult
from pomt.measurement.steps import Step
from pomt.models.geometry import Geometry
from pomt.offline.config import (
    DEFAULT_DROP,
    FRONTIER,
    OfflineConfig,
    Request,
    max_accuracy_drop,
    max_remove,
    policy_name,
)
from pomt.offline.measure import Latency, Run, Sample
from pomt.policies import Decision, Setting, rank_budget, rank_step, rank_utility
from pomt.runtimes import IN_PROCESS, parameter_dtype
from pomt.verification.verify import Rounds, TimedModel
from pomt.workload.prepare import Workload


@dataclass(frozen=True)
class Ranking:
    """The setting the policy ranked in, its candidates that remove something (best first), and its search."""

    setting: Setting
    ranked: tuple[Decision, ...]
    search: SearchResult


def policy_setting(config: OfflineConfig, geometry: Geometry, search: SearchResult,
                   accuracy: AccuracyCurve | None) -> Setting:
    """The curve, the model's geometry, where it prunes and how much it may remove, A(n) where known."""
    accuracy_at = accuracy.at(p.tokens for p in search.points) if accuracy else None
    return Setting(
        curve=priced_curve(search.points, search.steps), num_tokens=geometry.num_tokens,
        prefix_tokens=geometry.prefix_tokens, depth=geometry.depth, block=config.prune_block,
        max_remove=max_remove(config, geometry, accuracy_at is not None),
        accuracy=accuracy_at, min_accuracy=config.min_accuracy,
    )


def rank(config: OfflineConfig, setting: Setting, search: SearchResult) -> Ranking:
    """The policy's candidates that remove something, best first (see `pomt.policies`)."""
    policy = policy_name(config, setting.accuracy is not None)
    if policy == "utility":
        if setting.accuracy is None:
            raise PolicyError("the utility policy needs accuracy: give --dataset-root or --accuracy-curve")
        ranked = [d for d in rank_utility(setting, config.alpha) if d.remove > 0]
    elif policy == "budget":
        ranked = [d for d in rank_budget(setting, config.latency_budget_ms) if d.remove > 0]
    else:
        ranked = rank_step(setting, search.steps, config.min_gain)
    return Ranking(setting, tuple(ranked), search)


def nothing(config: OfflineConfig, ranking: Ranking, reason: str | None = None, code: str | None = None) -> Decision:
    """The decision to remove nothing, with the policy's reason unless given."""
    setting = ranking.setting
    policy = policy_name(config, setting.accuracy is not None)
    if reason is None:
        confirmed = len(ranking.search.steps)
        reason = (f"no confirmed step within {setting.limit} removed tokens pays at least {config.min_gain:.1%} at "
                  f"block {setting.block} ({confirmed} step{'s' if confirmed != 1 else ''} confirmed)")
        if (seen := ranking.search.detection_sentence()) is not None:
            reason += f"; {seen}"
        code = "no_step" if policy == "step" else "no_candidate"
    return setting.nothing(policy, reason, code)


def verification_removals(ranked: Sequence[Decision], count: int) -> list[int]:
    """The best-ranked removals, and the other side of the step the first one lands below (checked too)."""
    removals = [d.remove for d in ranked[:count]]
    target = ranked[0].target if ranked else None
    if target is not None:
        removals.append(ranked[0].remove - (target.upper_tokens - target.tokens))
    return sorted({r for r in removals if r > 0})


@dataclass(frozen=True)
class FrontierSetup:
    """The calibration images and their accuracy cache, and what the shipped schedule must meet."""

    calibration: Calibration | HostedCalibration  # hosted in a worker process while the frontier runs
    goal: Goal
    cache: Path


def cache_path(config: OfflineConfig, output_dir: str | Path, identity: Mapping) -> Path:
    """`--accuracy-cache`, else the model's file under `<output>/cache/accuracy/` (named by model and weights)."""
    return config.accuracy_cache or default_cache_path(Path(output_dir) / "cache", identity)


def goal_of(config: OfflineConfig) -> Goal:
    """The goal the options ask: a drop (default 1 point, none with only a budget), a budget, a floor, a confidence."""
    only_budget = config.latency_budget_ms is not None and config.max_accuracy_drop is None
    return Goal(None if only_budget else max_accuracy_drop(config), config.latency_budget_ms, config.min_accuracy,
                config.accuracy_confidence)


def held_out_share(config: OfflineConfig, images: int, max_drop_points: float | None) -> float:
    """The share of `images` held out: `--held-out`, else `held_out_size` where a drop is certified, else half."""
    if config.held_out is not None:
        return config.held_out
    if max_drop_points is None:
        return 0.5
    return held_out_size(images) / images


def check_folder_resolves(config: OfflineConfig, images: int, max_drop_points: float, seed: int) -> None:
    """Raise CalibrationError where the held-out split of `images` calibration images cannot certify the drop asked."""
    held = len(split_indices(images, held_out_share(config, images, max_drop_points), seed)[HELD_OUT])
    try:
        check_certifiable(held, max_drop_points / 100, config.accuracy_confidence, config.finalists)
    except CalibrationError as error:
        sample = "the whole folder" if config.accuracy_samples is None or config.accuracy_samples >= images \
            else "--accuracy-samples"
        raise CalibrationError(f"{sample}: {images} calibration images, {held} of them held out; {error}") from None


def prepare_frontier(workload: Workload, config: OfflineConfig, run: Run, sample: Sample,
                     sharded: bool = False) -> FrontierSetup:
    """Split and check the calibration images and open the shared accuracy cache (`sharded`: over the job's ranks)."""
    dataset, kind = sample
    model, geometry = run.prepared.model, run.geometry
    if run.prepared.grid and min(run.prepared.grid) > geometry.prefix_tokens + 1:
        raise SettingError(f"the frontier prices schedules down to {geometry.prefix_tokens + 1} kept tokens, but the "
                           f"grid stops at {min(run.prepared.grid)}: leave --grid-token-stop out, or give --policy "
                           "utility")
    goal = goal_of(config)
    if goal.max_drop_points is not None:
        check_folder_resolves(config, len(dataset), goal.max_drop_points, workload.seed)
    identity = model_identity(model)
    path = cache_path(config, workload.output_dir, identity)
    cache = AccuracyCache(path, identity)
    device = run.setup.device if run.replay is None else "cpu"
    classifier = Classifier(model, kind, device, parameter_dtype(model), config.accuracy_batch_size)
    share = held_out_share(config, len(dataset), goal.max_drop_points)
    kind_of = ShardedCalibration if sharded else Calibration
    calibration = kind_of(classifier, dataset, cache, held_out=share, seed=workload.seed,
                              progress=workload.progress)
    return FrontierSetup(calibration, goal, path)


COSTS = "reducer-costs.json"


@dataclass(frozen=True)
class FrontierFound:
    """The search's result with held-out accuracies, its latency model, what may ship and what to verify, the times."""

    result: FrontierResult
    latency: LatencyModel
    shippable: tuple[Evaluated, ...]
    uniform: Evaluated | None
    reps: int = 1  # forwards per visit, as the latency search settled
    measured: int = 0  # accuracies measured by this run (the others were read from the cache)
    seconds: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    to_verify: tuple[Evaluated, ...] = ()
    certification: Certification | None = None  # the finalists certified on the held-out images (a drop asked)


def costs_path(output_dir: str | Path, stem: str) -> Path:
    """`<output>/<stem>.reducer-costs.json`: the costs a resumed run prices its schedules with again."""
    return Path(output_dir) / f"{stem}.{COSTS}"


def reducer_costs(request: Request, run: Run) -> tuple[dict[str, ReducerCost], MixedCounts | None, tuple[str, ...]]:
    """Each reducer's own cost and the calibration of mixed counts (live runs in `IN_PROCESS` runtimes), kept
    beside the outputs so that a resumed run prices every schedule as the killed one did; else none and a note."""
    workload = request.workload
    path = costs_path(workload.output_dir, run.setup.stem)
    if workload.resume and path.is_file() and run.replay is None:
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            return ({m: ReducerCost.from_dict(c) for m, c in saved["reducers"].items()},
                    MixedCounts.from_dict(saved["mixed_counts"]), ())
        except (ValueError, KeyError, TypeError):
            pass  # unreadable or written before the mixed counts: measured again
    if run.replay is not None or run.prepared.x is None:
        return {}, None, ("replayed trace: reducer costs not measured, schedules priced from the curve alone",)
    if workload.backend not in IN_PROCESS:
        return {}, None, (f"reducer costs not measured on {workload.backend} (only where the live model runs: "
                          f"{', '.join(IN_PROCESS)})",)
    model, x, device = run.prepared.model, run.prepared.x, run.setup.device
    timed = TimedModel(model, x, device, workload.threads, workload.backend)
    costs = measure_reducer_costs(timed, REDUCERS, Rounds(COST_ROUNDS, seed=workload.seed))
    mixed = measure_mixed_counts(timed, Rounds(COST_ROUNDS, seed=workload.seed + 2))
    atomic_write_json(path, {"reducers": {m: c.to_dict() for m, c in costs.items()}, "mixed_counts": mixed.to_dict()})
    return costs, mixed, ()


def find_frontier(request: Request, run: Run, setup: FrontierSetup, latency: Latency) -> FrontierFound:
    """Costs, latency model, search, held-out accuracies and the shippable schedules (module docstring)."""
    config, geometry, calibration, goal = request.config, run.geometry, setup.calibration, setup.goal
    started = time.perf_counter()
    costs, mixed, notes = reducer_costs(request, run)
    cost_s = time.perf_counter() - started
    model = latency_model(geometry, latency, costs, mixed)
    settings = FrontierSettings(
        max_evals=config.max_evals, latency_budget_ms=config.latency_budget_ms,
        max_accuracy_drop=goal.max_drop_points if goal.max_drop_points is not None else DEFAULT_DROP,
        confidence=goal.confidence if goal.max_drop_points is None else EXPLORE,
        steps=tuple(sorted({s.fast_tokens for s in latency.search.steps})),
    )
    started = time.perf_counter()
    # past what the search tells apart an accuracy stops early, unless the goal reads accuracies that low
    stop = settings.closely_searched if goal.latency_budget_ms is None and goal.min_accuracy is None else None
    calibration.origin = search_origin(run.setup.stem, latency)
    known = calibration.known(SEARCH, stopped=stop is not None)  # what searches on other curves measured
    promise = None if goal.max_drop_points is None else certification_promise(goal, calibration.size(HELD_OUT),
                                                                               config.finalists)
    result = search_frontier(model, lambda cs: calibration.measure(cs, SEARCH, stop_above=stop), settings, known,
                             promise)
    if goal.max_drop_points is None:  # nothing to certify: what may ship, the best uniform one included, reported
        verified = to_verify(result, goal, config.verify_candidates)
        wanted = [NONE, *(e.candidate for e in result.frontier), *(e.candidate for e in verified)]
        result = with_held_out(result, lambda cs: calibration.measure(cs, HELD_OUT), wanted)
        certification, uniform = None, best_uniform(result, goal)
    else:
        result, certification = certified(result, goal, calibration, config.finalists, config.accuracy_batch_size)
        verified, uniform = certification.certified, certified_uniform(certification)
    accuracy_s = time.perf_counter() - started
    seconds = {"reducer_costs": round(cost_s, 2), "accuracy": round(accuracy_s, 2),
               "latency": round(latency.seconds, 2)}
    by_candidate = {e.candidate: e for e in result.evaluated}  # the same schedules, held-out accuracy added
    stopped = stopped_note(result, calibration.size(SEARCH), settings.closely_searched)
    share = calibration.size(HELD_OUT) / (calibration.size(SEARCH) + calibration.size(HELD_OUT))
    told = () if certification is None else certification_notes(certification, share)
    shippable = preference(result, goal) if certification is None else sorted(
        (by_candidate[p.candidate] for p in certification.certified), key=lambda p: (p.predicted_ms, p.candidate))
    return FrontierFound(result, model, tuple(shippable), uniform, latency.search.reps,
                         calibration.evaluated, seconds, notes + mixed_note(model) + result.notes + stopped + told,
                         tuple(by_candidate[e.candidate] for e in verified), certification)


def search_origin(stem: str, latency: Latency) -> str:
    """The origin of the accuracies this run measures: its stem and a digest of its latency curve's points and steps,
    the same for a resumed run of the same trace (and the split steps), another for another device's curve."""
    search = latency.search
    curve = {"points": [[p.tokens, round(p.latency_ms, 6)] for p in sorted(search.points, key=lambda p: p.tokens)],
             "steps": sorted([s.tokens, s.upper_tokens] for s in search.steps)}
    return f"{stem}:{hashlib.sha256(canonical_json(curve).encode()).hexdigest()[:12]}"


def latency_model(geometry: Geometry, latency: Latency, costs: Mapping[str, ReducerCost],
                  mixed: MixedCounts | None) -> LatencyModel:
    """The latency model of schedules: the priced curve of the latency search, the reducers' costs, mixed counts."""
    return LatencyModel(priced_curve(latency.search.points, latency.search.steps), geometry.num_tokens,
                        geometry.prefix_tokens, geometry.depth, costs, mixed)


def mixed_note(latency: LatencyModel) -> tuple[str, ...]:
    """What the latency model charges for counts that change from block to block; none where it charges nothing."""
    if latency.mixed is None or not latency.kappa:
        return ()
    mixed = latency.mixed
    return (f"mixed counts: a layout that changes its count at every block ran {100 * (mixed.over_blocks - 1):+.1f}% "
            f"[{100 * (mixed.ci[0] - 1):+.1f}, {100 * (mixed.ci[1] - 1):+.1f}] over its blocks' sum timed beside it; a "
            f"schedule whose counts change c times is charged {100 * latency.kappa:+.2f}% x sqrt(c) of its blocks",)


def stopped_note(result: FrontierResult, images: int, beyond: float) -> tuple[str, ...]:
    """A note on the schedules whose search-split accuracy stopped early; none where none stopped."""
    short = [e.search.trials for e in result.evaluated if e.search.trials < images]
    if not short:
        return ()
    saved, total = len(short) * images - sum(short), len(result.evaluated) * images
    return (f"accuracy stopped early for {len(short)} of {len(result.evaluated)} schedules (drop surely beyond "
            f"{100 * beyond:g} points): {saved} of {total} image evaluations ({100 * saved / total:.0f}%) not run",)


@dataclass(frozen=True)
class Evidence:
    """What a schedule reports beside its decision: steps, A(n) (None: unknown), measurement and verification."""

    steps: Sequence[Step] = ()
    accuracy: AccuracyCurve | None = None
    measurement: MeasurementRecord | None = None
    verified: Verified | None = None


def build_schedule(run: Run, config: OfflineConfig, decision: Decision, evidence: Evidence = Evidence()) -> Schedule:
    """The schedule that applies `decision` to the run's model, as measured on the run's device."""
    geometry, fingerprint, live = run.geometry, run.setup.fingerprint, run.replay is None
    return Schedule(
        model=geometry.model, input_size=geometry.input_size, batch_size=run.setup.batch_size,
        num_tokens=geometry.num_tokens, prefix_tokens=geometry.prefix_tokens, depth=geometry.depth,
        method=config.method, prune=(BlockRemoval(decision.block, decision.remove),) if decision.remove > 0 else (),
        policy=policy_record(config, decision, max_remove(config, geometry, evidence.accuracy is not None)),
        predicted=prediction(decision, evidence.accuracy), steps=[rounded(step.to_dict()) for step in evidence.steps],
        device=fingerprint, curve=f"{run.setup.stem}.curve.csv", created=utc_now(),
        dtype=fingerprint.dtype or "float32",  # a replayed trace's, when its sidecar says
        backend=fingerprint.backend if live else None, measurement=evidence.measurement, verified=evidence.verified,
    )


def policy_record(config: OfflineConfig, decision: Decision, limit: int) -> SchedulePolicy:
    """The policy that decided, its settings (`limit`: the most it could remove) and its reason."""
    return SchedulePolicy(
        name=decision.policy, alpha=config.alpha if decision.policy == "utility" else None, max_remove=limit,
        min_gain=config.min_gain, latency_budget_ms=config.latency_budget_ms, min_accuracy=config.min_accuracy,
        prune_block=config.prune_block, reason=decision.reason, reason_code=decision.code,
    )


def prediction(decision: Decision, accuracy: AccuracyCurve | None) -> Prediction:
    """The decision's predicted latencies and gain, rounded as the schedule keeps them, and its A(n)."""
    return Prediction(
        baseline_ms=round(decision.baseline_ms, 4), pruned_ms=round(decision.predicted_ms, 4),
        gain=round(decision.gain, 5), accuracy=decision.accuracy, accuracy_kind=accuracy.kind if accuracy else None,
    )


def effective_removal(latency: LatencyModel, candidate: Candidate) -> dict[int, int]:
    """{block: tokens it really removes}: ToMe's r clamped to its cap, as the patch clamps it."""
    counts = latency.counts(candidate)
    return {b: counts[b] - counts[b + 1] for b in range(latency.depth) if counts[b] > counts[b + 1]}


def frontier_decision(latency: LatencyModel, point: Evaluated | None, reason: str, code: str,
                      config: OfflineConfig, accuracy: float | None) -> Decision:
    """The decision naming `point` (None: remove nothing), its block the first pruning one."""
    baseline = latency.baseline
    if point is None:
        return Decision(0, config.prune_block, latency.num_tokens, baseline, baseline, 0.0, accuracy, FRONTIER,
                        reason, code)
    removal = effective_removal(latency, point.candidate)
    gain = 1.0 - point.predicted_ms / baseline if baseline > 0 else 0.0
    return Decision(sum(removal.values()), min(removal), latency.num_tokens - sum(removal.values()), baseline,
                    point.predicted_ms, gain, accuracy, FRONTIER, reason, code)


def as_schedule(schedule: Schedule, latency: LatencyModel, candidate: Candidate | None,
                frontier: Mapping | None = None) -> Schedule:
    """`schedule` (built from a frontier decision) with the candidate's reducer and per-block removals."""
    if candidate is None or candidate.unpruned:
        return replace(schedule, prune=(), frontier=None if frontier is None else dict(frontier))
    removal = effective_removal(latency, candidate)
    return replace(schedule, method=candidate.method,
                   prune=tuple(BlockRemoval(b, r) for b, r in sorted(removal.items())),
                   frontier=None if frontier is None else dict(frontier))


def candidate_schedule(run: Run, config: OfflineConfig, latency: LatencyModel, point: Evaluated) -> Schedule:
    """The schedule verification patches the model with for `point`."""
    decision = frontier_decision(latency, point, "candidate under verification", "candidate", config, None)
    return as_schedule(build_schedule(run, config, decision, Evidence()), latency, point.candidate)
