"""The uniform schedule families, always evaluated: as candidates, and as the baselines a search must beat.

- `tome-constant`: ToMe with the same r at every block (Bolya et al., ICLR 2023).
- `tome-decreasing`: ToMe's decreasing schedule, r falling linearly from 2r at the first block to 0 at the
  last (the authors' `parse_r` with inflection -1), about as many merges as constant r in all.
- `topk-rate`: top-k keeping the same share of the patch tokens at three evenly spaced blocks (EViT's
  blocks 3, 6 and 9 of 12, scaled to the depth).
- `pomt-block3`: single-block pomt at block 3 (as POMT) over R, plus every R that lands on a step's fast side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pomt.frontier.candidates import Candidate

FAMILIES = ("tome-constant", "tome-decreasing", "topk-rate", "pomt-block3")
TOPK_RATES = (0.9, 0.8, 0.7, 0.6, 0.5)
POMT_SHARES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
POMT_BLOCK = 3
FAMILY_POINTS = 5  # r values of the ToMe families by default


def tome_values(num_tokens: int, prefix_tokens: int, depth: int, points: int) -> list[int]:
    """r from 1 to about the value that merges every patch token over the depth, `points` of them."""
    top = max(1, math.ceil((num_tokens - prefix_tokens) / depth))
    return sorted({int(r) for r in np.linspace(1, top, num=max(1, points)).round()})


def tome_constant(depth: int, values: Sequence[int]) -> list[Candidate]:
    return [Candidate.of("tome", dict.fromkeys(range(depth), r)) for r in values]


def decreasing_r(depth: int, r: int) -> list[int]:
    """ToMe's decreasing schedule: int(2r - 2r * b / (depth - 1)) at block b (the authors' parse_r)."""
    if depth == 1:
        return [r]
    return [int(2 * r - 2 * r * b / (depth - 1)) for b in range(depth)]


def tome_decreasing(depth: int, values: Sequence[int]) -> list[Candidate]:
    return [Candidate.of("tome", dict(enumerate(decreasing_r(depth, r)))) for r in values]


def rate_blocks(depth: int) -> list[int]:
    """Three evenly spaced pruning blocks: 3, 6, 9 at depth 12 (EViT's), fewer when the model is shallower."""
    return sorted({min(depth - 1, round(depth * k / 4)) for k in (1, 2, 3)})


def topk_rate(num_tokens: int, prefix_tokens: int, depth: int, rates: Sequence[float] = TOPK_RATES) -> list[Candidate]:
    """Top-k keeping `rate` of the patch tokens entering each of `rate_blocks` (at least one)."""
    candidates = []
    for rate in rates:
        patches, removal = num_tokens - prefix_tokens, {}
        for block in rate_blocks(depth):
            remove = patches - max(1, round(rate * patches))
            removal[block], patches = remove, patches - remove
        candidates.append(Candidate.of("topk", removal))
    return candidates


def pomt_single(num_tokens: int, prefix_tokens: int, depth: int, steps: Sequence[int] = (),
                shares: Sequence[float] = POMT_SHARES, block: int = POMT_BLOCK) -> list[Candidate]:
    """pomt at one block (3, or the last of a shallower model) removing shares of the patch tokens, and
    every removal that lands on a step's fast side (`steps`: those token counts, `Step.fast_tokens`)."""
    block = min(block, depth - 1)
    patches = num_tokens - prefix_tokens
    removals = {max(1, round(s * patches)) for s in shares}
    removals |= {num_tokens - s for s in steps if prefix_tokens < s < num_tokens}
    return [Candidate.of("pomt", {block: r}) for r in sorted(removals) if r < patches]


def uniform_families(num_tokens: int, prefix_tokens: int, depth: int, steps: Sequence[int] = (),
                     points: int = FAMILY_POINTS) -> dict[str, list[Candidate]]:
    """{family name: its candidates} (see the module docstring); `points` r values for the ToMe families."""
    values = tome_values(num_tokens, prefix_tokens, depth, points)
    return dict(zip(FAMILIES, (tome_constant(depth, values), tome_decreasing(depth, values),
                               topk_rate(num_tokens, prefix_tokens, depth),
                               pomt_single(num_tokens, prefix_tokens, depth, steps)), strict=True))
