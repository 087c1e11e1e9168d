"""A schedule across blocks as a search candidate (one reducer, tokens removed at each block; a hashable value
with a stable text key; removing nothing is the unpruned model), and the uniform families every search evaluates:
- `tome-constant`: ToMe with the same r at every block (Bolya et al., ICLR 2023);
- `tome-decreasing`: r falling linearly from 2r at the first block to 0 at the last (the authors' `parse_r`);
- `topk-rate`: top-k keeping the same share of the patch tokens at three evenly spaced blocks (EViT's 3, 6, 9);
- `pomt-block3`: single-block pomt at block 3 over R, plus every R that lands on a step's fast side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pomt.checks import check_method, check_removals
from pomt.errors import ScheduleError
from pomt.models.geometry import Geometry

REDUCERS = ("pomt", "topk", "tome", "l2norm")
UNPRUNED = "none"


@dataclass(frozen=True, order=True)
class Candidate:
    """`method` removing `remove` tokens at each (block, remove) of `removal` (sorted, no zeros)."""

    method: str
    removal: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, method: str, removal: Mapping[int, int]) -> Candidate:
        """The candidate removing removal[b] tokens at block b with `method` (zero entries dropped)."""
        kept = tuple(sorted((int(b), int(r)) for b, r in removal.items() if r))
        return cls(method, kept) if kept else cls(UNPRUNED)

    @property
    def unpruned(self) -> bool:
        return not self.removal

    @property
    def first_block(self) -> int | None:
        """The first block that removes tokens (None for the unpruned model)."""
        return self.removal[0][0] if self.removal else None

    def as_dict(self) -> dict[int, int]:
        """{block: remove}, as `pomt.patch` takes it."""
        return dict(self.removal)

    @property
    def key(self) -> str:
        """A stable text name, e.g. `tome:0=2,1=2` or `none`."""
        if self.unpruned:
            return UNPRUNED
        return f"{self.method}:" + ",".join(f"{b}={r}" for b, r in self.removal)

    def to_dict(self) -> dict:
        return {"method": self.method, "removal": {str(b): r for b, r in self.removal}}

    @classmethod
    def parse(cls, text: str) -> Candidate:
        """The candidate named by `key` (e.g. `tome:0=10,7=15`, or `none`); ScheduleError for anything else."""
        if text.strip() == UNPRUNED:
            return cls(UNPRUNED)
        method, colon, pairs = text.strip().partition(":")
        try:
            removal = {}
            for pair in pairs.split(","):
                block, remove = (int(v) for v in pair.split("="))
                if block in removal or block < 0 or remove < 0:
                    raise ValueError
                removal[block] = remove
        except ValueError:
            removal = {}
        if not colon or not removal:
            raise ScheduleError(f"cannot read schedule {text!r}: write METHOD:BLOCK=REMOVE,... (e.g. tome:0=10,7=15), "
                                "each block once, or none")
        return cls.of(check_method(method, REDUCERS), removal)

    @classmethod
    def from_dict(cls, data: Mapping) -> Candidate:
        """What `to_dict` wrote (the unpruned model's included)."""
        if not data["removal"]:
            return cls(UNPRUNED)
        return cls.of(check_method(data["method"], REDUCERS), {int(b): int(r) for b, r in data["removal"].items()})


NONE = Candidate(UNPRUNED)  # the unpruned model


def given_schedules(texts: Sequence[str], geometries: Iterable[Geometry]) -> list[Candidate]:
    """The schedules a benchmark measures beside its own (`--also`), in order, each once; PomtError for the first
    that is unreadable, unpruned or a removal one of `geometries`' models cannot take."""
    given = list(dict.fromkeys(Candidate.parse(text) for text in texts))
    if any(c.unpruned for c in given):
        raise ScheduleError("--also takes pruned schedules: the unpruned model is measured anyway")
    for geometry in geometries:
        for c in given:
            check_removals(c.method, c.as_dict(), geometry.num_tokens, geometry.prefix_tokens, geometry.depth)
    return given

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
    """pomt at one block removing shares of the patch tokens, and every removal landing on a step's fast side."""
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
