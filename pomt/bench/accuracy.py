"""Accuracy of each variant: top-1 on a labelled ImageFolder, or agreement with the unpruned model.

Top-1 uses timm's eval transform resolved at the benchmark's input size; the folder's sorted class
sub-folders are taken as the model's class indices (the ImageNet layout, as in `pomt.accuracy`).
Otherwise agreement: the fraction of inputs on which a variant's top-1 class equals the unpruned
model's, on an unlabelled folder or on seeded random inputs (meaningful for trained weights).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pomt.accuracy import AGREEMENT, TOP1, eval_transform, open_image_folder, seeded_subset
from pomt.errors import DatasetError


@dataclass(frozen=True)
class EvalSet:
    """Fixed input batches (and labels for top-1) shared by every variant."""

    kind: str  # TOP1 or AGREEMENT
    batches: list[torch.Tensor]
    labels: list[torch.Tensor] | None
    samples: int


def _rounded(samples: int, batch: int) -> int:
    """Samples rounded up to whole batches, so every forward runs at the benchmark's batch size."""
    return -(-samples // batch) * batch


def synthetic_set(samples: int, batch: int, input_size: tuple[int, int], seed: int = 0) -> EvalSet:
    """Seeded standard-normal images (already normalised scale) in batches of `batch`."""
    generator = torch.Generator().manual_seed(seed)
    total = _rounded(samples, batch)
    images = torch.randn(total, 3, *input_size, generator=generator)
    return EvalSet(AGREEMENT, list(images.split(batch)), None, total)


def imagefolder_set(
    root: str | Path, model: nn.Module, samples: int, batch: int, input_size: tuple[int, int], seed: int = 0
) -> EvalSet:
    """A seeded subset of an image folder with the model's eval transform at `input_size`: top-1 when the
    folder has class sub-folders, agreement when the images lie directly in it (`pomt.accuracy`'s loader)."""
    dataset, kind = open_image_folder(root, eval_transform(model, input_size))
    total = min(_rounded(samples, batch), len(dataset))
    total -= total % batch
    if total == 0:
        raise DatasetError(f"{root} holds {len(dataset)} images, fewer than one batch of {batch}")
    subset = seeded_subset(dataset, total, seed)
    try:
        pairs = [subset[i] for i in range(total)]
    except OSError as exc:
        raise DatasetError(f"cannot read an image in {root}: {exc}") from None
    images = torch.stack([image for image, _ in pairs])
    labels = torch.tensor([label for _, label in pairs])
    return EvalSet(
        kind, list(images.split(batch)), list(labels.split(batch)) if kind == TOP1 else None, total
    )


def predictions(model: nn.Module, batches: Iterable[torch.Tensor], device: str) -> torch.Tensor:
    """Top-1 class per input."""
    with torch.inference_mode():
        return torch.cat([_logits(model(x.to(device))).argmax(dim=-1).cpu() for x in batches])


def _logits(out) -> torch.Tensor:
    """The class logits of a timm forward (distilled DeiT in eval already averages its two heads)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def accuracy(predicted: torch.Tensor, evalset: EvalSet, reference: torch.Tensor | None) -> float:
    """Top-1 against labels, or agreement with the reference predictions."""
    if evalset.kind == TOP1:
        target = torch.cat(evalset.labels or [])
    else:
        if reference is None:
            raise ValueError("agreement needs the unpruned model's predictions")
        target = reference
    return float((predicted == target).float().mean())


def evaluate(models: Sequence[tuple[str, nn.Module]], evalset: EvalSet, device: str) -> dict[str, float]:
    """Accuracy of each named model on the set; the first model is the unpruned reference."""
    reference = None
    scores: dict[str, float] = {}
    for index, (name, model) in enumerate(models):
        predicted = predictions(model, evalset.batches, device)
        if index == 0:
            reference = predicted
        scores[name] = accuracy(predicted, evalset, reference)
    return scores
