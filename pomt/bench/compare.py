"""Accuracies compared with intervals: every variant against the schedule (or, without one, the unpruned model).

The variants ran on the same images, so a difference is judged paired, from the images one got right and the
other did not (`pomt.stats.paired_difference_interval`): two variants that change few images differ
by an amount known far better than either accuracy. Without the per-image outcomes (rows alone) the interval
is the unpaired one, which errs wide. A difference whose interval holds 0 is reported as such, not ranked: the
images measured cannot tell the two apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from pomt.bench.accuracy import proportion_of
from pomt.bench.variants import BASELINE, SCHEDULE
from pomt.stats import difference_interval, paired_difference_interval


@dataclass(frozen=True)
class Comparison:
    """`name`'s accuracy minus `reference`'s, its interval, and its latency over the reference's."""

    name: str
    amount: str
    reference: str
    difference: float
    ci: tuple[float, float]
    latency_ratio: float | None
    paired: bool = False  # the interval is the paired one (same images, per-image outcomes)

    @property
    def verdict(self) -> str:
        if self.ci[0] <= 0.0 <= self.ci[1]:
            return "indistinguishable"
        return "ahead" if self.difference > 0 else "behind"

    def to_dict(self) -> dict:
        return {"name": self.name, "amount": self.amount, "reference": self.reference,
                "difference": round(self.difference, 6), "ci": [round(c, 6) for c in self.ci], "verdict": self.verdict,
                "latency_ratio": None if self.latency_ratio is None else round(self.latency_ratio, 5),
                "paired": self.paired}

    @classmethod
    def from_dict(cls, data: dict) -> Comparison:
        return cls(data["name"], data["amount"], data["reference"], data["difference"], tuple(data["ci"]),
                   data["latency_ratio"], data.get("paired", False))

    def line(self) -> str:
        low, high = (100 * c for c in self.ci)
        what = f"{self.name} ({self.amount})" if self.amount else self.name
        verdict = {"indistinguishable": "the interval holds 0: not ranked",
                   "ahead": f"{self.name} more accurate", "behind": f"{self.reference} more accurate"}[self.verdict]
        latency = "" if self.latency_ratio is None else f"; latency {self.latency_ratio:.3f}x the {self.reference}'s"
        return (f"{what}: accuracy {100 * self.difference:+.1f} pts vs {self.reference} "
                f"[{low:+.1f}, {high:+.1f}]: {verdict}{latency}")


def compare(rows: Sequence[dict], images: int, outcomes: Mapping[str, torch.Tensor] | None = None
            ) -> list[Comparison]:
    """Each variant against the schedule row where there is one, else against the unpruned row; empty when
    accuracy was not measured. `outcomes`: {variant: one bool per image, right or not}, for paired intervals."""
    by_name = {row["method"]: row for row in rows}
    reference = SCHEDULE if SCHEDULE in by_name else BASELINE
    ref = by_name.get(reference)
    ref_accuracy = proportion_of(ref, images) if ref else None
    if ref_accuracy is None:
        return []
    comparisons = []
    for row in rows:
        accuracy = proportion_of(row, images)
        if row["method"] == reference or accuracy is None:
            continue
        latency = row.get("latency_ms"), ref.get("latency_ms")
        ratio = latency[0] / latency[1] if latency[0] and latency[1] else None
        mine, theirs = (outcomes or {}).get(row["method"]), (outcomes or {}).get(reference)
        paired = mine is not None and theirs is not None
        ci = (paired_difference_interval(int(mine.sum()), int(theirs.sum()), int((mine & ~theirs).sum()),
                                         int((theirs & ~mine).sum()), images) if paired
              else difference_interval(accuracy, ref_accuracy))
        comparisons.append(Comparison(row["method"], row.get("amount") or "", reference,
                                      accuracy.value - ref_accuracy.value, ci, ratio, paired))
    return comparisons
