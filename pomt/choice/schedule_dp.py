"""Per-block removals that are fastest for a stand-in accuracy drop: a dynamic programme over blocks
(pure maths).

The state is the token count entering a block, restricted to landing counts (an even grid, and the fast
side of every confirmed step, `Step.fast_tokens`: a block whose count lands there runs at the faster level). At
each block a schedule keeps its count or moves down to a lower landing count, paying that block's
predicted latency (`LatencyModel.step_ms`: the block, the reducer's own cost, ToMe's proportional
attention after its first merge) and spending its stand-in drop (`DropSurrogate`), rounded up to whole
buckets of `step`; the last block only keeps its count (`last_cut_block`: a cut there saves nothing).
Backward induction over (block, count, drop allowance) gives, for every allowance
k x step, the fastest schedule whose stand-in drop stays within it: the constrained optimum (to one bucket),
including the schedules off the convex hull that a Lagrangian sweep would miss. A knapsack over blocks whose
items depend on the count left, hence the count in the state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pomt.choice.candidates import Candidate
from pomt.choice.drop_surrogate import DropSurrogate, last_cut_block
from pomt.choice.schedule_latency import LatencyModel


def landing_counts(num_tokens: int, prefix_tokens: int, steps: Sequence[int] = (), grid: int = 24) -> list[int]:
    """N, about `grid` evenly spaced counts down to P + 1, and every step's fast side; highest first."""
    even = np.linspace(prefix_tokens + 1, num_tokens, num=max(2, grid)).round().astype(int).tolist()
    return sorted({num_tokens, *even, *(s for s in steps if prefix_tokens < s <= num_tokens)}, reverse=True)


class BlockProgramme:
    """The per-block moves of one reducer between landing counts, priced once (latency and stand-in drop
    per block); `schedules` runs the backward induction."""

    def __init__(self, latency: LatencyModel, method: str, surrogate: DropSurrogate, counts: Sequence[int],
                 max_share: float = 0.75) -> None:
        self.latency, self.method, self.depth = latency, method, latency.depth
        self.counts = sorted(set(counts) | {latency.num_tokens}, reverse=True)
        prefix, top = latency.prefix_tokens, latency.num_tokens
        self.moves: dict[int, list[tuple[int, float, list[float]]]] = {}  # n -> (m, ms, drop at each block)
        for n in self.counts:
            patches, moves = n - prefix, []
            for m in self.counts:
                remove = n - m
                if remove < 0 or (remove and not self._allowed(remove, patches, max_share)):
                    continue
                ms = latency.step_ms(method, n, remove, after_first=n < top)
                drops = [surrogate.at(b, remove / patches) if remove else 0.0 for b in range(self.depth)]
                moves.append((m, ms, drops))
            self.moves[n] = moves

    def _allowed(self, remove: int, patches: int, max_share: float) -> bool:
        if self.method == "tome":
            return remove <= patches // 2
        return remove <= patches - 1 and remove / patches <= max_share

    def schedules(self, step: float, buckets: int) -> list[Candidate]:
        """For each allowance k x step (k = 0..buckets), the fastest schedule within it; distinct, slowest
        (least stand-in drop) first. `step` = inf gives the fastest schedule whatever its drop."""
        size = buckets + 1
        value = {n: np.zeros(size) for n in self.counts}
        choices: list[dict[int, np.ndarray]] = []
        last = last_cut_block(self.depth)
        for block in reversed(range(self.depth)):
            new, chosen = {}, {}
            for n, moves in self.moves.items():
                best, pick = np.full(size, np.inf), np.zeros(size, dtype=int)
                for index, (m, ms, drops) in enumerate(moves):
                    if m < n and block > last:
                        continue
                    spend = 0 if drops[block] <= 0 else math.ceil(drops[block] / step - 1e-9)
                    if spend >= size:
                        continue
                    total = np.full(size, np.inf)
                    total[spend:] = ms + value[m][: size - spend]
                    better = total < best - 1e-12
                    best[better], pick[better] = total[better], index
                new[n], chosen[n] = best, pick
            value = new
            choices.insert(0, chosen)
        found = dict.fromkeys(self._follow(choices, step, k) for k in range(size))
        return sorted(found, key=lambda c: (-self.latency.predict(c), c))

    def _follow(self, choices: list[dict[int, np.ndarray]], step: float, allowance: int) -> Candidate:
        removal, n = {}, self.latency.num_tokens
        for block in range(self.depth):
            m, _, drops = self.moves[n][int(choices[block][n][allowance])]
            allowance -= 0 if drops[block] <= 0 else math.ceil(drops[block] / step - 1e-9)
            if m < n:
                removal[block] = n - m
            n = m
        return Candidate.of(self.method, removal)
