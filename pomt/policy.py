"""How many tokens to remove at which block: the step, utility and budget policies (pure maths).

Latency model: the curve L(n) is the whole model with every block at n tokens, so with C the overhead
(embedding + head, `overhead_ms`) and D the depth, one block at n tokens costs b(n) = (L(n) - C) / D.
Pruning R tokens at block l leaves blocks 0..l-1 at N tokens and blocks l..D-1 at N - R:
predicted = C + l * b(N) + (D - l) * b(N - R); several (block, remove) pairs remove cumulatively.
(The pruning block's own attention still runs at N; charging the whole block at N - R is a small
optimism that `benchmark.py` measures.) Counts that were not measured are interpolated linearly
(`numpy.interp`), never extrapolated. A pruning block outside the model raises `PatchError`
(`pomt.checks`), other settings outside it `GridError`; a policy that cannot be met (budget, accuracy)
raises `PolicyError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pomt.accuracy import interpolate
from pomt.checks import check_prune_block
from pomt.errors import CurveError, GridError, PolicyError
from pomt.steps import Step

POLICIES = ("utility", "step", "budget")

@dataclass(frozen=True)
class Decision:
    """A chosen removal with its predicted effect and the reason, in one human sentence."""

    remove: int
    block: int
    kept_tokens: int
    baseline_ms: float
    predicted_ms: float
    gain: float
    accuracy: float | None
    policy: str
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def _latency(curve: Mapping[int, float], n: float) -> float:
    xs = np.array(sorted(curve), dtype=float)
    if xs.size == 0:
        raise CurveError("the latency curve is empty")
    if not xs[0] <= n <= xs[-1]:
        raise CurveError(f"latency at {n:g} tokens is needed but the curve covers only [{xs[0]:g}, {xs[-1]:g}]")
    return float(np.interp(n, xs, [curve[int(x)] for x in xs]))


def _accuracy(accuracy: Mapping[int, float] | None, n: int) -> float | None:
    return interpolate(accuracy, [n])[n] if accuracy else None


def predict_latency(
    curve: Mapping[int, float],
    num_tokens: int,
    depth: int,
    prune: Sequence[tuple[int, int]],
    overhead_ms: float = 0.0,
) -> float:
    """Predicted latency (ms) of the model with the (block, remove) pairs applied; see the module doc."""
    if depth < 1:
        raise GridError(f"depth must be at least 1, got {depth}")
    counts = [num_tokens] * depth
    for block, remove in prune:
        check_prune_block(block, depth)
        if remove < 0:
            raise GridError(f"cannot remove a negative number of tokens ({remove})")
        for i in range(block, depth):
            counts[i] -= remove
    if min(counts) < 1:
        raise GridError(f"the schedule removes {num_tokens - min(counts)} of {num_tokens} tokens; keep at least 1")
    return overhead_ms + sum((_latency(curve, n) - overhead_ms) / depth for n in counts)


def _limit(num_tokens: int, prefix_tokens: int, depth: int, block: int, max_remove: int) -> int:
    """Validate the setting; the largest removal allowed (at least one patch token is always kept)."""
    check_prune_block(block, depth)
    if num_tokens <= prefix_tokens:
        raise GridError(f"{num_tokens} tokens leave no patch token after {prefix_tokens} prefix tokens")
    if max_remove < 0:
        raise GridError(f"max_remove must be at least 0, got {max_remove}")
    return min(max_remove, num_tokens - prefix_tokens - 1)


class _LatencyPredictor:
    """Predicted latency (and accuracy) of pruning to `kept` tokens at `block` in one setting."""

    def __init__(self, curve, num_tokens, depth, block, overhead_ms, accuracy, policy):
        self.curve, self.n, self.depth, self.block = curve, num_tokens, depth, block
        self.overhead, self.accuracy, self.policy = overhead_ms, accuracy, policy
        self.baseline = predict_latency(curve, num_tokens, depth, [], overhead_ms)

    def predicted(self, kept: int) -> float:
        return predict_latency(self.curve, self.n, self.depth, [(self.block, self.n - kept)], self.overhead)

    def decision(self, kept: int, reason: str) -> Decision:
        predicted = self.predicted(kept)
        return Decision(
            remove=self.n - kept,
            block=self.block,
            kept_tokens=kept,
            baseline_ms=self.baseline,
            predicted_ms=predicted,
            gain=(self.baseline - predicted) / self.baseline if self.baseline else 0.0,
            accuracy=_accuracy(self.accuracy, kept),
            policy=self.policy,
            reason=reason,
        )


def choose_step(
    curve: Mapping[int, float],
    steps: Sequence[Step],
    *,
    num_tokens: int,
    prefix_tokens: int,
    depth: int,
    block: int,
    max_remove: int,
    min_gain: float,
    overhead_ms: float = 0.0,
    accuracy: Mapping[int, float] | None = None,
    min_accuracy: float | None = None,
) -> Decision:
    """The smallest removal that lands just below a significant drop and pays at least `min_gain`.

    Candidates are the measured low sides of the "drop" steps within `max_remove`, nearest to N first.
    One is skipped when a measured count between it and N is faster (it would sit in a non-monotone
    region: keeping more tokens would cost less), when its predicted gain at `block` is below
    `min_gain`, or when its accuracy is below `min_accuracy`. Nothing is removed when none qualifies.
    """
    limit = _limit(num_tokens, prefix_tokens, depth, block, max_remove)
    predictor = _LatencyPredictor(curve, num_tokens, depth, block, overhead_ms, accuracy, "step")
    drops = sorted(
        (s for s in steps if s.kind == "drop" and num_tokens - limit <= s.tokens < num_tokens),
        key=lambda s: -s.tokens,
    )
    for step in drops:
        kept = step.tokens
        if kept not in curve or any(kept < m <= num_tokens and curve[m] < curve[kept] for m in curve):
            continue
        decision = predictor.decision(kept, "")
        if decision.gain < min_gain:
            continue
        if min_accuracy is not None and decision.accuracy is not None and decision.accuracy < min_accuracy:
            continue
        reason = (
            f"lands below the step at {step.upper_tokens} -> {step.tokens} tokens ({-step.drop_pct:+.1f}% "
            f"latency there; {decision.gain:.1%} predicted gain pruning at block {block})"
        )
        return Decision(**{**decision.to_dict(), "reason": reason})
    return predictor.decision(
        num_tokens, f"no step within {limit} removed tokens pays at least {min_gain:.1%} at block {block}"
    )


def _candidates(curve: Mapping[int, float], num_tokens: int, limit: int) -> list[int]:
    """Measured counts reachable within the limit, most tokens kept first (N always included)."""
    return sorted({n for n in curve if num_tokens - limit <= n <= num_tokens} | {num_tokens}, reverse=True)


def utility_values(
    curve: Mapping[int, float],
    accuracy: Mapping[int, float],
    *,
    alpha: float,
    num_tokens: int,
    depth: int,
    block: int,
    overhead_ms: float = 0.0,
    counts: Sequence[int] | None = None,
) -> dict[int, float]:
    """U(n) = alpha (1 - P(n) / max P) + (1 - alpha) A(n) / max A over `counts` (default: the curve's),
    P(n) the predicted latency pruning to n at `block`, A interpolated onto the counts."""
    if not 0.0 <= alpha <= 1.0:
        raise PolicyError(f"alpha must lie in [0, 1], got {alpha}")
    if not accuracy:
        raise PolicyError("the utility policy needs an accuracy curve")
    counts = sorted(counts if counts is not None else curve)
    latency = {n: predict_latency(curve, num_tokens, depth, [(block, num_tokens - n)], overhead_ms) for n in counts}
    acc = {n: _accuracy(accuracy, n) for n in counts}
    top_latency, top_accuracy = max(latency.values()), max(acc.values())
    return {
        n: alpha * (1 - latency[n] / top_latency) + (1 - alpha) * (acc[n] / top_accuracy if top_accuracy else 0.0)
        for n in counts
    }


def choose_utility(
    curve: Mapping[int, float],
    accuracy: Mapping[int, float],
    *,
    alpha: float,
    num_tokens: int,
    prefix_tokens: int,
    depth: int,
    block: int,
    max_remove: int,
    overhead_ms: float = 0.0,
    min_accuracy: float | None = None,
) -> Decision:
    """POMT's choice: n* = argmax U(n) over the measured counts within `max_remove` (see
    `utility_values`); ties go to the count that keeps more tokens."""
    limit = _limit(num_tokens, prefix_tokens, depth, block, max_remove)
    if not accuracy:
        raise PolicyError("the utility policy needs an accuracy curve")
    predictor = _LatencyPredictor(curve, num_tokens, depth, block, overhead_ms, accuracy, "utility")
    counts = _candidates(curve, num_tokens, limit)
    if min_accuracy is not None:
        reachable = [n for n in counts if _accuracy(accuracy, n) >= min_accuracy]
        if not reachable:
            best = max(_accuracy(accuracy, n) for n in counts)
            raise PolicyError(f"no token count reaches accuracy {min_accuracy:g}; the best is {best:.4g}")
        counts = reachable
    utility = utility_values(curve, accuracy, alpha=alpha, num_tokens=num_tokens, depth=depth, block=block,
                             overhead_ms=overhead_ms, counts=counts)
    best_n = max(counts, key=lambda n: (utility[n], n))
    accuracy_there = _accuracy(accuracy, best_n)
    return predictor.decision(best_n, f"highest utility {utility[best_n]:.4f} at alpha {alpha:g} "
                                  f"(accuracy {accuracy_there:.4g})")


def choose_budget(
    curve: Mapping[int, float],
    *,
    latency_budget_ms: float,
    num_tokens: int,
    prefix_tokens: int,
    depth: int,
    block: int,
    max_remove: int,
    overhead_ms: float = 0.0,
    accuracy: Mapping[int, float] | None = None,
    min_accuracy: float | None = None,
) -> Decision:
    """The fewest tokens removed (over measured counts) whose predicted latency meets the budget and
    whose accuracy meets `min_accuracy` when accuracy is known."""
    limit = _limit(num_tokens, prefix_tokens, depth, block, max_remove)
    predictor = _LatencyPredictor(curve, num_tokens, depth, block, overhead_ms, accuracy, "budget")
    best: tuple[float, int] | None = None
    for n in _candidates(curve, num_tokens, limit):
        acc = _accuracy(accuracy, n)
        if min_accuracy is not None and acc is not None and acc < min_accuracy:
            continue
        predicted = predictor.predicted(n)
        if best is None or predicted < best[0]:
            best = (predicted, n)
        if predicted <= latency_budget_ms:
            return predictor.decision(n, f"fewest tokens removed that meet {latency_budget_ms:g} ms")
    if best is None:
        raise PolicyError(f"no token count within {limit} removed tokens reaches accuracy {min_accuracy:g}")
    raise PolicyError(
        f"latency budget {latency_budget_ms:g} ms cannot be met within {limit} removed tokens: "
        f"best predicted {best[0]:.3f} ms at {best[1]} tokens pruning at block {block}"
    )
