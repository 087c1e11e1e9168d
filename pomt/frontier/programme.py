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

Mixed counts. Where the latency model charges them (`LatencyModel.kappa` not 0), a schedule whose count changes
c times pays kappa sqrt(c) of its blocks' sum: not a sum over blocks, but one for each total c. So the state
also holds the total C a schedule will make and the changes still to make (every cut is one), each block
pays kappa sqrt(C) of its plain block on top of its step, and each allowance takes the best C: exact for
`LatencyModel.predict`, at about twice the time. On the digits case (deit_tiny at 112 px, kappa +1.9% at
batch 16 and +5.0% at batch 1) it proposed schedules up to 0.8% faster by `predict` than the programme
without the term, at a few of the allowances, and the same elsewhere: its schedules cut at few blocks.

Cuts in a row. ToMe's merge right after a merging block is charged `ReducerCost.later` on top of its cost (the
latency model's rule), so where that is not 0 the state also says whether the block before cut, and a cut
is priced by it: exact for `LatencyModel.predict`, at twice the time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from pomt.frontier.candidates import Candidate
from pomt.frontier.latency import LatencyModel
from pomt.frontier.surrogate import DropSurrogate, last_cut_block


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
        self.tracks_changes = bool(latency.kappa)  # module docstring, Mixed counts
        cost = latency.charged_costs.get(method)
        self.tracks_cuts = cost is not None and bool(cost.later)  # module docstring, Cuts in a row
        prefix, top = latency.prefix_tokens, latency.num_tokens
        # n -> (m, ms after a block that kept its count, ms after one that cut, drop at each block)
        self.moves: dict[int, list[tuple[int, float, float, list[float]]]] = {}
        for n in self.counts:
            patches, moves = n - prefix, []
            for m in self.counts:
                remove = n - m
                if remove < 0 or (remove and not self._allowed(remove, patches, max_share)):
                    continue
                ms = latency.step_ms(method, n, remove, after_first=n < top)
                after_cut = latency.step_ms(method, n, remove, after_first=n < top, follows_cut=True)
                drops = [surrogate.at(b, remove / patches) if remove else 0.0 for b in range(self.depth)]
                moves.append((m, ms, after_cut, drops))
            self.moves[n] = moves

    def _allowed(self, remove: int, patches: int, max_share: float) -> bool:
        if self.method == "tome":
            return remove <= patches // 2
        return remove <= patches - 1 and remove / patches <= max_share

    def schedules(self, step: float, buckets: int) -> list[Candidate]:
        """For each allowance k x step (k = 0..buckets), the fastest schedule within it; distinct, slowest
        (least stand-in drop) first. `step` = inf gives the fastest schedule whatever its drop."""
        size, last = buckets + 1, last_cut_block(self.depth)
        changes = last + 2 if self.tracks_changes else 1  # one change at each cut, cuts at blocks 0..last
        charge = self.latency.kappa * np.sqrt(np.arange(changes))  # the mixed counts' share, by total changes
        shape = (changes, changes, size)  # (total changes C, changes still to make, allowance)
        end = np.full(shape, np.inf)
        end[:, 0, :] = 0.0
        flags = (False, True) if self.tracks_cuts else (False,)
        value = {(n, cut): end for n in self.counts for cut in flags}
        choices: list[dict[tuple[int, bool], np.ndarray]] = []
        for block in reversed(range(self.depth)):
            new, chosen = {}, {}
            for (n, moves), after_cut in itertools.product(self.moves.items(), flags):
                best, pick = np.full(shape, np.inf), np.zeros(shape, dtype=int)
                price = (self.latency.block_ms(n) * charge)[:, None, None]
                for index, (m, kept_ms, cut_ms, drops) in enumerate(moves):
                    if m < n and block > last:
                        continue
                    spend = 0 if drops[block] <= 0 else math.ceil(drops[block] / step - 1e-9)
                    if spend >= size:
                        continue
                    total = np.full(shape, np.inf)
                    cut = int(m < n and self.tracks_changes)
                    total[:, cut:, spend:] = value[self._state(n, m)][:, :changes - cut, :size - spend]
                    total += (cut_ms if after_cut else kept_ms) + price
                    better = total < best - 1e-12
                    best[better], pick[better] = total[better], index
                new[n, after_cut], chosen[n, after_cut] = best, pick
            value = new
            choices.insert(0, chosen)
        top = value[self.latency.num_tokens, False]
        planned = top[np.arange(changes), np.arange(changes)].argmin(axis=0)  # each allowance's best total C
        found = dict.fromkeys(self._follow(choices, step, int(planned[k]), k) for k in range(size))
        return sorted(found, key=lambda c: (-self.latency.predict(c), c))

    def _state(self, n: int, m: int) -> tuple[int, bool]:
        """The state after a block that moves from n to m tokens: m, and whether it cut (where that is priced)."""
        return m, self.tracks_cuts and m < n

    def _follow(self, choices: list[dict[tuple[int, bool], np.ndarray]], step: float, planned: int,
                allowance: int) -> Candidate:
        """The schedule the choices make from N tokens with `planned` count changes and `allowance` buckets."""
        removal, state, left = {}, (self.latency.num_tokens, False), planned
        for block in range(self.depth):
            n = state[0]
            m, _, _, drops = self.moves[n][int(choices[block][state][planned, left, allowance])]
            allowance -= 0 if drops[block] <= 0 else math.ceil(drops[block] / step - 1e-9)
            if m < n:
                removal[block], left = n - m, left - int(self.tracks_changes)
            state = self._state(n, m)
        return Candidate.of(self.method, removal)
