"""How many tokens to remove at which block: the step, utility and budget policies (pure maths).

The curve L(n) is the whole model with every block at n tokens. Pruning R tokens at block l of D gives
predicted(R) = [(l + 1) L(N) + (D - l - 1) L(N - R)] / D + cost(R), cost(R) being what the method's pruning block
costs over the plain block (0 without it). Unmeasured counts are interpolated linearly, never extrapolated. Each
policy ranks its candidates (`rank_*`, best first) for verification; `choose_*` takes the first or removes nothing."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from pomt.accuracy import interpolate
from pomt.errors import CurveError, GridError, PolicyError
from pomt.measurement.steps import Step

POLICIES = ("utility", "step", "budget")
MethodCost = Callable[[int], float]


def no_cost(remove: int) -> float:
    return 0.0


@dataclass(frozen=True)
class Decision:
    """A chosen removal with its predicted effect, the reason in one sentence, and a short reason code."""

    remove: int
    block: int
    kept_tokens: int
    baseline_ms: float
    predicted_ms: float
    gain: float
    accuracy: float | None
    policy: str
    reason: str
    code: str = ""
    target: Step | None = field(default=None, compare=False)  # the step a step-policy choice lands below

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("target")
        return data


def _latency(curve: Mapping[int, float], n: float) -> float:
    xs = np.array(sorted(curve), dtype=float)
    if xs.size == 0:
        raise CurveError("the latency curve is empty")
    if not xs[0] <= n <= xs[-1]:
        raise CurveError(f"latency at {n:g} tokens is needed but the curve covers only [{xs[0]:g}, {xs[-1]:g}]")
    return float(np.interp(n, xs, [curve[int(x)] for x in xs]))


def _accuracy(accuracy: Mapping[int, float] | None, n: int) -> float | None:
    return interpolate(accuracy, [n])[n] if accuracy else None


def predict_latency(curve: Mapping[int, float], num_tokens: int, depth: int, prune: Sequence[tuple[int, int]],
                    method_cost: MethodCost = no_cost) -> float:
    """Predicted latency (ms) with the (block, remove) pairs applied cumulatively, each charged the method's cost."""
    if depth < 1:
        raise GridError(f"depth must be at least 1, got {depth}")
    counts = [num_tokens] * depth
    cost = 0.0
    for block, remove in prune:
        if remove < 0:
            raise GridError(f"cannot remove a negative number of tokens ({remove})")
        for i in range(block + 1, depth):
            counts[i] -= remove
        cost += method_cost(remove) if remove else 0.0
    if min(counts) < 1:
        raise GridError(f"the schedule removes {num_tokens - min(counts)} of {num_tokens} tokens; keep at least 1")
    return predict_from_counts(curve, counts) + cost


def predict_from_counts(curve: Mapping[int, float], kept: Sequence[int]) -> float:
    """Predicted latency (ms) of a model whose block b runs on kept[b] tokens: sum(L(n_b)) / D."""
    return sum(_latency(curve, n) for n in kept) / len(kept)


@dataclass(frozen=True)
class Setting:
    """What every policy needs besides its own knobs: the curve, the model's geometry, where it prunes."""

    curve: Mapping[int, float]
    num_tokens: int
    prefix_tokens: int
    depth: int
    block: int
    max_remove: int
    method_cost: MethodCost = no_cost
    accuracy: Mapping[int, float] | None = None
    min_accuracy: float | None = None

    @property
    def limit(self) -> int:
        """The largest removal allowed (at least one patch token is always kept); checks the setting."""
        if self.num_tokens <= self.prefix_tokens:
            raise GridError(f"{self.num_tokens} tokens leave no patch token after {self.prefix_tokens} prefix tokens")
        if self.max_remove < 0:
            raise GridError(f"max_remove must be at least 0, got {self.max_remove}")
        return min(self.max_remove, self.num_tokens - self.prefix_tokens - 1)

    @property
    def baseline(self) -> float:
        return predict_latency(self.curve, self.num_tokens, self.depth, [])

    def predicted(self, kept: int) -> float:
        prune = [(self.block, self.num_tokens - kept)]
        return predict_latency(self.curve, self.num_tokens, self.depth, prune, self.method_cost)

    def counts(self) -> list[int]:
        """Measured counts reachable within the limit, most tokens kept first (N always included)."""
        low = self.num_tokens - self.limit
        return sorted({n for n in self.curve if low <= n <= self.num_tokens} | {self.num_tokens}, reverse=True)

    def accurate_enough(self, kept: int) -> bool:
        value = _accuracy(self.accuracy, kept)
        return self.min_accuracy is None or value is None or value >= self.min_accuracy

    def decision(self, kept: int, policy: str, reason: str, code: str, target: Step | None = None) -> Decision:
        baseline, predicted = self.baseline, self.predicted(kept)
        return Decision(
            remove=self.num_tokens - kept, block=self.block, kept_tokens=kept, baseline_ms=baseline,
            predicted_ms=predicted, gain=(baseline - predicted) / baseline if baseline else 0.0,
            accuracy=_accuracy(self.accuracy, kept), policy=policy, reason=reason, code=code, target=target,
        )

    def nothing(self, policy: str, reason: str, code: str) -> Decision:
        return replace(self.decision(self.num_tokens, policy, reason, code), predicted_ms=self.baseline, gain=0.0)


def rank_step(setting: Setting, steps: Sequence[Step], min_gain: float) -> list[Decision]:
    """Removals that land just below a confirmed drop and pay at least `min_gain`, nearest to N first.

    A drop's low side is skipped when a measured count between it and N is not slower by at least `min_gain` (a
    count that keeps more tokens would cost no more), when its predicted gain is below `min_gain`, or when its accuracy
    is below the minimum."""
    limit, n, curve = setting.limit, setting.num_tokens, setting.curve
    ranked = []
    for step in sorted((s for s in steps if s.kind == "drop" and n - limit <= s.tokens < n), key=lambda s: -s.tokens):
        kept = step.tokens
        if kept not in curve or any(kept < m <= n and curve[m] < curve[kept] * (1 + min_gain) for m in curve):
            continue
        if not setting.accurate_enough(kept):
            continue
        candidate = setting.decision(kept, "step", "", "step", step)
        if candidate.gain < min_gain:
            continue
        size = (f"{step.drop_pct:.1f}% faster there" if step.paired_pct is None
                else f"{step.paired_pct:.1f}% faster there beyond the trend, paired")
        reason = (f"lands below the step at {step.upper_tokens} -> {step.tokens} tokens ({size}; "
                  f"{candidate.gain:.1%} predicted gain pruning at block {setting.block})")
        ranked.append(replace(candidate, reason=reason))
    return ranked


def choose_step(setting: Setting, steps: Sequence[Step], min_gain: float) -> Decision:
    """The first of `rank_step`, or nothing removed with the reason."""
    ranked = rank_step(setting, steps, min_gain)
    if ranked:
        return ranked[0]
    return setting.nothing("step", f"no confirmed step within {setting.limit} removed tokens pays at least "
                                   f"{min_gain:.1%} at block {setting.block}", "no_step")


def utility_values(setting: Setting, alpha: float, counts: Sequence[int] | None = None) -> dict[int, float]:
    """U(n) = alpha (1 - P(n) / max P) + (1 - alpha) A(n) / max A over `counts` (default: the curve's)."""
    if not 0.0 <= alpha <= 1.0:
        raise PolicyError(f"alpha must lie in [0, 1], got {alpha}")
    if not setting.accuracy:
        raise PolicyError("the utility policy needs an accuracy curve")
    counts = sorted(counts if counts is not None else setting.curve)
    latency = {n: setting.predicted(n) for n in counts}
    acc = {n: _accuracy(setting.accuracy, n) for n in counts}
    top_latency, top_accuracy = max(latency.values()), max(acc.values())
    return {
        n: alpha * (1 - latency[n] / top_latency) + (1 - alpha) * (acc[n] / top_accuracy if top_accuracy else 0.0)
        for n in counts
    }


def rank_utility(setting: Setting, alpha: float) -> list[Decision]:
    """POMT's choice first: counts within the limit by U(n), highest first; ties go to the one keeping more tokens."""
    counts = setting.counts()
    if setting.min_accuracy is not None:
        reachable = [n for n in counts if setting.accurate_enough(n)]
        if not reachable:
            best = max(_accuracy(setting.accuracy, n) for n in counts)
            raise PolicyError(f"no token count reaches accuracy {setting.min_accuracy:g}; the best is {best:.4g}")
        counts = reachable
    utility = utility_values(setting, alpha, counts)
    ranked = sorted(counts, key=lambda n: (utility[n], n), reverse=True)
    return [
        setting.decision(n, "utility", f"highest utility {utility[n]:.4f} at alpha {alpha:g} "
                                       f"(accuracy {_accuracy(setting.accuracy, n):.4g})", "utility")
        for n in ranked
    ]


def choose_utility(setting: Setting, alpha: float) -> Decision:
    return rank_utility(setting, alpha)[0]


def rank_budget(setting: Setting, latency_budget_ms: float) -> list[Decision]:
    """Counts whose predicted latency meets the budget (and accuracy the minimum), fewest removed first."""
    ranked, best = [], None
    for n in setting.counts():
        if not setting.accurate_enough(n):
            continue
        predicted = setting.predicted(n)
        best = predicted if best is None else min(best, predicted)
        if predicted <= latency_budget_ms:
            ranked.append(setting.decision(n, "budget", f"fewest tokens removed that meet {latency_budget_ms:g} ms",
                                           "budget"))
    if best is None:
        raise PolicyError(f"no token count within {setting.limit} removed tokens reaches accuracy "
                          f"{setting.min_accuracy:g}")
    if not ranked:
        raise PolicyError(f"latency budget {latency_budget_ms:g} ms cannot be met within {setting.limit} removed "
                          f"tokens (--max-remove): best predicted {best:.3f} ms pruning at block {setting.block}")
    return ranked


def choose_budget(setting: Setting, latency_budget_ms: float) -> Decision:
    return rank_budget(setting, latency_budget_ms)[0]
