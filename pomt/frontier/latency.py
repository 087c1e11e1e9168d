"""Predicted latency of any schedule (reducer + removal per block) from one measured curve (pure maths).

predicted = (1 + kappa sqrt(c)) sum_b L(n_b) / D + sum over pruning blocks prune(n_b, r_b)
            + sum over blocks after the first pruning one carry(n_b) + later x (pruning blocks right after one)

L(n) is the whole model at n tokens; a block costs L(n) / D at the count entering it (`token_counts`). `ReducerCost`
holds a reducer's own cost over the plain block, charged at the curve's speed (`at_speed`); a layout whose count
changes c times runs over its blocks' sum by kappa sqrt(c), calibrated in the run (`MixedCounts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
from scipy.stats import linregress

from pomt.errors import CurveError
from pomt.frontier.candidates import NONE, Candidate
from pomt.patching.blocks import removed_at, token_counts
from pomt.policies import predict_from_counts

SLOPE_ALPHA = 0.05  # a carry's trend over the counts is charged only where significant at this level (`has_trend`)


def line_at(x: float, xs: Sequence[float], values: Sequence[float]) -> float:
    """The least-squares line through (xs, values) at x held within range (under three distinct xs: interpolated)."""
    order = np.argsort(xs)
    xs, values = np.asarray(xs, float)[order], np.asarray(values, float)[order]
    x = float(np.clip(x, xs[0], xs[-1]))
    if len(set(xs.tolist())) < 3:
        return float(np.interp(x, xs, values))
    slope, intercept = np.polyfit(xs, values, 1)
    return float(intercept + slope * x)


def has_trend(xs: Sequence[float], values: Sequence[float], alpha: float = SLOPE_ALPHA) -> bool:
    """Whether the line through (xs, values) has a slope significant at `alpha` (True under three distinct xs)."""
    if len(set(xs)) < 3:
        return True
    if np.ptp(values) == 0:
        return False
    return bool(linregress(xs, values).pvalue < alpha)


@dataclass(frozen=True)
class ReducerCost:
    """A reducer's own cost (ms) over the plain block: at pruning blocks by (tokens entering, removed), and (ToMe)
    at every block after the first pruning one by the tokens entering it."""

    method: str
    prefix_tokens: int
    pruning: Mapping[tuple[int, int], float] = field(default_factory=dict)
    carrying: Mapping[int, float] = field(default_factory=dict)
    later: float = 0.0  # ms added to prune() at every pruning block whose block before pruned
    unit_ms: float | None = None  # the unpruned whole model's latency at the speed these ms hold (None: unknown)

    def at_speed(self, unpruned_ms: float) -> ReducerCost:
        """These costs scaled by `unpruned_ms` / unit_ms (the machine's speed); unchanged where the unit is unknown."""
        if not self.unit_ms or unpruned_ms <= 0:
            return self
        scale = unpruned_ms / self.unit_ms
        return replace(self, pruning={k: ms * scale for k, ms in self.pruning.items()},
                       carrying={k: ms * scale for k, ms in self.carrying.items()}, later=self.later * scale,
                       unit_ms=unpruned_ms)

    def prune(self, tokens: int, remove: int) -> float:
        """Cost of a block receiving `tokens` and removing `remove`: at each measured count a line in the share
        removed (`line_at`), then linear in the count, held beyond the measured range; 0 removing none."""
        if remove <= 0 or not self.pruning:
            return 0.0
        share = remove / max(1, tokens - self.prefix_tokens)
        by_count: dict[int, list[tuple[float, float]]] = {}
        for (n, r), ms in self.pruning.items():
            by_count.setdefault(n, []).append((r / max(1, n - self.prefix_tokens), ms))
        counts = sorted(by_count)
        at_count = [line_at(share, *zip(*by_count[n], strict=True)) for n in counts]
        return float(np.interp(tokens, counts, at_count))

    def carry(self, tokens: int) -> float:
        """Cost of a block after the first pruning one at the `tokens` it receives (0 without a table): the measured
        median, or their line where its slope is significant (one noisy count must not price every block)."""
        if not self.carrying:
            return 0.0
        if not self._carry_has_trend:
            return float(np.median(list(self.carrying.values())))
        return line_at(tokens, list(self.carrying), list(self.carrying.values()))

    @cached_property
    def _carry_has_trend(self) -> bool:
        return has_trend(list(self.carrying), list(self.carrying.values()))

    def at_block(self, tokens: int, removed: int, after_first: bool, follows_cut: bool = False) -> float:
        """The cost at a block; `after_first`: an earlier block pruned; `follows_cut`: the one just before did."""
        ms = self.prune(tokens, removed)
        if after_first:
            ms += self.carry(tokens)
        if follows_cut and removed > 0:
            ms += self.later
        return ms

    def to_dict(self) -> dict:
        return {"method": self.method, "prefix_tokens": self.prefix_tokens,
                "pruning": [[n, r, round(ms, 5)] for (n, r), ms in sorted(self.pruning.items())],
                "carrying": [[n, round(ms, 5)] for n, ms in sorted(self.carrying.items())],
                "later": round(self.later, 5), "unit_ms": None if self.unit_ms is None else round(self.unit_ms, 5)}

    @classmethod
    def from_dict(cls, data: Mapping) -> ReducerCost:
        return cls(data["method"], int(data["prefix_tokens"]),
                   {(int(n), int(r)): float(ms) for n, r, ms in data["pruning"]},
                   {int(n): float(ms) for n, ms in data["carrying"]}, float(data.get("later", 0.0)),
                   None if data.get("unit_ms") is None else float(data["unit_ms"]))


def cut_before(counts: Sequence[int], block: int) -> bool:
    """Whether the block before `block` removed tokens, of a schedule whose blocks receive `counts`."""
    return block > 0 and counts[block] < counts[block - 1]


def count_changes(counts: Sequence[int], depth: int) -> int:
    """How many blocks receive a different count from the block before them (of the `depth` blocks)."""
    return sum(counts[b] != counts[b - 1] for b in range(1, depth))


@dataclass(frozen=True)
class MixedCounts:
    """A dropped layout (tokens entering each block) changing count at every block: its latency over its blocks'
    sum in paired rounds, with its 95% interval, and over the unpruned model's (for the record)."""

    layout: tuple[int, ...]
    over_blocks: float
    ci: tuple[float, float]
    of_unpruned: float

    def to_dict(self) -> dict:  # a resume prices alike
        return {"layout": list(self.layout), "over_blocks": self.over_blocks, "ci": list(self.ci),
                "of_unpruned": self.of_unpruned}

    @classmethod
    def from_dict(cls, data: Mapping) -> MixedCounts:
        """KeyError on a calibration without its blocks' sum (an older layout): the caller measures again."""
        low, high = data["ci"]
        return cls(tuple(int(n) for n in data["layout"]), float(data["over_blocks"]), (float(low), float(high)),
                   float(data["of_unpruned"]))


@dataclass(frozen=True)
class LatencyModel:
    """The curve, the model's token geometry and each reducer's cost: prices any candidate."""

    curve: Mapping[int, float]
    num_tokens: int
    prefix_tokens: int
    depth: int
    costs: Mapping[str, ReducerCost] = field(default_factory=dict)
    mixed: MixedCounts | None = None  # the in-run calibration of mixed counts (None: not charged)

    def __post_init__(self) -> None:
        if not self.curve:
            raise CurveError("the latency curve is empty")

    @cached_property
    def charged_costs(self) -> dict[str, ReducerCost]:
        """The reducers' costs at the curve's speed (they are measured minutes away from it)."""
        unpruned = predict_from_counts(self.curve, [self.num_tokens])
        return {method: cost.at_speed(unpruned) for method, cost in self.costs.items()}

    def counts(self, candidate: Candidate) -> list[int]:
        """Tokens entering each block, then leaving the last one (depth + 1 values)."""
        if candidate.unpruned:
            return [self.num_tokens] * (self.depth + 1)
        return token_counts(self.num_tokens, self.prefix_tokens, self.depth, candidate.method, candidate.as_dict())

    def block_ms(self, tokens: int) -> float:
        """One plain block at `tokens` tokens: its share of the curve."""
        return predict_from_counts(self.curve, [tokens]) / self.depth

    def step_ms(self, method: str, tokens: int, remove: int, after_first: bool, follows_cut: bool = False) -> float:
        """One block of a `method` schedule (`remove` clamped as the patch clamps; flags as `at_block`)."""
        cost = self.charged_costs.get(method)
        ms = self.block_ms(tokens)
        if cost is None:
            return ms
        removed = removed_at(method, tokens - self.prefix_tokens, remove) if remove else 0
        return max(0.0, ms + cost.at_block(tokens, removed, after_first, follows_cut))  # a noisy cost can exceed it

    def predict(self, candidate: Candidate) -> float:
        """Predicted latency (ms) of the model running `candidate`; see the module docstring."""
        counts, removal, first = self.counts(candidate), candidate.as_dict(), candidate.first_block
        steps = sum(self.step_ms(candidate.method, counts[b], removal.get(b, 0), first is not None and b > first,
                                 cut_before(counts, b))
                    for b in range(self.depth))
        return steps + self.mixing_ms(counts)

    def mixing_ms(self, counts: Sequence[int]) -> float:
        """What blocks entered by `counts` pay beyond their sum for changing count (module docstring)."""
        changes = count_changes(counts, self.depth)
        if not changes or not self.kappa:
            return 0.0
        return self.kappa * math.sqrt(changes) * sum(self.block_ms(n) for n in counts[:self.depth])

    def predict_counts(self, layout: Sequence[int]) -> float:
        """The blocks' sum at `layout`'s counts (no reducer, no mixed counts) over the unpruned model's latency."""
        return sum(self.block_ms(n) for n in layout[:self.depth]) / (self.depth * self.block_ms(self.num_tokens))

    @cached_property
    def kappa(self) -> float:
        """The calibrated excess per square root of a count change (0: no calibration, or no excess at 95%)."""
        if self.mixed is None or not count_changes(self.mixed.layout, self.depth):
            return 0.0
        low, high = self.mixed.ci
        if low <= 1.0 <= high:
            return 0.0
        return (self.mixed.over_blocks - 1.0) / math.sqrt(count_changes(self.mixed.layout, self.depth))

    @property
    def baseline(self) -> float:
        return self.predict(NONE)
