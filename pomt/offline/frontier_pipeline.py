"""The frontier policy's stages after the latency curve: the search (`frontier_search`), the verdict
(`frontier_verdict`), the schedule that ships with its `frontier` object, and the frontier's files."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pomt.formats.schedule import Schedule
from pomt.frontier.choice import held_out_note
from pomt.frontier.report import FrontierReport, document, rows
from pomt.offline.config import Request
from pomt.offline.frontier_schedule import as_schedule, frontier_record
from pomt.offline.frontier_search import FrontierFound, search
from pomt.offline.frontier_setup import FrontierSetup
from pomt.offline.frontier_verdict import FrontierVerdict, decide_frontier
from pomt.offline.latency import Latency
from pomt.offline.prepare import Run
from pomt.offline.ranking import Ranking, policy_setting
from pomt.offline.records import Findings, final_schedule
from pomt.offline.verdict import with_gpu_work


@dataclass(frozen=True)
class FrontierRun:
    """What the frontier stages found and what they write."""

    found: FrontierFound
    verdict: FrontierVerdict
    findings: Findings
    schedule: Schedule
    report: FrontierReport


def choose_on_frontier(request: Request, run: Run, setup: FrontierSetup, latency: Latency) -> FrontierRun:
    """Search, verify, and build the schedule and the frontier's files (see the module docstring)."""
    config, settings, goal = request.config, request.settings, setup.goal
    found = search(request, run, setup, latency)
    verdict = decide_frontier(request, run, found, goal.describe())
    note = held_out_note(verdict.chosen, found.result.baseline, goal)
    if note is not None:
        verdict = replace(verdict, verdict=replace(verdict.verdict, notes=(*verdict.verdict.notes, note)))
    ranking = Ranking(policy_setting(config, run.geometry, latency.search, None), (), latency.search)
    findings = Findings(latency, None, ranking, verdict.verdict)
    kind, stem, result = setup.calibration.kind, run.setup.stem, found.result
    chosen = None if verdict.chosen is None else verdict.chosen.candidate
    record = frontier_record(f"{stem}.frontier.json", kind, goal, result.baseline, verdict.chosen, found.uniform,
                             verdict.measured, result.evals, found.unresolved)
    schedule = final_schedule(run, config, settings, findings)
    schedule = as_schedule(replace(schedule, predicted=replace(schedule.predicted, accuracy_kind=kind)),
                           found.latency, chosen, record)
    schedule, launch = with_gpu_work(request, run, schedule)
    if launch is not None:
        verdict = replace(verdict, verdict=replace(verdict.verdict, notes=(*verdict.verdict.notes, launch)))
    table = rows(result, found.latency.baseline, chosen, verdict.measured, goal.confidence, goal.max_drop_points)
    facts = {"model": run.geometry.model, "stem": stem, "batch_size": run.setup.batch_size,
             "accuracy_kind": kind, "search_images": setup.calibration.size("search"),
             "held_out_images": setup.calibration.size("held_out"), "max_accuracy_drop": goal.max_drop_points,
             "latency_budget_ms": goal.latency_budget_ms, "min_accuracy": goal.min_accuracy,
             "accuracy_confidence": goal.confidence, "chosen": None if chosen is None else chosen.key,
             "best_uniform": record["best_uniform"], "unresolved": record["unresolved"],
             "seconds": found.seconds, "journal": setup.journal.name,
             "reducer_costs": {m: c.to_dict() for m, c in found.latency.costs.items()},
             "mixed_counts": None if found.latency.mixed is None else {**found.latency.mixed.to_dict(),
                                                                       "kappa": round(found.latency.kappa, 6)}}
    floor = None if goal.max_drop_points is None else result.baseline.accuracy - goal.max_drop_points / 100
    title = (f"{run.geometry.model}, batch {run.setup.batch_size}, {kind} on {facts['search_images']} search "
             f"images: {result.evals} schedules measured")
    notes = [*found.notes, *verdict.verdict.notes]
    return FrontierRun(found, verdict, findings, schedule,
                       FrontierReport(table, document(result, table, facts, notes), floor, title))
