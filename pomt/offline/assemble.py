"""A schedule assembled from a decision: the removal, the policy and its settings, the prediction, the
device it was measured on, and whatever the run recorded beside it (`Evidence`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pomt.accuracy import AccuracyCurve
from pomt.formats.curve import rounded
from pomt.formats.schedule import BlockRemoval, Schedule, utc_now
from pomt.formats.schedule_parts import MeasurementRecord, Prediction, SchedulePolicy, Verified
from pomt.measurement.steps import Step
from pomt.offline.config import OfflineConfig, max_remove
from pomt.offline.prepare import Run
from pomt.policies import Decision


@dataclass(frozen=True)
class Evidence:
    """What a schedule reports beside its decision: the confirmed steps, A(n) (None: unknown), how the
    curve was measured and what the patched model measured."""

    steps: Sequence[Step] = ()
    accuracy: AccuracyCurve | None = None
    measurement: MeasurementRecord | None = None
    verified: Verified | None = None


def build_schedule(run: Run, config: OfflineConfig, decision: Decision, evidence: Evidence = Evidence()) -> Schedule:
    """The schedule that applies `decision` to the run's model, as measured on the run's device."""
    geometry, fingerprint, live = run.geometry, run.setup.fingerprint, run.replay is None
    return Schedule(
        model=geometry.model,
        input_size=geometry.input_size,
        batch_size=run.setup.batch_size,
        num_tokens=geometry.num_tokens,
        prefix_tokens=geometry.prefix_tokens,
        depth=geometry.depth,
        method=config.method,
        prune=(BlockRemoval(decision.block, decision.remove),) if decision.remove > 0 else (),
        policy=policy_record(config, decision, max_remove(config, geometry, evidence.accuracy is not None)),
        predicted=prediction(decision, evidence.accuracy),
        steps=[rounded(step.to_dict()) for step in evidence.steps],
        device=fingerprint,
        curve=f"{run.setup.stem}.curve.csv",
        created=utc_now(),
        dtype=fingerprint.dtype or "float32",  # a replayed trace's, when its sidecar says
        backend=fingerprint.backend if live else None,
        measurement=evidence.measurement,
        verified=evidence.verified,
    )


def policy_record(config: OfflineConfig, decision: Decision, limit: int) -> SchedulePolicy:
    """The policy that decided, its settings (`limit`: the most it could remove) and its reason."""
    return SchedulePolicy(
        name=decision.policy,
        alpha=config.alpha if decision.policy == "utility" else None,
        max_remove=limit,
        min_gain=config.min_gain,
        latency_budget_ms=config.latency_budget_ms,
        min_accuracy=config.min_accuracy,
        prune_block=config.prune_block,
        reason=decision.reason,
        reason_code=decision.code,
    )


def prediction(decision: Decision, accuracy: AccuracyCurve | None) -> Prediction:
    """The decision's predicted latencies and gain, rounded as the schedule keeps them, and its A(n)."""
    return Prediction(
        baseline_ms=round(decision.baseline_ms, 4),
        pruned_ms=round(decision.predicted_ms, 4),
        gain=round(decision.gain, 5),
        accuracy=decision.accuracy,
        accuracy_kind=accuracy.kind if accuracy else None,
    )
