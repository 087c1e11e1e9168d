"""The latency of each benchmark variant over the unpruned model's, predicted from the schedule's curve."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from pomt.errors import CurveError
from pomt.formats.curve import read_points
from pomt.formats.schedule import Schedule
from pomt.frontier.reducer_costs import cost_function
from pomt.measurement.priced_curve import priced_levels, step_spans
from pomt.patching import token_counts
from pomt.policies import predict_from_counts

Predictor = Callable[[str | None, Mapping[int, int]], float]


def predictor(schedule: Schedule, source: object, geometry) -> Predictor | None:
    """Latency of a variant over the unpruned model's, predicted from the schedule's curve file (beside the
    schedule), priced between the schedule's steps as the offline computation priced it
    (`pomt.measurement.priced_curve`): every block at the tokens it receives (`pomt.policies.predict_from_counts`),
    plus the method's own cost where the schedule measured it. Without the curve, the schedule's own prediction
    only."""
    baseline, pruned = schedule.predicted.baseline_ms, schedule.predicted.pruned_ms
    curve = None
    if schedule.curve and isinstance(source, (str, Path)):
        path = Path(source).parent / schedule.curve
        try:
            curve = priced_levels(read_points(path), step_spans(schedule.steps))
        except CurveError:
            curve = None
    if curve is None:
        if not (isinstance(baseline, (int, float)) and isinstance(pruned, (int, float)) and baseline > 0):
            return None
        own = (schedule.method, schedule.removal)
        return lambda method, removal: 1.0 if not removal else (
            pruned / baseline if (method, dict(removal)) == own else None)
    costs = (schedule.verified.method_cost_ms if schedule.verified is not None else None) or {}
    cost = cost_function({int(r): float(c) for r, c in costs.items()})
    n, prefix, depth = geometry.num_tokens, geometry.prefix_tokens, geometry.depth
    unpruned = predict_from_counts(curve, [n] * depth)

    def ratio(method: str | None, removal: Mapping[int, int]) -> float:
        if not method or not removal:
            return 1.0
        kept = token_counts(n, prefix, depth, method, removal)[:-1]  # what each block receives
        own_blocks = schedule.removal if method == schedule.method else {}
        extra = sum(cost(r) for b, r in removal.items() if b in own_blocks)
        return (predict_from_counts(curve, kept) + extra) / unpruned

    return ratio
