"""A frontier schedule as the schedule file it ships as: its reducer and its removal at each block (what each
block really removes, ToMe's clamp applied), the decision that names it, and the `frontier` object that says
where it came from, how accurate it measured on each split and the best uniform schedule it beat."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pomt.formats.schedule import BlockRemoval, Schedule
from pomt.frontier.candidates import Candidate
from pomt.frontier.choice import Evaluated, Goal, Unresolved, held_out_drop, held_out_inside
from pomt.frontier.latency import LatencyModel
from pomt.offline.assemble import Evidence, build_schedule
from pomt.offline.config import FRONTIER, OfflineConfig
from pomt.offline.prepare import Run
from pomt.policies import Decision
from pomt.verification.verify import CandidateResult


def effective_removal(latency: LatencyModel, candidate: Candidate) -> dict[int, int]:
    """{block: tokens it really removes}: ToMe's r clamped to its cap, as the patch clamps it."""
    counts = latency.counts(candidate)
    return {b: counts[b] - counts[b + 1] for b in range(latency.depth) if counts[b] > counts[b + 1]}


def frontier_decision(latency: LatencyModel, point: Evaluated | None, reason: str, code: str,
                      config: OfflineConfig, accuracy: float | None) -> Decision:
    """The decision naming `point` (None: remove nothing): `remove` is the total removed, `block` the first
    pruning block (the prune block asked when nothing is removed), `kept_tokens` the count leaving the last
    block."""
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


def frontier_record(file: str, kind: str, goal: Goal, baseline: Evaluated, chosen: Evaluated | None,
                    uniform: Evaluated | None, measured: Mapping[Candidate, CandidateResult], evals: int,
                    unresolved: Unresolved | None = None) -> dict:
    """The schedule's `frontier` object (see the module docstring); speedups are the verification's, measured
    in the same paired rounds, where the schedules were verified. `unresolved`: the faster schedules the
    search split was too small to tell (`pomt.frontier.choice.unresolved`)."""

    def accuracies(point: Evaluated | None) -> dict | None:
        if point is None:
            return None
        return {"search": point.search.to_dict(),
                "held_out": None if point.held_out is None else point.held_out.to_dict()}

    def drop_bound(point: Evaluated) -> float | None:
        bound = point.search.drop_bound(goal.confidence)
        return None if bound is None else round(100 * bound, 3)

    def speedup(point: Evaluated | None) -> float | None:
        result = measured.get(point.candidate) if point is not None else None
        return None if result is None else round(result.speedup, 4)

    beat = None
    if uniform is not None:
        ours, theirs = speedup(chosen), speedup(uniform)
        beat = {"family": uniform.family, **uniform.candidate.to_dict(), "key": uniform.candidate.key,
                "predicted_ms": round(uniform.predicted_ms, 4), **accuracies(uniform),
                "verified_speedup": theirs,
                "speedup_over": None if ours is None or theirs is None else round(ours / theirs, 4),
                "predicted_speedup_over": None if chosen is None else
                round(uniform.predicted_ms / chosen.predicted_ms, 4)}
    return {"file": file, "accuracy_kind": kind, "max_accuracy_drop": goal.max_drop_points,
            "latency_budget_ms": goal.latency_budget_ms, "min_accuracy": goal.min_accuracy,
            "accuracy_confidence": goal.confidence, "evals": evals,
            "unpruned": accuracies(baseline), "chosen": None if chosen is None else
            {"family": chosen.family, "key": chosen.candidate.key, **accuracies(chosen),
             "search_drop_bound_points": drop_bound(chosen), "verified_speedup": speedup(chosen),
             "held_out_drop_points": None if (d := held_out_drop(chosen, baseline)) is None else round(d, 3),
             "held_out_inside_search_interval": held_out_inside(chosen)},
            "best_uniform": beat,
            "unresolved": None if unresolved is None else unresolved.to_dict(baseline, goal.confidence)}
