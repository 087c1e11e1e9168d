"""The benchmark's accuracy: every variant on the same seeded images, each with its Wilson interval, and every
variant compared with the schedule (or, without one, the unpruned model).

Top-1 on an ImageFolder, or agreement with the unpruned model (a folder's images with `--agreement`, or seeded
random images without a folder). The variants ran on the same images, so a difference is judged paired, from the
images one got right and the other did not; without per-image outcomes the interval is the unpaired one, which
errs wide. A difference whose interval holds 0 is reported as such, not ranked.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset

from pomt import accuracy as acc
from pomt.bench.config import BASELINE, RANDOM_SAMPLES, SCHEDULE, BenchConfig
from pomt.bench.variants import Variant
from pomt.offline.config import SAMPLE_CAP
from pomt.runtimes import parameter_dtype
from pomt.stats import Proportion, difference_interval, paired_difference_interval


@dataclass(frozen=True)
class AccuracyImages:
    """The images every variant's accuracy is measured on and their kind (`pomt.accuracy.TOP1` or AGREEMENT),
    `samples` rounded up to whole batches of `batch`, in the order `seed` shuffles."""

    dataset: Dataset
    kind: str
    samples: int
    batch: int
    seed: int = 0


def accuracy_data(config: BenchConfig, model: nn.Module, size: tuple[int, int], batch: int) -> AccuracyImages | None:
    """The images `config` measures accuracy on, labels checked against `model` before anything is timed; random
    images (agreement) without a folder; None when no accuracy is asked."""
    samples, root, seed = config.accuracy_samples, config.dataset_root, config.seed
    if samples == 0:
        return None
    if root is None:
        samples = samples or RANDOM_SAMPLES
        return AccuracyImages(acc.random_images(-(-samples // batch) * batch, size, seed), acc.AGREEMENT,
                              samples, batch, seed)
    dataset, kind = acc.open_image_folder(root, acc.eval_transform(model, size), agreement=config.agreement)
    acc.check_labels(dataset, kind, model, root)
    return AccuracyImages(dataset, kind, min(len(dataset), samples or SAMPLE_CAP), batch, seed)


def add_accuracy(rows: dict[str, dict], variants: Sequence[Variant], data: AccuracyImages | None, device: str,
                 progress: bool | None = None) -> tuple[str, int, dict[str, torch.Tensor]]:
    """Fill each row's `accuracy`, `accuracy_low` and `accuracy_high` on `data`; returns (kind, images, {variant:
    one bool per image, right or not}). `progress`: a bar over the batches (None: when stderr is a terminal)."""
    if data is None:
        for row in rows.values():
            row.update(accuracy=None, accuracy_low=None, accuracy_high=None, accuracy_correct=None)
        return "", 0, {}
    loader = acc.whole_batches(data.dataset, -(-data.samples // data.batch) * data.batch, data.batch, data.seed)
    forwards = {v.name: lambda images, _, model=v.model: model(images) for v in variants}
    show = sys.stderr.isatty() if progress is None else progress
    right = acc.outcomes(forwards, acc.Images(loader, data.kind, device, show), forwards[BASELINE],
                         parameter_dtype(variants[0].model))
    images = len(right[BASELINE])
    for name, hits in right.items():
        proportion = Proportion(int(hits.sum()), images)
        low, high = proportion.interval()
        rows[name].update(accuracy=proportion.value, accuracy_low=low, accuracy_high=high,
                          accuracy_correct=proportion.successes)
    return data.kind, images, right


def proportion_of(row: dict, images: int) -> Proportion | None:
    """A row's accuracy as successes of `images` (None where accuracy was not measured)."""
    correct = row.get("accuracy_correct")
    return None if correct is None or not images else Proportion(int(correct), images)


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


def compare(rows: Sequence[dict], images: int, outcomes: Mapping[str, torch.Tensor] | None = None) -> list[Comparison]:
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
