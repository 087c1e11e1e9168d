"""The benchmark's accuracy: every variant on the same seeded images, each with its Wilson interval, and whether
it got each image right (so that two variants compare paired, `pomt.bench.compare`).

Top-1 on an ImageFolder, or agreement with the unpruned model (a folder's images with `--agreement`, or
seeded random images without a folder). As many images as the offline computation takes by default
(`OfflineConfig.accuracy_samples`), so a difference the benchmark prints is one the schedule was chosen on.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.data import Dataset

from pomt import accuracy as acc
from pomt.bench.variants import BASELINE, Variant
from pomt.offline.config import OfflineConfig
from pomt.runtimes import parameter_dtype
from pomt.stats import Proportion

DEFAULT_SAMPLES: int = OfflineConfig.accuracy_samples


def accuracy_data(samples: int, dataset_root, agreement: bool, model: nn.Module, size: tuple[int, int], batch: int,
                  seed: int = 0) -> tuple[Dataset, str] | None:
    """The images the accuracy is measured on and their kind, opened and their labels checked against `model`
    (before anything is timed, so that bad data fails at once); random images (agreement) without a folder; None
    when no accuracy is asked (`samples` <= 0)."""
    if samples <= 0:
        return None
    if dataset_root is None:
        return acc.random_images(-(-samples // batch) * batch, size, seed), acc.AGREEMENT
    dataset, kind = acc.open_image_folder(dataset_root, acc.eval_transform(model, size), agreement=agreement)
    acc.check_labels(dataset, kind, model, dataset_root)
    return dataset, kind


def add_accuracy(
    rows: dict[str, dict],
    variants: Sequence[Variant],
    samples: int,
    data: tuple[Dataset, str] | None,
    device: str,
    batch: int,
    seed: int = 0,
    progress: bool | None = None,
) -> tuple[str, int, dict[str, torch.Tensor]]:
    """Fill each row's `accuracy` and its interval (`accuracy_low`, `accuracy_high`) on `data` (`accuracy_data`);
    returns (kind, images, {variant: one bool per image, right or not}). `progress`: a bar over the batches
    (None: when stderr is a terminal)."""
    if data is None:
        for row in rows.values():
            row.update(accuracy=None, accuracy_low=None, accuracy_high=None, accuracy_correct=None)
        return "", 0, {}
    dataset, kind = data
    loader = acc.whole_batches(dataset, -(-samples // batch) * batch, batch, seed)
    forwards = {v.name: lambda images, _, model=v.model: model(images) for v in variants}
    show = sys.stderr.isatty() if progress is None else progress
    right = acc.outcomes(forwards, loader, kind, forwards[BASELINE], device, progress=show,
                         dtype=parameter_dtype(variants[0].model))
    images = len(right[BASELINE])
    for name, hits in right.items():
        proportion = Proportion(int(hits.sum()), images)
        low, high = proportion.interval()
        rows[name].update(accuracy=proportion.value, accuracy_low=low, accuracy_high=high,
                          accuracy_correct=proportion.successes)
    return kind, images, right


def proportion_of(row: dict, images: int) -> Proportion | None:
    """A row's accuracy as successes of `images` (None where accuracy was not measured)."""
    correct = row.get("accuracy_correct")
    return None if correct is None or not images else Proportion(int(correct), images)
