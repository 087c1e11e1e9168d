"""What the run found, and the schedule that reports it: its measurement record (how the curve was measured
and its steps judged, the drift warning included) and its verification record."""

from __future__ import annotations

from dataclasses import dataclass

from pomt.accuracy import AccuracyCurve
from pomt.device.fingerprint import Fingerprint, fingerprint_hash
from pomt.formats.schedule import Schedule
from pomt.formats.schedule_parts import MeasurementRecord, Verified
from pomt.measurement.search import SearchSettings
from pomt.offline.assemble import Evidence, build_schedule
from pomt.offline.config import OfflineConfig
from pomt.offline.latency import Latency
from pomt.offline.prepare import Run
from pomt.offline.ranking import Ranking
from pomt.offline.verdict import Verdict
from pomt.policies import Decision

DESIGN = "shuffled passes, reference in every pass, drift-corrected pooling, paired step confirmation"


@dataclass(frozen=True)
class Findings:
    """The products of the stages a schedule reports: the latency curve, A(n) (None: unknown), the
    policy's ranking and the verdict; `measured_accuracy`: A(n) was measured by this run (not read)."""

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
    """How the curve was measured and its steps judged; the drift warning weighs the steps' effects and
    the decision's predicted gain."""
    search, adaptive = latency.search, config.search == "adaptive"
    effects = [abs(s.paired_pct) for s in search.steps] + ([100 * decision.gain] if decision.remove else [])
    limit = None if search.detection is None else search.detection.limit_pct
    return MeasurementRecord(
        design=DESIGN,
        search=config.search,
        passes=settings.passes,
        coarse_passes=settings.coarse_passes if adaptive else None,
        reps=search.reps,
        visits=search.visits,
        full_grid_visits=search.full_grid_visits,
        evaluation_ratio=round(search.evaluation_ratio, 4),
        budget_visits=search.budget_visits,
        noise_pct=round(100 * search.noise, 3),
        drift=None if search.drift is None else search.drift.to_dict(),
        confirmed=len(search.steps),
        rejected=[{"low": c.low, "high": c.high, "reason": c.reason} for c in search.rejected_candidates],
        fresh_process_steps=list(latency.fresh_steps) or None,
        align=settings.align if adaptive else None,
        screened_edges=[[c.low, c.high] for c in search.screened],
        detection_limit_pct=None if limit is None else round(limit, 2),
        detection=None if search.detection is None else search.detection.to_dict(),
        warning=search.drift_exceeds(effects),
        replay=None if run.replay is None else str(run.replay),
        trace=None if run.replay is not None else f"{run.setup.stem}.trace.csv",
    )


def verified_record(fingerprint: Fingerprint, verdict: Verdict) -> Verified | None:
    """The schedule's `verified` object: the verification here, the method's cost, the fresh process's
    verification; None where the patched model was not measured."""
    if verdict.verification is None:
        return None
    here = fingerprint_hash(fingerprint)
    fresh = verdict.fresh_verification
    return Verified.of(verdict.verification.record(here),
                       {str(r): round(c, 4) for r, c in verdict.method_cost.items()} or None,
                       None if fresh is None else fresh.record(here))
