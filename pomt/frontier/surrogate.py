"""The search's stand-in for a schedule's accuracy drop, and the dynamic programme that proposes the fastest
schedules within a stand-in drop (pure maths).

Stand-in: drop(schedule) = sum_b d(b, s_b), s_b the share of the patch tokens entering block b that it removes, d
interpolated between the probes' `judged_drop` and refitted to every schedule measured; it only orders proposals.
Programme: backward induction over (block, landing count, drop allowance): exact for `LatencyModel.predict` to one
bucket of drop.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from pomt.frontier.candidates import Candidate
from pomt.frontier.latency import LatencyModel
from pomt.stats import CONFIDENCE, Proportion


def last_cut_block(depth: int) -> int:
    """The last block whose cut a search considers, D - 2: a cut at the last block leaves nothing to run faster."""
    return max(0, depth - 2)


def probe_candidates(method: str, num_tokens: int, prefix_tokens: int, depth: int, blocks: int = 4,
                     shares: tuple[float, ...] = (0.25, 0.5)) -> dict[Candidate, tuple[int, float]]:
    """{single-block candidate: (block, share removed)} at `blocks` evenly spaced blocks up to `last_cut_block`,
    at each share of the N - P patch tokens (ToMe at most half)."""
    patches = num_tokens - prefix_tokens
    most = patches // 2 if method == "tome" else patches - 1
    last = last_cut_block(depth)
    probes = {}
    for block in sorted({int(b) for b in np.linspace(0, last, num=max(1, min(blocks, last + 1))).round()}):
        for share in shares:
            remove = min(most, max(1, round(share * patches)))
            if remove >= 1:
                probes[Candidate.of(method, {block: remove})] = (block, remove / patches)
    return probes


@dataclass(frozen=True)
class DropSurrogate:
    """d(block, share) on a grid of probed blocks x shares (accuracy-drop fractions, >= 0)."""

    blocks: tuple[int, ...]
    shares: tuple[float, ...]
    drops: tuple[tuple[float, ...], ...]  # drops[i][j]: block blocks[i], share shares[j]

    def at(self, block: int, share: float) -> float:
        """d(block, share); 0 for no removal."""
        if share <= 0:
            return 0.0
        per_block = [self._along_share(row, share) for row in self.drops]
        return float(np.interp(block, self.blocks, per_block))

    def _along_share(self, row: tuple[float, ...], share: float) -> float:
        xs, ys = (0.0, *self.shares), (0.0, *row)
        if share <= xs[-1]:
            return float(np.interp(share, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (share - xs[-1])

    def predict(self, counts: list[int], candidate: Candidate, prefix_tokens: int) -> float:
        """The stand-in drop of `candidate`, whose blocks receive `counts` tokens."""
        return sum(self.at(b, (counts[b] - counts[b + 1]) / (counts[b] - prefix_tokens))
                   for b, _ in candidate.removal)


def judged_drop(measured: Proportion, baseline: Proportion, confidence: float = CONFIDENCE) -> float:
    """A probe's drop bound at `confidence` less an unchanged schedule's (>= 0); unpaired: the measured drop."""
    bound = measured.drop_bound(confidence)
    if bound is None:
        return max(0.0, baseline.value - measured.value)
    unchanged = Proportion(baseline.successes, baseline.trials, 0, 0).drop_bound(confidence) or 0.0
    return max(0.0, bound - unchanged)


def fit_surrogate(probes: Mapping[tuple[int, float], Proportion], baseline: Proportion,
                  confidence: float = CONFIDENCE) -> DropSurrogate:
    """The surrogate from probe accuracies {(block, share): measured}; shares missing at a block interpolated."""
    blocks = tuple(sorted({b for b, _ in probes}))
    shares = tuple(sorted({s for _, s in probes}))
    rows = []
    for block in blocks:
        known = sorted((s, judged_drop(a, baseline, confidence)) for (b, s), a in probes.items() if b == block)
        xs, ys = [0.0] + [s for s, _ in known], [0.0] + list(np.maximum.accumulate([d for _, d in known]))
        rows.append(tuple(float(np.interp(s, xs, ys)) for s in shares))
    return DropSurrogate(blocks, shares, tuple(rows))


def refit_shares(shares: Sequence[float]) -> tuple[float, ...]:
    """The shares a refitted stand-in is fitted on: the probed ones and half the smallest."""
    return tuple(sorted({min(shares) / 2, *shares}))


def fit_to_schedules(blocks: Sequence[int], shares: Sequence[float],
                     observed: Sequence[tuple[Candidate, Sequence[int], float]], prefix_tokens: int) -> DropSurrogate:
    """The stand-in on `blocks` x `shares` whose summed drops best fit `observed` (candidate, counts entering its
    blocks, drop as a fraction), cells >= 0 and non-decreasing in the share (`nnls` on each row's increments)."""
    blocks, shares = tuple(blocks), tuple(shares)
    cells = len(blocks) * len(shares)
    design = np.zeros((len(observed), cells))
    for cell in range(cells):
        unit = np.zeros(cells)
        unit[cell] = 1.0
        basis = DropSurrogate(blocks, shares, tuple(map(tuple, unit.reshape(len(blocks), len(shares)))))
        design[:, cell] = [basis.predict(list(counts), candidate, prefix_tokens) for candidate, counts, _ in observed]
    cumulative = np.kron(np.eye(len(blocks)), np.tril(np.ones((len(shares), len(shares)))))
    increments, _ = nnls(design @ cumulative, np.array([drop for _, _, drop in observed]))
    drops = (cumulative @ increments).reshape(len(blocks), len(shares))
    return DropSurrogate(blocks, shares, tuple(tuple(float(d) for d in row) for row in drops))


def landing_counts(num_tokens: int, prefix_tokens: int, steps: Sequence[int] = (), grid: int = 24) -> list[int]:
    """N, about `grid` evenly spaced counts down to P + 1, and every step's fast side; highest first."""
    even = np.linspace(prefix_tokens + 1, num_tokens, num=max(2, grid)).round().astype(int).tolist()
    return sorted({num_tokens, *even, *(s for s in steps if prefix_tokens < s <= num_tokens)}, reverse=True)


class BlockProgramme:
    """One reducer's per-block moves between landing counts, priced once; `schedules` runs the backward induction,
    its state holding count changes (total, to make) and a cut before where the latency model charges them."""

    def __init__(self, latency: LatencyModel, method: str, surrogate: DropSurrogate, counts: Sequence[int],
                 max_share: float = 0.75) -> None:
        self.latency, self.method, self.depth = latency, method, latency.depth
        self.counts = sorted(set(counts) | {latency.num_tokens}, reverse=True)
        self.tracks_changes = bool(latency.kappa)
        cost = latency.charged_costs.get(method)
        self.tracks_cuts = cost is not None and bool(cost.later)
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
        """For each allowance k x step (k = 0..buckets; step inf: any drop) the fastest schedule, slowest first."""
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
        """The state after a block moving from n to m tokens: m, and whether it cut (where priced)."""
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
