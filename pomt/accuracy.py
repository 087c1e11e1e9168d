"""Accuracy on an image folder, and the degradation curve A(n) under random pruning right after embedding.

Labelled (class sub-folders): top-1, where the i-th folder in sorted order is the model's class i. Unlabelled (a
flat folder, or seeded random images): agreement of a variant's top-1 with the unpruned model's on the same images.
`outcomes` is the one evaluator."""

from __future__ import annotations

import csv
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import timm.data
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS
from tqdm.auto import tqdm

from pomt.errors import CurveError, DatasetError
from pomt.io import atomic_write_csv
from pomt.models.tokens import truncate_tokens
from pomt.runtimes import parameter_dtype

TOP1 = "top1"
AGREEMENT = "agreement"
CURVE_COLUMNS = ("tokens", "accuracy", "kind", "samples")
Forward = Callable[[torch.Tensor, int], torch.Tensor]  # (images, batch index) -> logits


@dataclass(frozen=True)
class AccuracyCurve:
    """A(n) in [0, 1] at measured token counts, and how it was obtained."""

    values: dict[int, float]
    kind: str  # "top1" or "agreement"
    samples: int

    def at(self, tokens: Iterable[int]) -> dict[int, float]:
        return interpolate(self.values, tokens)

    def rows(self) -> list[dict]:
        return [
            {"tokens": n, "accuracy": round(self.values[n], 6), "kind": self.kind, "samples": self.samples}
            for n in sorted(self.values)
        ]


def interpolate(values: Mapping[int, float], tokens: Iterable[int]) -> dict[int, float]:
    """Accuracy at other token counts: linear between measured counts, held at the end values outside."""
    known = sorted(values)
    levels = [values[n] for n in known]
    return {n: float(np.interp(n, known, levels)) for n in tokens}


class _FlatFolder(Dataset):
    """Images directly inside a folder, without labels (for agreement with the unpruned model)."""

    def __init__(self, root: Path, transform) -> None:
        self.paths = sorted(p for p in root.iterdir() if p.suffix.lower() in IMG_EXTENSIONS)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        with Image.open(self.paths[index]) as image:
            return self.transform(image.convert("RGB")), -1


def eval_transform(model: nn.Module, input_size: tuple[int, int]):
    """The model's own eval transform from timm's data config, resolved at `input_size`."""
    config = timm.data.resolve_data_config({"input_size": (3, *input_size)}, model=model)
    return timm.data.create_transform(**config, is_training=False)


def open_image_folder(root: str | Path, transform, agreement: bool = False) -> tuple[Dataset, str]:
    """An ImageFolder (top-1) when `root` has class sub-folders and not `agreement`, else a flat folder (agreement)."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"dataset folder not found: {root}")
    if any(child.is_dir() for child in root.iterdir()):
        try:
            return ImageFolder(str(root), transform=transform), AGREEMENT if agreement else TOP1
        except (FileNotFoundError, RuntimeError) as exc:
            raise DatasetError(f"no usable images under {root}: {str(exc).splitlines()[0]}") from None
    flat = _FlatFolder(root, transform)
    if len(flat) == 0:
        raise DatasetError(f"no images in {root} (expected class sub-folders or image files)")
    return flat, AGREEMENT


def check_labels(dataset: Dataset, kind: str, model: nn.Module, root: str | Path) -> None:
    """Raise DatasetError when top-1 labels cannot be the model's classes: the folder needs as many classes as the
    classifier has outputs and, where the model's label set is known (ImageNet synsets), the same names."""
    if kind != TOP1:
        return
    classes, outputs = list(dataset.classes), classifier_outputs(model)
    hint = ("; give a folder of the model's classes, or --agreement to measure agreement with the unpruned model "
            "(no labels needed)")
    if outputs is not None and len(classes) != outputs:
        raise DatasetError(f"{root} has {len(classes)} class folders, the model's classifier {outputs} outputs: "
                           f"its labels cannot be the model's classes{hint}")
    subset = timm.data.infer_imagenet_subset(model)
    known = timm.data.ImageNetInfo(subset).label_names() if subset else None
    if known is not None and classes != list(known):
        theirs, ours = next((c, k) for c, k in zip(classes, known, strict=False) if c != k)
        raise DatasetError(f"the class folders of {root} are not the model's {subset} classes (folder {theirs!r} "
                           f"where class {known.index(ours)} is {ours!r}){hint}")


def classifier_outputs(model: nn.Module) -> int | None:
    """How many classes the model's classifier tells apart (timm's `num_classes`), or None where unknown."""
    classes = getattr(model, "num_classes", None)
    return int(classes) if isinstance(classes, int) else None


def seeded_subset(dataset: Dataset, samples: int, seed: int) -> Dataset:
    """A reproducible random subset of at most `samples` items."""
    size = len(dataset)
    if samples >= size:
        return dataset
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:samples]
    return Subset(dataset, sorted(order.tolist()))


def random_images(samples: int, input_size: tuple[int, int], seed: int = 0) -> Dataset:
    """Seeded standard-normal images without labels, for agreement when no folder is given."""
    images = torch.randn(samples, 3, *input_size, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(images, torch.full((samples,), -1))


def whole_batches(dataset: Dataset, samples: int, batch: int, seed: int = 0) -> DataLoader:
    """A seeded subset of about `samples` images in full batches only, so every forward runs at `batch`."""
    total = min(-(-samples // batch) * batch, len(dataset)) // batch * batch
    if total == 0:
        raise DatasetError(f"the dataset holds {len(dataset)} images, fewer than one batch of {batch}")
    return image_loader(seeded_subset(dataset, total, seed), batch)


def accuracy_token_counts(min_tokens: int, num_tokens: int, points: int, extra: Iterable[int] = ()) -> list[int]:
    """Evenly spread counts over [min_tokens, num_tokens] (both ends included) plus `extra` counts."""
    even = np.linspace(min_tokens, num_tokens, num=max(2, points)).round().astype(int).tolist()
    return sorted({*even, *(n for n in extra if min_tokens <= n <= num_tokens)})


@dataclass(frozen=True)
class Images:
    """The images an accuracy is measured on: their loader, label kind, device and whether a progress bar shows."""

    loader: Iterable
    kind: str
    device: str = "cpu"
    progress: bool = True


def outcomes(forwards: Mapping[Hashable, Forward], images: Images, reference: Forward,
             dtype: torch.dtype | None = None) -> dict[Hashable, torch.Tensor]:
    """{key: one bool per image, in the loader's order: its top-1 under forwards[key] equals the label (TOP1) or the
    reference forward's top-1 (AGREEMENT)}; every image is loaded once for all forwards, cast to `dtype` if given."""
    kind = images.kind
    right: dict[Hashable, list[torch.Tensor]] = {key: [] for key in forwards}
    seen = 0
    with torch.inference_mode():
        for index, (batch, labels) in enumerate(_batches(images.loader, images.progress)):
            batch = batch.to(images.device, dtype)
            target = labels.to(images.device) if kind == TOP1 else _top1(reference(batch, index), labels)
            for key, forward in forwards.items():
                same = kind == AGREEMENT and forward is reference
                predicted = target if same else _top1(forward(batch, index), labels, kind)
                right[key].append((predicted == target).cpu())
            seen += len(batch)
    if seen == 0:
        raise DatasetError("the dataset sample is empty")
    return {key: torch.cat(hits) for key, hits in right.items()}


def _batches(loader: Iterable, progress: bool) -> Iterator:
    """The loader's batches with a progress bar; an unreadable image is a DatasetError."""
    batches = iter(tqdm(loader, desc="accuracy", unit="batch", disable=not progress, leave=False))
    while True:
        try:
            yield next(batches)
        except StopIteration:
            return
        except OSError as exc:
            raise DatasetError(f"cannot read an image of the dataset: {exc}") from None


def _top1(out, labels: torch.Tensor, kind: str = AGREEMENT) -> torch.Tensor:
    """Top-1 classes of a timm forward's output; top-1 against labels needs a class per label."""
    logits = out[0] if isinstance(out, (tuple, list)) else out
    if kind == TOP1 and int(labels.max()) >= logits.shape[-1]:
        raise DatasetError(
            f"dataset has more classes than the model's {logits.shape[-1]} outputs; use a matching "
            "checkpoint or an unlabelled folder for agreement"
        )
    return logits.argmax(dim=-1)


def measure_accuracy(model: nn.Module, images: Images, token_counts: Sequence[int], seed: int = 0) -> AccuracyCurve:
    """A(n) on `images` for every count: random pruning after embedding (seeded per batch and count)."""

    def pruned_to(n: int) -> Forward:
        def forward(batch: torch.Tensor, index: int) -> torch.Tensor:
            with truncate_tokens(model, n, selection="random", seed=seed + 7919 * index + n):
                return model(batch)

        return forward

    counts = sorted(set(token_counts))
    right = outcomes({n: pruned_to(n) for n in counts}, images, lambda batch, _: model(batch), parameter_dtype(model))
    total = len(right[counts[0]])
    return AccuracyCurve({n: int(hits.sum()) / total for n, hits in right.items()}, images.kind, total)


def image_loader(dataset: Dataset, batch_size: int, workers: int = 0) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers)


HELD_BYTES = 512 * 2**20  # decoded images a `HeldBatches` budget keeps in memory by default


class Budget:
    """Bytes that `HeldBatches` sharing it may still keep."""

    def __init__(self, total: int = HELD_BYTES) -> None:
        self.left = total


class HeldBatches:
    """`image_loader`'s batches of `dataset`, in order, decoded once: the first ones kept in memory as far as the
    `budget` goes, the rest read again on each pass (starting at the first not kept, so the batches are alike)."""

    def __init__(self, dataset: Dataset, batch_size: int, budget: Budget) -> None:
        self.dataset, self.batch_size, self.budget = dataset, batch_size, budget
        self.kept: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.full = False  # no more may be kept

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from list(self.kept)
        start = len(self.kept) * self.batch_size
        if start >= len(self.dataset):
            return
        rest = Subset(self.dataset, range(start, len(self.dataset)))
        for images, labels in image_loader(rest, self.batch_size):
            self._keep(images, labels)
            yield images, labels

    def _keep(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        """Keep the batch after the last kept one while the budget allows (never one after a gap)."""
        size = images.element_size() * images.numel() + labels.element_size() * labels.numel()
        if self.full or size > self.budget.left:
            self.full = True
            return
        self.kept.append((images, labels))
        self.budget.left -= size


def save_accuracy_curve(path: str | Path, curve: AccuracyCurve) -> Path:
    return atomic_write_csv(path, curve.rows(), CURVE_COLUMNS)


def load_accuracy_curve(path: str | Path, token_range: tuple[int, int] | None = None) -> AccuracyCurve:
    """Read an accuracy CSV (tokens, accuracy[, kind, samples]); a bad file is one CurveError line."""
    path = Path(path)
    if not path.is_file():
        raise CurveError(f"accuracy curve not found: {path}")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        values = {int(row["tokens"]): float(row["accuracy"]) for row in rows}
        kinds = {row.get("kind") or TOP1 for row in rows}
        samples = max(int(row.get("samples") or 0) for row in rows) if rows else 0
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, csv.Error) as exc:
        raise CurveError(f"corrupt accuracy curve {path}: needs numeric 'tokens' and 'accuracy' ({exc})") from None
    if not values:
        raise CurveError(f"corrupt accuracy curve {path}: no rows")
    if len(values) < len(rows):
        counts = [int(row["tokens"]) for row in rows]
        twice = sorted({n for n in counts if counts.count(n) > 1})
        raise CurveError(f"corrupt accuracy curve {path}: token counts listed twice: {twice[:3]}")
    if any(not 0.0 <= a <= 1.0 for a in values.values()):
        raise CurveError(f"corrupt accuracy curve {path}: accuracy must lie in [0, 1]")
    if len(kinds) != 1:
        raise CurveError(f"corrupt accuracy curve {path}: mixes kinds {sorted(kinds)}")
    if len(values) < 2:
        raise CurveError(f"accuracy curve {path} holds one token count ({next(iter(values))}); A(n) needs at least "
                         "two to say how accuracy falls with n")
    if token_range is not None:
        low, high = token_range
        outside = [n for n in values if not low <= n <= high]
        if outside:
            raise CurveError(
                f"accuracy curve {path} has token counts outside this model's range [{low}, {high}]: "
                f"{outside[:3]}"
            )
    return AccuracyCurve(values, kinds.pop(), samples)

