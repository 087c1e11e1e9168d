"""The one setting a benchmark turns per reducer, and the removal each value of it means.

- `tome`: r merged at every block (Bolya et al.), up to the largest r that no block has to clamp (ToMe merges
  at most half the patch tokens entering a block);
- `topk`: a keep rate at the rate blocks of `pomt.frontier.candidates.topk_rate` (EViT's 3, 6, 9 of 12); the value
  is the number of patch tokens not kept, rate = 1 - value / patch tokens;
- `pomt`, `l2norm`, `random`: R removed at one block (`--prune-block`).

Values are integers from 0 (nothing removed) to `high`; the tokens every block receives never grow with the
value, so latency falls (up to noise and steps) as the value rises, and a bisection can tune it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pomt.checks import check_prune_block, check_removals
from pomt.errors import PatchError
from pomt.frontier.candidates import topk_rate
from pomt.models.geometry import Geometry


@dataclass(frozen=True)
class Knob:
    """A reducer's setting from 0 to `high` on `geometry`; `removal(value)` is its {block: remove}."""

    method: str
    geometry: Geometry
    high: int
    prune_block: int = 3

    def removal(self, value: int) -> dict[int, int]:
        """{block: tokens removed} at `value` (empty at 0)."""
        if not 0 <= value <= self.high:
            raise PatchError(f"{self.method} setting {value} is outside its range 0..{self.high}")
        g = self.geometry
        if value == 0:
            return {}
        if self.method == "tome":
            return dict.fromkeys(range(g.depth), value)
        if self.method == "topk":
            rate = 1 - value / g.patch_tokens
            return topk_rate(g.num_tokens, g.prefix_tokens, g.depth, [rate])[0].as_dict()
        return {self.prune_block: value}

    def describe(self, value: int) -> str:
        """The setting as a user reads it: "r=4", "keep 0.70", "R=40"."""
        if self.method == "tome":
            return f"r={value}"
        if self.method == "topk":
            return f"keep {1 - value / self.geometry.patch_tokens:.3f}"
        return f"R={value}"


def largest_constant_r(geometry: Geometry) -> int:
    """The largest r ToMe can merge at every block without clamping (0 when even r = 1 cannot)."""
    r = 0
    while True:
        try:
            check_removals("tome", dict.fromkeys(range(geometry.depth), r + 1), geometry.num_tokens,
                           geometry.prefix_tokens, geometry.depth)
        except PatchError:
            return r
        r += 1


def knob(method: str, geometry: Geometry, prune_block: int = 3) -> Knob:
    """The setting of `method` on a model of `geometry` (see the module docstring)."""
    if method == "tome":
        return Knob(method, geometry, largest_constant_r(geometry), prune_block)
    if method != "topk":
        check_prune_block(prune_block, geometry.depth, "--prune-block")
    return Knob(method, geometry, geometry.patch_tokens - 1, prune_block)
