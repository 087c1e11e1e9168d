"""A cheap stand-in for a schedule's accuracy drop, fitted on single-block probes, to rank candidates
before they are measured (pure maths).

Additive over blocks: drop(schedule) = sum_b d(b, s_b), s_b the share of the patch tokens entering block b
that it removes. d is measured by probes, single-block schedules at a few blocks and shares, and
interpolated: linearly in the share from d(b, 0) = 0, extended past the largest probed share along its last
slope (a larger cut never looks free), then linearly between probed blocks, held beyond them. It ignores how
cuts compound across blocks; the search measures the candidates it proposes, so the stand-in only has to
order them.

A probe's d is the drop as the goal judges it (`pomt.frontier.pareto.drop_within`): the upper one-sided bound
of its paired drop, at the stand-in's confidence (`FrontierSettings.stand_in_confidence`, below the goal's so that
the margins of the blocks a schedule cuts add up to its own), less the bound of a schedule that changed no
image (which every schedule pays once, not once a block), floored at 0 and made non-decreasing in the share. A schedule
that reshuffles predictions, losing as many images as it gains, has no mean drop but a bound that grows
with the images it changed; on its mean drop it looked free. On the digits case at batch 1 every
late-block ToMe probe read a mean drop of 0 (tome:6=24 lost 12 images and gained 14), so the programme
proposed cutting half the tokens at blocks 6-10 as free, and each of those proposals failed the goal
(bounds 1.0-1.8 points): the bisection's few measurements went to them, and whether a schedule that met
the goal was measured at all came down to one proposal's rank (docs/known-weaknesses.md, item 19). At a
confidence of 0.5 the bound is the measured drop, and d is as before.

Refitted on measured schedules (`fit_to_schedules`): the same grid, with one more share below the smallest
probed, fitted by least squares to the judged drops of every schedule of the reducer measured so far (the
uniform families, the probes, what the search measured), each cell >= 0 and non-decreasing in the share. Summed
single-block bounds overprice schedules that cut at many blocks: on the digits case at batch 16 they put
uniform ToMe r = 3 at 2.35 points (its bound: 0.24) and `tome:0=10,1=5,7=12,8=6,9=4` at 2.34 (0.93), each
probe's bound carrying its own noise and the blocks' cuts flipping the same hard images. Fitted to the
multi-block schedules too, small cuts come out cheap where those schedules say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from pomt.frontier.candidates import Candidate
from pomt.stats import CONFIDENCE, Proportion


def last_cut_block(depth: int) -> int:
    """The last block whose cut a search considers: D - 2. Tokens removed after the last block leave nothing
    to run faster (the head reads the class token), so a cut there only pays the reducer's cost, and a probe
    there reads "free" for any share: interpolated towards it, cuts at blocks 8-10 of 12 looked cheap on the
    digits case where each lost 5-10 images and gained as many."""
    return max(0, depth - 2)


def probe_candidates(method: str, num_tokens: int, prefix_tokens: int, depth: int, blocks: int = 4,
                     shares: tuple[float, ...] = (0.25, 0.5)) -> dict[Candidate, tuple[int, float]]:
    """{single-block candidate: (block, share removed)} at `blocks` evenly spaced blocks from the first to the
    last whose cut changes what runs after it (`last_cut_block`), and each share of the N - P patch tokens
    (ToMe at most half)."""
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
    """A probe's drop as the goal judges it, less what a schedule that changed nothing would be judged (a
    fraction, >= 0; the module docstring); the measured drop where the probe was not measured paired."""
    bound = measured.drop_bound(confidence)
    if bound is None:
        return max(0.0, baseline.value - measured.value)
    unchanged = Proportion(baseline.successes, baseline.trials, 0, 0).drop_bound(confidence) or 0.0
    return max(0.0, bound - unchanged)


def fit_surrogate(probes: Mapping[tuple[int, float], Proportion], baseline: Proportion,
                  confidence: float = CONFIDENCE) -> DropSurrogate:
    """The surrogate from probe accuracies {(block, share): measured} and the unpruned model's, each probe's
    drop judged at `confidence` (`judged_drop`); shares probed at one block but not another are filled by
    interpolation along the share at that block."""
    blocks = tuple(sorted({b for b, _ in probes}))
    shares = tuple(sorted({s for _, s in probes}))
    rows = []
    for block in blocks:
        known = sorted((s, judged_drop(a, baseline, confidence)) for (b, s), a in probes.items() if b == block)
        xs, ys = [0.0] + [s for s, _ in known], [0.0] + list(np.maximum.accumulate([d for _, d in known]))
        rows.append(tuple(float(np.interp(s, xs, ys)) for s in shares))
    return DropSurrogate(blocks, shares, tuple(rows))


def refit_shares(shares: Sequence[float]) -> tuple[float, ...]:
    """The shares a refitted stand-in is fitted on: the probed ones and half the smallest, where the drop of
    small cuts spread over many blocks is learnt from the schedules that make them."""
    return tuple(sorted({min(shares) / 2, *shares}))


def fit_to_schedules(blocks: Sequence[int], shares: Sequence[float],
                     observed: Sequence[tuple[Candidate, Sequence[int], float]], prefix_tokens: int) -> DropSurrogate:
    """The stand-in on `blocks` x `shares` whose summed drops best fit `observed` (candidate, the counts
    entering its blocks, its drop as a fraction), least squares with every cell >= 0 and non-decreasing in
    the share: `scipy.optimize.nnls` on each row's increments. The stand-in is linear in its cells, so the
    design matrix is read off one unit cell at a time."""
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
