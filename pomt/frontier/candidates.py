"""A schedule across blocks as a search candidate: one reducer and how many tokens it removes at each block.

A value object, hashable and ordered, with a stable text key (the accuracy cache's and the outputs' name for
it). Every candidate that removes nothing is the same candidate, the unpruned model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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
        if not kept:
            return cls(UNPRUNED)
        return cls(check_method(method, REDUCERS), kept)

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
        """The candidate named by `key` (e.g. `tome:0=10,7=15`, or `none`); ScheduleError, in one line, for
        anything else."""
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
        return cls.of(method, removal)

    @classmethod
    def from_dict(cls, data: Mapping) -> Candidate:
        return cls.of(data["method"], {int(b): int(r) for b, r in data["removal"].items()})


NONE = Candidate(UNPRUNED)  # the unpruned model


def given_schedules(texts: Sequence[str], geometries: Iterable[Geometry]) -> list[Candidate]:
    """The schedules a user asks a benchmark to measure beside its own (`--also`), in order, each once: every one
    readable, pruned (the unpruned model is measured anyway) and a removal each of `geometries`' models can take;
    PomtError, in one line, for the first that is not."""
    given = list(dict.fromkeys(Candidate.parse(text) for text in texts))
    if any(c.unpruned for c in given):
        raise ScheduleError("--also takes pruned schedules: the unpruned model is measured anyway")
    for geometry in geometries:
        for c in given:
            check_removals(c.method, c.as_dict(), geometry.num_tokens, geometry.prefix_tokens, geometry.depth)
    return given
