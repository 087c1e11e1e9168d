"""Stage 5, write: the schedule that ships with everything the run recorded beside it (how the curve was
measured, what verified it, and for the frontier where the schedule came from), and the run's files written as
one set (`pomt.io.staged_set`): a run killed at any moment leaves the previous set or the new one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pomt.accuracy import AccuracyCurve, save_accuracy_curve
from pomt.checks import check_output_file
from pomt.device.fingerprint import Fingerprint, fingerprint_hash
from pomt.formats.curve import write_curve
from pomt.formats.schedule import Schedule, save_schedule
from pomt.formats.schedule_parts import MeasurementRecord, Verified
from pomt.frontier.candidates import Candidate
from pomt.frontier.certify import Certification
from pomt.frontier.choice import Evaluated, Goal, held_out_drop
from pomt.frontier.report import FRONTIER_SET, FrontierReport, write_frontier
from pomt.io import clear_stale, staged_set
from pomt.measurement.drift import corrected_values
from pomt.measurement.search import SearchSettings
from pomt.offline.choose import Evidence, Ranking, build_schedule
from pomt.offline.config import OfflineConfig
from pomt.offline.measure import Latency, Run
from pomt.offline.verify import Verdict
from pomt.plots import OfflinePlot, plot_offline
from pomt.policies import Decision, utility_values
from pomt.verification.verify import CandidateResult

DESIGN = "shuffled passes, reference in every pass, drift-corrected pooling, paired step confirmation"


@dataclass(frozen=True)
class Findings:
    """The stages' products a schedule reports; `measured_accuracy`: A(n) was measured by this run (not read)."""

    latency: Latency
    accuracy: AccuracyCurve | None
    ranking: Ranking
    verdict: Verdict
    measured_accuracy: bool = False


def final_schedule(run: Run, config: OfflineConfig, settings: SearchSettings, findings: Findings) -> Schedule:
    """The schedule of the verdict's decision with everything the run recorded beside it."""
    decision = findings.verdict.decision
    measurement = measurement_record(run, config, settings, findings.latency, decision)
    evidence = Evidence(findings.latency.search.steps, findings.accuracy, measurement,
                        verified_record(run.setup.fingerprint, findings.verdict))
    return build_schedule(run, config, decision, evidence)


def measurement_record(run: Run, config: OfflineConfig, settings: SearchSettings, latency: Latency,
                       decision: Decision) -> MeasurementRecord:
    """How the curve was measured and its steps judged, with the drift warning."""
    search, adaptive = latency.search, config.search == "adaptive"
    effects = [abs(s.paired_pct) for s in search.steps] + ([100 * decision.gain] if decision.remove else [])
    limit = None if search.detection is None else search.detection.limit_pct
    return MeasurementRecord(
        design=DESIGN, search=config.search, passes=settings.passes,
        coarse_passes=settings.coarse_passes if adaptive else None, reps=search.reps, visits=search.visits,
        full_grid_visits=search.full_grid_visits, evaluation_ratio=round(search.evaluation_ratio, 4),
        budget_visits=search.budget_visits, noise_pct=round(100 * search.noise, 3),
        drift=None if search.drift is None else search.drift.to_dict(), confirmed=len(search.steps),
        rejected=[{"low": c.low, "high": c.high, "reason": c.reason} for c in search.rejected_candidates],
        fresh_process_steps=list(latency.fresh_steps) or None, align=settings.align if adaptive else None,
        screened_edges=[[c.low, c.high] for c in search.screened],
        detection_limit_pct=None if limit is None else round(limit, 2),
        detection=None if search.detection is None else search.detection.to_dict(),
        warning=search.drift_exceeds(effects), replay=None if run.replay is None else str(run.replay),
        trace=None if run.replay is not None else f"{run.setup.stem}.trace.csv",
    )


def verified_record(fingerprint: Fingerprint, verdict: Verdict) -> Verified | None:
    """The schedule's `verified` object; None where the patched model was not measured."""
    if verdict.verification is None:
        return None
    here = fingerprint_hash(fingerprint)
    fresh = verdict.fresh_verification
    return Verified.of(verdict.verification.record(here),
                       {str(r): round(c, 4) for r, c in verdict.method_cost.items()} or None,
                       None if fresh is None else fresh.record(here))










def frontier_record(file: str, kind: str, goal: Goal, baseline: Evaluated, chosen: Evaluated | None,
                    uniform: Evaluated | None, measured: Mapping[Candidate, CandidateResult], evals: int,
                    certification: Certification | None = None) -> dict:
    """The schedule's `frontier` object; speedups are the verification's where the schedules were verified."""

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
                "predicted_ms": round(uniform.predicted_ms, 4), **accuracies(uniform), "verified_speedup": theirs,
                "speedup_over": None if ours is None or theirs is None else round(ours / theirs, 4),
                "predicted_speedup_over": None if chosen is None else
                round(uniform.predicted_ms / chosen.predicted_ms, 4)}
    return {"file": file, "accuracy_kind": kind, "max_accuracy_drop": goal.max_drop_points,
            "latency_budget_ms": goal.latency_budget_ms, "min_accuracy": goal.min_accuracy,
            "accuracy_confidence": goal.confidence, "evals": evals,
            "unpruned": accuracies(baseline), "chosen": None if chosen is None else
            {"family": chosen.family, "key": chosen.candidate.key, **accuracies(chosen),
             "search_drop_bound_points": drop_bound(chosen), "verified_speedup": speedup(chosen),
             "held_out_drop_points": None if (d := held_out_drop(chosen)) is None else round(d, 3),
             "certified_bound_points": None if certification is None or chosen.held_out is None else
             round(100 * certification.bound(chosen), 3)}, "best_uniform": beat,
            "certification": None if certification is None else certification.to_dict()}


SET = {"curve": "curve.csv", "accuracy": "accuracy.csv", "plot": "png", "schedule": "schedule.json", **FRONTIER_SET}


def output_names(stem: str) -> dict[str, str]:
    """The file names of a run's set, by kind."""
    return {kind: f"{stem}.{suffix}" for kind, suffix in SET.items()}


def prepare_outputs(folder: Path, stem: str) -> None:
    """Before measuring: finish or remove what a killed run left in `folder`; refuse a folder in a file's place."""
    clear_stale(folder, stem)
    for name in output_names(stem).values():
        check_output_file(folder / name, "output file")


def write_outputs(folder: Path, run: Run, config: OfflineConfig, findings: Findings,
                  schedule: Schedule, frontier: FrontierReport | None = None) -> dict[str, Path]:
    """The run's files (`output_names`) written in `folder` as one set, the schedule last; their paths by kind."""
    search, accuracy = findings.latency.search, findings.accuracy
    names = output_names(run.setup.stem)
    with staged_set(folder, run.setup.stem, last=[names["schedule"]]) as staging:
        written = {
            "curve": write_curve(staging / names["curve"], search.points, accuracy),
            "schedule": save_schedule(schedule, staging / names["schedule"]),
            "plot": plot(staging / names["plot"], run, config, findings),
        }
        if findings.measured_accuracy:
            written["accuracy"] = save_accuracy_curve(staging / names["accuracy"], accuracy)
        if frontier is not None:
            written |= write_frontier(staging, names, frontier)
    return {kind: folder / path.name for kind, path in written.items()}


def plot(path: Path, run: Run, config: OfflineConfig, findings: Findings) -> Path:
    """The curve with its steps, the candidates rejected, the choice and what verified it, A(n) and U(n)."""
    search, accuracy, verdict = findings.latency.search, findings.accuracy, findings.verdict
    setting = findings.ranking.setting
    utility = utility_values(setting, config.alpha) if setting.accuracy is not None else None
    title = (f"{run.geometry.model} on {run.setup.fingerprint.name or run.setup.device}, batch "
             f"{run.setup.batch_size}, {run.geometry.input_size[0]}x{run.geometry.input_size[1]} px")
    if run.replay is not None:
        title += f" (replay of {Path(run.replay).name})"
    return plot_offline(path, OfflinePlot(
        title, search.points, corrected_values(search.design), search.steps,
        [c for c in search.rejected_candidates if c.effect is not None], verdict.decision.kept_tokens,
        drift=search.drift, accuracy=accuracy.values if accuracy else None,
        accuracy_kind=accuracy.kind if accuracy else None, utility=utility, verified=verdict.verification,
        here_only=[(f["low"], f["high"]) for f in findings.latency.fresh_steps if not f["held"]],
        detection=search.detection_sentence(), reach=None if search.detection is None else search.detection.reach,
        priced=setting.curve,
    ))
