"""`run_offline`: the offline computation's stages strung together, and what a run found and wrote."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from pomt.accuracy import AccuracyCurve, save_accuracy_curve
from pomt.device.fingerprint import Fingerprint
from pomt.formats.schedule import Schedule
from pomt.frontier.calibration import hosted
from pomt.measurement.search import SearchResult, SearchSettings
from pomt.models.geometry import Geometry
from pomt.offline.accuracy import Sample, accuracy_sample, estimate_accuracy, given_accuracy
from pomt.offline.config import (
    FRONTIER,
    OfflineConfig,
    Request,
    max_remove,
    policy_name,
    validate,
)
from pomt.offline.fresh_steps import check_steps_in_fresh_process
from pomt.offline.frontier_pipeline import FrontierRun, choose_on_frontier
from pomt.offline.frontier_setup import prepare_frontier
from pomt.offline.latency import measure_latency
from pomt.offline.outputs import output_names, prepare_outputs, write_outputs
from pomt.offline.prepare import Run, prepare_run
from pomt.offline.ranking import policy_setting, rank
from pomt.offline.records import Findings, final_schedule
from pomt.offline.verdict import decide, here_only_note, with_gpu_work
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
    """Run every stage the configuration asks for and write the outputs (see `pomt.offline`).

    Settings and the output folder are checked before anything is built, the accuracy data's labels before
    anything is measured; Ctrl-C raises `Interrupted`, saying how many visits the journals keep."""
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
    """The frontier policy (its accuracy measured in a worker process, `pomt.frontier.calibration`), else
    the step or utility policy (`measure_and_rank`); the outputs written."""
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
    paths["frontier_journal"] = Path(request.workload.output_dir) / chosen.report.document["journal"]
    paths |= write_outputs(Path(request.workload.output_dir), run, request.config, chosen.findings, chosen.schedule,
                           chosen.report)
    note = here_only_note(run.setup.fingerprint, latency, verdict)
    return OfflineResult(
        geometry=run.geometry, device=run.setup.fingerprint, batch_size=run.setup.batch_size, search=latency.search,
        decision=verdict.decision, verification=verdict.verification, fresh_verification=verdict.fresh_verification,
        fresh_steps=list(latency.fresh_steps), schedule=chosen.schedule, paths=paths,
        measure_seconds=latency.seconds, notes=[*chosen.found.notes, *verdict.notes, *([note] if note else [])],
        frontier=chosen,
    )


def accuracy_only(workload: Workload, config: OfflineConfig, run: Run, sample: Sample) -> OfflineResult:
    """`--accuracy-only`: A(n) on the dataset folder, written to its CSV; nothing measured."""
    accuracy = estimate_accuracy(workload, config, run, sample)
    path = save_accuracy_curve(Path(workload.output_dir) / output_names(run.setup.stem)["accuracy"], accuracy)
    return OfflineResult(geometry=run.geometry, device=run.setup.fingerprint, batch_size=run.setup.batch_size,
                         accuracy=accuracy, paths={"accuracy": path})
