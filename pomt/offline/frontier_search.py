"""The frontier search on the measured curve: each reducer's own cost measured inside the model, the latency
model of any schedule (`pomt.frontier.latency`), the search on the search split's measured accuracy
(`pomt.frontier.search`), then the held-out accuracy of the frontier, the unpruned model and every schedule
that may be verified (`to_verify`, the best uniform one among them); the schedules that may ship, best first
(`pomt.frontier.choice`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from pomt.frontier.calibration import HELD_OUT, SEARCH
from pomt.frontier.candidates import NONE, REDUCERS
from pomt.frontier.choice import Evaluated, Unresolved, best_uniform, preference, to_verify, unresolved, unresolved_note
from pomt.frontier.latency import LatencyModel, MixedCounts, ReducerCost
from pomt.frontier.reducer_costs import measure_mixed_counts, measure_reducer_costs
from pomt.frontier.search import FrontierResult, FrontierSettings, search_frontier, with_held_out
from pomt.io import atomic_write_json
from pomt.measurement.priced_curve import priced_curve
from pomt.offline.config import DEFAULT_DROP, Request
from pomt.offline.frontier_setup import FrontierSetup
from pomt.offline.latency import Latency
from pomt.offline.prepare import Run
from pomt.runtimes import IN_PROCESS

COSTS = "reducer-costs.json"


@dataclass(frozen=True)
class FrontierFound:
    """The search's result (held-out accuracies added), the latency model it priced schedules with, the
    schedules that may ship (best first), the best uniform one, those to measure on the patched model
    (`to_verify`, in the order of fallback), and where the time went (s)."""

    result: FrontierResult
    latency: LatencyModel
    shippable: tuple[Evaluated, ...]
    uniform: Evaluated | None
    reps: int = 1  # forwards per visit, as the latency search settled
    measured: int = 0  # accuracies measured by this run (the others were read from the journal)
    seconds: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    to_verify: tuple[Evaluated, ...] = ()
    unresolved: Unresolved | None = None  # faster schedules the search split was too small to tell


def costs_path(output_dir: str | Path, stem: str) -> Path:
    """`<output>/<stem>.reducer-costs.json`: the costs a resumed run prices its schedules with again."""
    return Path(output_dir) / f"{stem}.{COSTS}"


def reducer_costs(request: Request, run: Run) -> tuple[dict[str, ReducerCost], MixedCounts | None, tuple[str, ...]]:
    """Each reducer's own cost inside the model and the calibration of mixed counts (live runs, in the runtime
    measured where it runs the live model: eager or CUDA graphs), kept beside the outputs so that a resumed run
    prices every schedule as the killed one did (and so takes the same decisions); elsewhere none, with a
    note."""
    workload = request.workload
    if run.replay is not None or run.prepared.x is None:
        return {}, None, ("replayed trace: reducer costs not measured, schedules priced from the curve alone",)
    if workload.backend not in IN_PROCESS:
        return {}, None, (f"reducer costs not measured on {workload.backend} (only where the live model runs: "
                          f"{', '.join(IN_PROCESS)})",)
    path = costs_path(workload.output_dir, run.setup.stem)
    if workload.resume and path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            return ({m: ReducerCost.from_dict(c) for m, c in saved["reducers"].items()},
                    MixedCounts.from_dict(saved["mixed_counts"]), ())
        except (ValueError, KeyError, TypeError):
            pass  # unreadable or written before the mixed counts: measured again
    model, x, device = run.prepared.model, run.prepared.x, run.setup.device
    costs = measure_reducer_costs(model, x, REDUCERS, device=device, threads=workload.threads, seed=workload.seed,
                                  backend=workload.backend)
    mixed = measure_mixed_counts(model, x, device=device, threads=workload.threads, seed=workload.seed + 2,
                                 backend=workload.backend)
    atomic_write_json(path, {"reducers": {m: c.to_dict() for m, c in costs.items()}, "mixed_counts": mixed.to_dict()})
    return costs, mixed, ()


def search(request: Request, run: Run, setup: FrontierSetup, latency: Latency) -> FrontierFound:
    """Costs, latency model, search, held-out accuracies and the shippable schedules (module docstring)."""
    config, geometry, calibration, goal = request.config, run.geometry, setup.calibration, setup.goal
    started = time.perf_counter()
    costs, mixed, notes = reducer_costs(request, run)
    cost_s = time.perf_counter() - started
    model = LatencyModel(priced_curve(latency.search.points, latency.search.steps), geometry.num_tokens,
                         geometry.prefix_tokens, geometry.depth, costs, mixed)
    settings = FrontierSettings(
        max_evals=config.max_evals, latency_budget_ms=config.latency_budget_ms,
        max_accuracy_drop=goal.max_drop_points if goal.max_drop_points is not None else DEFAULT_DROP,
        confidence=goal.confidence,
        steps=tuple(sorted({s.fast_tokens for s in latency.search.steps})),
    )
    started = time.perf_counter()
    # past what the search tells apart an accuracy stops early, unless the goal reads accuracies that low
    stop = settings.closely_searched if goal.latency_budget_ms is None and goal.min_accuracy is None else None
    result = search_frontier(model, lambda cs: calibration.measure(cs, SEARCH, stop_above=stop), settings)
    verified = to_verify(result, goal, config.verify_candidates)  # what may ship, the best uniform one included
    wanted = [NONE, *(e.candidate for e in result.frontier), *(e.candidate for e in verified)]
    result = with_held_out(result, lambda cs: calibration.measure(cs, HELD_OUT), wanted)
    accuracy_s = time.perf_counter() - started
    seconds = {"reducer_costs": round(cost_s, 2), "accuracy": round(accuracy_s, 2),
               "latency": round(latency.seconds, 2)}
    by_candidate = {e.candidate: e for e in result.evaluated}  # the same schedules, held-out accuracy added
    stopped = stopped_note(result, calibration.size(SEARCH), settings.closely_searched)
    untold = unresolved(result, goal)
    share = calibration.size(HELD_OUT) / (calibration.size(SEARCH) + calibration.size(HELD_OUT))
    return FrontierFound(result, model, tuple(preference(result, goal)), best_uniform(result, goal),
                         latency.search.reps, calibration.evaluated, seconds,
                         notes + mixed_note(model) + result.notes + stopped
                         + unresolved_note(untold, result.baseline, goal, share),
                         tuple(by_candidate[e.candidate] for e in verified), untold)


def mixed_note(latency: LatencyModel) -> tuple[str, ...]:
    """What the latency model charges schedules for counts that change from block to block (`LatencyModel.kappa`);
    none where it charges nothing."""
    if latency.mixed is None or not latency.kappa:
        return ()
    mixed = latency.mixed
    return (f"mixed counts: a layout that changes its count at every block ran {100 * (mixed.over_blocks - 1):+.1f}% "
            f"[{100 * (mixed.ci[0] - 1):+.1f}, {100 * (mixed.ci[1] - 1):+.1f}] over its blocks' sum timed beside it; a "
            f"schedule whose counts change c times is charged {100 * latency.kappa:+.2f}% x sqrt(c) of its blocks",)


def stopped_note(result: FrontierResult, images: int, beyond: float) -> tuple[str, ...]:
    """A note on the schedules whose search-split accuracy stopped early (`Calibration.measure`'s
    `stop_above`), and the share of the images not run; none where none stopped."""
    short = [e.search.trials for e in result.evaluated if e.search.trials < images]
    if not short:
        return ()
    saved, total = len(short) * images - sum(short), len(result.evaluated) * images
    return (f"accuracy stopped early for {len(short)} of {len(result.evaluated)} schedules (drop surely beyond "
            f"{100 * beyond:g} points): {saved} of {total} image evaluations ({100 * saved / total:.0f}%) not run",)
