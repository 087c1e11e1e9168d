"""Accuracy of candidate schedules, measured on the patched model itself over calibration images.

The images are split once, seeded, into a search split (what a search compares candidates on) and a
held-out split (what a chosen schedule is reported on). Top-1 against the labels of an ImageFolder, or
without labels the agreement with the unpruned model's top-1. Candidates are evaluated together, batch by
batch, sharing the unpruned prefix (`pomt.frontier.shared_prefix`); each result is journalled
(`pomt.frontier.journal`) under a key naming the candidate and the split's exact images, so a
killed search resumes and a repeated evaluation is free.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from pomt.accuracy import AGREEMENT, TOP1, _batches, image_loader
from pomt.errors import DatasetError
from pomt.frontier.candidates import Candidate
from pomt.frontier.journal import AccuracyJournal
from pomt.frontier.shared_prefix import count_correct
from pomt.stats import Proportion

SEARCH, HELD_OUT = "search", "held_out"
STOP_CONFIDENCE = 0.999  # of a drop beyond `stop_above`, checked after every batch (`surely_dropped_more`)


def split_indices(size: int, held_out: float = 0.5, seed: int = 0) -> dict[str, list[int]]:
    """Seeded split of `size` items into the search and held-out splits (each sorted, neither empty)."""
    if size < 2:
        raise DatasetError(f"calibration needs at least 2 images (a search and a held-out one), got {size}")
    if not 0.0 < held_out < 1.0:
        raise DatasetError(f"the held-out share must lie in (0, 1), got {held_out}")
    order = np.random.default_rng(seed).permutation(size)
    held = min(size - 1, max(1, round(size * held_out)))
    return {SEARCH: sorted(order[held:].tolist()), HELD_OUT: sorted(order[:held].tolist())}


def dataset_digest(dataset: Dataset) -> str:
    """A digest of what a dataset holds: its files' bytes and labels for image folders, else its tensors."""
    digest = hashlib.sha256()
    chosen = None
    if isinstance(dataset, Subset):  # a seeded sample of a folder: the files it holds
        dataset, chosen = dataset.dataset, list(dataset.indices)
    if hasattr(dataset, "samples") or hasattr(dataset, "paths"):
        items = getattr(dataset, "samples", None) or [(path, -1) for path in dataset.paths]
        items = items if chosen is None else [items[i] for i in chosen]
        for path, label in items:
            digest.update(f"{Path(path).name}:{label}:".encode())
            digest.update(Path(path).read_bytes())
    elif isinstance(dataset, TensorDataset):
        for tensor in dataset.tensors if chosen is None else (t[chosen] for t in dataset.tensors):
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        raise DatasetError(f"cannot name the images of a {type(dataset).__name__} for the accuracy cache")
    return digest.hexdigest()[:16]


class Calibration:
    """The model, its calibration images in two splits, and the journal of what was measured on them."""

    def __init__(self, model: nn.Module, dataset: Dataset, kind: str, journal: AccuracyJournal, *,
                 held_out: float = 0.5, seed: int = 0, batch_size: int = 16, device: str = "cpu",
                 dtype: torch.dtype | None = None, progress: bool = False) -> None:
        if kind not in (TOP1, AGREEMENT):
            raise ValueError(f"kind must be {TOP1!r} or {AGREEMENT!r}, got {kind!r}")
        self.model, self.kind, self.journal = model, kind, journal
        self.batch_size, self.device, self.dtype, self.progress = batch_size, device, dtype, progress
        self.indices = split_indices(len(dataset), held_out, seed)
        self.datasets = {name: Subset(dataset, idx) for name, idx in self.indices.items()}
        data = dataset_digest(dataset)
        self.split_ids = {
            name: f"{name}:{kind}:{data}:" + hashlib.sha256(str(idx).encode()).hexdigest()[:12]
            for name, idx in self.indices.items()
        }
        self.evaluated = 0  # candidates measured (not read from the journal) by this object
        self.seconds = 0.0  # time those measurements took

    def size(self, split: str = SEARCH) -> int:
        return len(self.indices[split])

    def cached(self, candidate: Candidate, split: str = SEARCH, stopped: bool = False) -> Proportion | None:
        """Its journalled accuracy on `split`; None when not measured, measured before drops were paired, or
        (unless `stopped` ones count) stopped before the split's last image (such a line is measured again)."""
        found = self.journal.get(candidate, self.split_ids[split])
        if found is None or not found.paired or (found.trials < self.size(split) and not stopped):
            return None
        return found

    def measure(self, candidates: Sequence[Candidate], split: str = SEARCH,
                stop_above: float | None = None) -> dict[Candidate, Proportion]:
        """{candidate: its accuracy on `split`}: journalled results read back, the others measured together
        in one pass over the split's images and journalled. With `stop_above` (a drop, a fraction) a candidate
        whose drop is surely larger (`surely_dropped_more`) is measured no further, and its accuracy is that
        of the images it saw: past what a search compares, how much worse it is does not matter."""
        unique = list(dict.fromkeys(candidates))
        stopped = stop_above is not None
        missing = [c for c in unique if self.cached(c, split, stopped) is None]
        if missing:
            start = time.perf_counter()
            batches = _batches(image_loader(self.datasets[split], self.batch_size), self.progress)
            stop = None if stop_above is None else partial(surely_dropped_more, drop=stop_above)
            counted = count_correct(self.model, missing, batches, self.kind == AGREEMENT, self.device, self.dtype,
                                    stop)
            for candidate in missing:
                self.journal.add(candidate, self.split_ids[split], counted[candidate])
            self.evaluated += len(missing)
            self.seconds += time.perf_counter() - start
        return {c: self.cached(c, split, stopped) for c in unique}


def surely_dropped_more(measured: Proportion, drop: float, confidence: float = STOP_CONFIDENCE) -> bool:
    """Whether the drop of `measured` against the unpruned model exceeds `drop` (a fraction) at `confidence`
    (its lower one-sided bound, `Proportion.drop_floor`). Checked after every batch, so the confidence is high:
    at 0.999, beyond a drop of 6 points, a schedule that loses 40 points on images the unpruned model gets 70%
    of is stopped after 32 of them, 20 points after 128, 15 after 192, 8 points never in 500."""
    floor = measured.drop_floor(confidence)
    return floor is not None and floor > drop
