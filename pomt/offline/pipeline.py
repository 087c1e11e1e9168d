"""Stage 6, `run_offline`: the stages strung together, one pipeline with two choosers, and `OfflineResult`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pomt.accuracy import AccuracyCurve, save_accuracy_curve
from pomt.device.fingerprint import Fingerprint
from pomt.formats.schedule import Schedule
from pomt.frontier.calibration import HELD_OUT, SEARCH, hosted
from pomt.frontier.choice import Goal
from pomt.frontier.report import FrontierReport, document, rows
from pomt.measurement.search import SearchResult, SearchSettings
from pomt.models.geometry import Geometry
from pomt.offline.choose import (
    FrontierFound,
    FrontierSetup,
    Ranking,
    as_schedule,
    find_frontier,
    policy_setting,
    prepare_frontier,
    rank,
)
from pomt.offline.config import FRONTIER, OfflineConfig, Request, max_remove, policy_name, validate
from pomt.offline.measure import (
    Latency,
    Run,
    Sample,
    accuracy_sample,
    check_steps_in_fresh_process,
    estimate_accuracy,
    given_accuracy,
    measure_latency,
    prepare_run,
)
from pomt.offline.verify import FrontierVerdict, decide, decide_frontier, here_only_note, with_gpu_work
from pomt.offline.write import Findings, final_schedule, frontier_record, output_names, prepare_outputs, write_outputs
from pomt.policies import Decision
from pomt.verification.verify import Verification
from pomt.workload.prepare import Workload, journalled


@dataclass(frozen=True)
class OfflineResult:
    """What a run found and wrote."""

    geometry: Geometry
    device: Fingerprint
    batch_size: int  # the run's: a replay's is its trace's, whatever --batch-size says
    search: SearchResult | None = None
    accuracy: AccuracyCurve | None = None
    decision: Decision | None = None
    verification: Verification | None = None
    fresh_verification: Verification | None = None  # the same candidates measured in a new process
    fresh_steps: list[dict] = field(default_factory=list)  # the steps within reach, checked in a new process
    method_cost: dict[int, float] = field(default_factory=dict)
    schedule: Schedule | None = None
    paths: dict[str, Path] = field(default_factory=dict)
    measure_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    frontier: FrontierRun | None = None  # the frontier search, where its policy chose


def run_offline(workload: Workload, config: OfflineConfig | None = None,
                settings: SearchSettings | None = None) -> OfflineResult:
    """Run every stage the configuration asks for and write the outputs; Ctrl-C raises `Interrupted`."""
    request = Request(workload, config or OfflineConfig(), settings or SearchSettings())
    config, settings = request.config, request.settings
    validate(config, settings)
    workload.check()
    run = prepare_run(workload, config, settings)
    with journalled(run.prepared):
        prepare_outputs(Path(workload.output_dir), run.setup.stem)
        sample = accuracy_sample(workload, config, run)
        if config.accuracy_only:
            return accuracy_only(workload, config, run, sample)
        return measure_and_choose(request, run, sample)


def measure_and_choose(request: Request, run: Run, sample: Sample | None) -> OfflineResult:
    """The frontier policy, else the step or utility policy (`measure_and_rank`); the outputs written."""
    workload, config = request.workload, request.config
    accuracy = given_accuracy(config, run)
    known = accuracy is not None or sample is not None
    if policy_name(config, known) != FRONTIER:
        return measure_and_rank(request, run, sample, accuracy, known)
    frontier = prepare_frontier(workload, config, run, sample)
    with hosted(frontier.calibration) as calibration:  # its accuracy measured in a worker, nothing timed there
        frontier = replace(frontier, calibration=calibration)
        latency = measure_latency(request, run, run.geometry.num_tokens - max_remove(config, run.geometry, known))
        paths = {} if latency.trace is None else {"trace": latency.trace}
        return frontier_result(request, run, choose_on_frontier(request, run, frontier, latency), paths)


def measure_and_rank(request: Request, run: Run, sample: Sample | None, accuracy: AccuracyCurve | None,
                     known: bool) -> OfflineResult:
    """The step and utility policies: latency, A(n), the ranking, the verdict and the schedule, written."""
    workload, config, settings = request.workload, request.config, request.settings
    reach = run.geometry.num_tokens - max_remove(config, run.geometry, known)
    latency = measure_latency(request, run, reach)
    if run.replay is None and config.verify_fresh and policy_name(config, known) == "step":
        latency = check_steps_in_fresh_process(workload, settings, latency, reach)
    paths = {} if latency.trace is None else {"trace": latency.trace}
    if sample is not None:
        accuracy = estimate_accuracy(workload, config, run, sample, latency.search.steps)
    ranking = rank(config, policy_setting(config, run.geometry, latency.search, accuracy), latency.search)
    verdict = decide(request, run, ranking)
    findings = Findings(latency, accuracy, ranking, verdict, measured_accuracy=sample is not None)
    if verdict.journal is not None:
        paths["verify"] = verdict.journal
    schedule, launch = with_gpu_work(request, run, final_schedule(run, config, settings, findings))
    paths |= write_outputs(Path(workload.output_dir), run, config, findings, schedule)
    note = here_only_note(run.setup.fingerprint, latency, verdict)
    return OfflineResult(
        geometry=run.geometry, device=run.setup.fingerprint, batch_size=run.setup.batch_size, search=latency.search,
        accuracy=accuracy, decision=verdict.decision, verification=verdict.verification,
        fresh_verification=verdict.fresh_verification, fresh_steps=list(latency.fresh_steps),
        method_cost=dict(verdict.method_cost), schedule=schedule, paths=paths, measure_seconds=latency.seconds,
        notes=[*verdict.notes, *(n for n in (note, launch) if n)],
    )


def frontier_result(request: Request, run: Run, chosen: FrontierRun, paths: dict) -> OfflineResult:
    """The frontier policy's outputs written (the run's set with the frontier's files), and its result."""
    latency, verdict = chosen.findings.latency, chosen.verdict.verdict
    if verdict.journal is not None:
        paths["verify"] = verdict.journal
    paths["accuracy_cache"] = Path(chosen.report.document["accuracy_cache"])
    paths |= write_outputs(Path(request.workload.output_dir), run, request.config, chosen.findings, chosen.schedule,
                           chosen.report)
    note = here_only_note(run.setup.fingerprint, latency, verdict)
    return OfflineResult(
        geometry=run.geometry, device=run.setup.fingerprint, batch_size=run.setup.batch_size, search=latency.search,
        decision=verdict.decision, verification=verdict.verification, fresh_verification=verdict.fresh_verification,
        fresh_steps=list(latency.fresh_steps), schedule=chosen.schedule, paths=paths,
        measure_seconds=latency.seconds, notes=[*verdict.notes, *([note] if note else []), *chosen.found.notes],
        frontier=chosen,
    )


def accuracy_only(workload: Workload, config: OfflineConfig, run: Run, sample: Sample) -> OfflineResult:
    """`--accuracy-only`: A(n) on the dataset folder, written to its CSV; nothing measured."""
    accuracy = estimate_accuracy(workload, config, run, sample)
    path = save_accuracy_curve(Path(workload.output_dir) / output_names(run.setup.stem)["accuracy"], accuracy)
    return OfflineResult(geometry=run.geometry, device=run.setup.fingerprint, batch_size=run.setup.batch_size,
                         accuracy=accuracy, paths={"accuracy": path})


@dataclass(frozen=True)
class FrontierRun:
    """What the frontier stages found and what they write."""

    found: FrontierFound
    verdict: FrontierVerdict
    findings: Findings
    schedule: Schedule
    report: FrontierReport


@dataclass(frozen=True)
class Calibrated:
    """What the frontier's files say of its calibration: the goal, the accuracy kind, the splits' sizes, the cache."""

    goal: Goal
    kind: str
    search_images: int
    held_out_images: int
    cache: Path

    @classmethod
    def of(cls, setup: FrontierSetup) -> Calibrated:
        calibration = setup.calibration
        return cls(setup.goal, calibration.kind, calibration.size(SEARCH), calibration.size(HELD_OUT), setup.cache)

    def to_dict(self) -> dict:
        return {**asdict(self), "goal": asdict(self.goal), "cache": str(self.cache)}

    @classmethod
    def from_dict(cls, data: dict) -> Calibrated:
        return cls(**{**data, "goal": Goal(**data["goal"]), "cache": Path(data["cache"])})


def choose_on_frontier(request: Request, run: Run, setup: FrontierSetup, latency: Latency) -> FrontierRun:
    """Search, verify, and build the schedule and the frontier's files (see the module docstring)."""
    return conclude_frontier(request, run, Calibrated.of(setup), latency, find_frontier(request, run, setup, latency))


def conclude_frontier(request: Request, run: Run, setup: Calibrated, latency: Latency,
                      found: FrontierFound) -> FrontierRun:
    """What the search found verified (where asked), and the schedule and the frontier's files built."""
    config, settings, goal = request.config, request.settings, setup.goal
    verdict = decide_frontier(request, run, found, goal.describe())
    ranking = Ranking(policy_setting(config, run.geometry, latency.search, None), (), latency.search)
    findings = Findings(latency, None, ranking, verdict.verdict)
    kind, stem, result = setup.kind, run.setup.stem, found.result
    chosen = None if verdict.chosen is None else verdict.chosen.candidate
    record = frontier_record(f"{stem}.frontier.json", kind, goal, result.baseline, verdict.chosen,
                             verdict.uniform, verdict.measured, result.evals, found.certification)
    schedule = final_schedule(run, config, settings, findings)
    schedule = as_schedule(replace(schedule, predicted=replace(schedule.predicted, accuracy_kind=kind)),
                           found.latency, chosen, record)
    schedule, launch = with_gpu_work(request, run, schedule)
    if launch is not None:
        verdict = replace(verdict, verdict=replace(verdict.verdict, notes=(*verdict.verdict.notes, launch)))
    certified = {} if found.certification is None else {
        r["key"]: r for r in (found.certification.row(p) for p in found.certification.finalists)}
    table = rows(result, found.latency.baseline, chosen, verdict.measured, goal.confidence, certified)
    facts = {"model": run.geometry.model, "stem": stem, "batch_size": run.setup.batch_size,
             "accuracy_kind": kind, "search_images": setup.search_images,
             "held_out_images": setup.held_out_images, "max_accuracy_drop": goal.max_drop_points,
             "latency_budget_ms": goal.latency_budget_ms, "min_accuracy": goal.min_accuracy,
             "accuracy_confidence": goal.confidence, "chosen": None if chosen is None else chosen.key,
             "best_uniform": record["best_uniform"], "certification": record["certification"],
             "seconds": found.seconds, "accuracy_cache": str(setup.cache),
             "reducer_costs": {m: c.to_dict() for m, c in found.latency.costs.items()},
             "mixed_counts": None if found.latency.mixed is None else {**found.latency.mixed.to_dict(),
                                                                       "kappa": round(found.latency.kappa, 6)}}
    floor = None if goal.max_drop_points is None else result.baseline.accuracy - goal.max_drop_points / 100
    title = (f"{run.geometry.model}, batch {run.setup.batch_size}, {kind} on {facts['search_images']} search "
             f"images: {result.evals} schedules measured")
    notes = [*found.notes, *verdict.verdict.notes]
    return FrontierRun(found, verdict, findings, schedule,
                       FrontierReport(table, document(result, table, facts, notes), floor, title))
