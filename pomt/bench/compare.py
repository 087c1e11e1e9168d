"""Accuracies compared with intervals: every variant against the schedule (or, without one, the unpruned model).

A difference whose interval (`pomt.choice.binomial.difference_interval`) holds 0 is reported as such, not
ranked: the images measured cannot tell the two apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pomt.bench.accuracy import proportion_of
from pomt.bench.variants import BASELINE, SCHEDULE
from pomt.choice.binomial import difference_interval


@dataclass(frozen=True)
class Comparison:
    """`name`'s accuracy minus `reference`'s, its interval, and its latency over the reference's."""

    name: str
    amount: str
    reference: str
    difference: float
    ci: tuple[float, float]
    latency_ratio: float | None

    @property
    def verdict(self) -> str:
        if self.ci[0] <= 0.0 <= self.ci[1]:
            return "indistinguishable"
        return "ahead" if self.difference > 0 else "behind"

    def to_dict(self) -> dict:
        return {"name": self.name, "amount": self.amount, "reference": self.reference,
                "difference": round(self.difference, 6), "ci": [round(c, 6) for c in self.ci], "verdict": self.verdict,
                "latency_ratio": None if self.latency_ratio is None else round(self.latency_ratio, 5)}

    @classmethod
    def from_dict(cls, data: dict) -> Comparison:
        return cls(data["name"], data["amount"], data["reference"], data["difference"], tuple(data["ci"]),
                   data["latency_ratio"])

    def line(self) -> str:
        low, high = (100 * c for c in self.ci)
        what = f"{self.name} ({self.amount})" if self.amount else self.name
        verdict = {"indistinguishable": "the interval holds 0: not ranked",
                   "ahead": f"{self.name} more accurate", "behind": f"{self.reference} more accurate"}[self.verdict]
        latency = "" if self.latency_ratio is None else f"; latency {self.latency_ratio:.3f}x the {self.reference}'s"
        return (f"{what}: accuracy {100 * self.difference:+.1f} pts vs {self.reference} "
                f"[{low:+.1f}, {high:+.1f}]: {verdict}{latency}")


def compare(rows: Sequence[dict], images: int) -> list[Comparison]:
    """Each variant against the schedule row where there is one, else against the unpruned row; empty when
    accuracy was not measured."""
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
        comparisons.append(Comparison(row["method"], row.get("amount") or "", reference,
                                      accuracy.value - ref_accuracy.value,
                                      difference_interval(accuracy, ref_accuracy), ratio))
    return comparisons
