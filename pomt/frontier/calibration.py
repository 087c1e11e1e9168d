"""Accuracy of candidate schedules, measured on the patched model itself over calibration images.

The images are split once, seeded, into a search split (what a search compares candidates on) and a held-out
split (what a chosen schedule is reported on). Top-1 against the labels of an ImageFolder, or without labels the
agreement with the unpruned model's top-1. Candidates are evaluated together, batch by batch; on timm's
`VisionTransformer` the blocks before a candidate's first pruning block run once per batch for all of them
(`candidate_logits`, equal to each patched model's own forward). Each result is journalled under a key naming the
candidate and the split's exact images (`pomt.frontier.journal`). `HostedCalibration` runs the measurement in a
worker process, so that the process that times schedules never runs the accuracy forwards.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from pomt.accuracy import AGREEMENT, TOP1, _batches, image_loader
from pomt.errors import DatasetError
from pomt.frontier.candidates import NONE, Candidate
from pomt.frontier.journal import AccuracyJournal
from pomt.models.geometry import transformer_blocks
from pomt.patching import patch, unpatch
from pomt.stats import Proportion
from pomt.verification.fresh import FreshWorker

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
    (its lower one-sided bound, `Proportion.drop_floor`); checked after every batch, hence the high confidence."""
    floor = measured.drop_floor(confidence)
    return floor is not None and floor > drop


def shares_prefix(model: nn.Module) -> bool:
    """Whether the model's forward is timm VisionTransformer's own (embedding, blocks, norm, head)."""
    kind = type(model)
    return (isinstance(model, VisionTransformer) and kind.forward is VisionTransformer.forward
            and kind.forward_features is VisionTransformer.forward_features
            and not getattr(model, "grad_checkpointing", False))


def _embed(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """What `forward_features` computes before its blocks."""
    x = model._pos_embed(model.patch_embed(images))
    return model.norm_pre(model.patch_drop(x))


def _finish(model: VisionTransformer, hidden: torch.Tensor, block: int) -> torch.Tensor:
    """Logits of the model from the hidden state entering `block` (blocks `block`.., norm, head)."""
    for layer in model.blocks[block:]:
        hidden = layer(hidden)
    return model.forward_head(model.norm(hidden))


def _logits(model: nn.Module, candidate: Candidate, run) -> torch.Tensor:
    """`run()` on the model patched with the candidate (unpatched again afterwards)."""
    if not candidate.unpruned:
        patch(model, candidate.method, candidate.as_dict())
    try:
        out = run()
    finally:
        unpatch(model)
    return out[0] if isinstance(out, (tuple, list)) else out


def candidate_logits(model: nn.Module, candidates: Sequence[Candidate], images: torch.Tensor,
                     share: bool | None = None) -> dict[Candidate, torch.Tensor]:
    """{candidate: logits} of the model patched with each candidate on `images` (inference mode is the
    caller's). `share` (default: `shares_prefix(model)`) computes the blocks candidates share once."""
    unique = list(dict.fromkeys(candidates))
    if not (shares_prefix(model) if share is None else share):
        return {c: _logits(model, c, lambda: model(images)) for c in unique}
    depth = len(transformer_blocks(model))
    starts: dict[int, list[Candidate]] = {}
    for candidate in unique:
        starts.setdefault(depth if candidate.unpruned else candidate.first_block, []).append(candidate)
    predictions: dict[Candidate, torch.Tensor] = {}
    hidden = _embed(model, images)
    for block in range(depth + 1):
        for candidate in starts.get(block, ()):
            predictions[candidate] = _logits(model, candidate, lambda b=block, h=hidden: _finish(model, h, b))
        if block < depth and any(start > block for start in starts):
            hidden = model.blocks[block](hidden)
        elif block < depth:
            break
    return {c: predictions[c] for c in unique}


def _outcomes_of_batch(model: nn.Module, candidates: Sequence[Candidate], images: torch.Tensor,
                       labels: torch.Tensor, agreement: bool, device: str,
                       dtype: torch.dtype | None) -> dict[Candidate, torch.Tensor]:
    """{candidate: whether each image's top-1 is right} on one batch; `NONE` among the candidates."""
    classes = getattr(model, "num_classes", None)
    if not agreement and classes is not None and int(labels.max()) >= classes:
        raise DatasetError(f"the images have more classes than the model's {classes} outputs; use a "
                           "matching checkpoint or unlabelled images (agreement)")
    logits = candidate_logits(model, candidates, images.to(device, dtype))
    top1 = {c: out.argmax(dim=-1) for c, out in logits.items()}
    target = top1[NONE] if agreement else labels.to(device)
    return {c: (top1[c] == target).cpu() for c in candidates}


def image_outcomes(model: nn.Module, candidates: Sequence[Candidate], batches: Iterable, agreement: bool,
                   device: str = "cpu", dtype: torch.dtype | None = None,
                   stop: Callable[[Proportion], bool] | None = None) -> dict[Candidate, torch.Tensor]:
    """{candidate: for each image in order, whether its top-1 equals the label, or with `agreement` the
    unpruned model's top-1} over (images, labels) batches, one batch in memory at a time; the unpruned
    model (`NONE`) always among them. After each batch a candidate whose counts so far (`paired_counts`)
    `stop` accepts is measured no further: its outcomes are those of the images it saw; once every candidate
    asked for has stopped, so does the pass."""
    wanted = list(dict.fromkeys([*candidates, NONE]))
    right: dict[Candidate, list[torch.Tensor]] = {c: [] for c in wanted}
    asked, active = set(candidates), list(wanted)
    with torch.inference_mode():
        for images, labels in batches:
            for candidate, outcome in _outcomes_of_batch(model, active, images, labels, agreement, device,
                                                         dtype).items():
                right[candidate].append(outcome)
            if stop is not None:
                seen = torch.cat(right[NONE])
                active = [c for c in active if c.unpruned or not stop(paired_counts(torch.cat(right[c]), seen))]
                if not any(c in asked for c in active):  # the unpruned model ran only as their reference
                    break
    return {c: torch.cat(r) if r else torch.zeros(0, dtype=torch.bool) for c, r in right.items()}


def paired_counts(outcomes: torch.Tensor, reference: torch.Tensor) -> Proportion:
    """Images right of those seen, with those lost and gained against the `reference` outcomes (the
    unpruned model's on the same images; only as many of them as `outcomes` holds)."""
    reference = reference[: len(outcomes)]
    return Proportion(int(outcomes.sum()), len(outcomes), int((reference & ~outcomes).sum()),
                      int((outcomes & ~reference).sum()))


def count_correct(model: nn.Module, candidates: Sequence[Candidate], batches: Iterable, agreement: bool,
                  device: str = "cpu", dtype: torch.dtype | None = None,
                  stop: Callable[[Proportion], bool] | None = None) -> dict[Candidate, Proportion]:
    """{candidate: its `paired_counts` against the unpruned model} over (images, labels) batches
    (`image_outcomes`, with its `stop`)."""
    right = image_outcomes(model, candidates, batches, agreement, device, dtype, stop)
    return {c: paired_counts(right[c], right[NONE]) for c in dict.fromkeys(candidates)}

_HOSTED: dict[str, Calibration] = {}  # in the worker: the calibration it was given


def _host(calibration: Calibration) -> None:
    """The worker's side of `HostedCalibration`: keep the calibration, time nothing until asked."""
    _HOSTED["calibration"] = calibration


def _measure(job: tuple[list[Candidate], str, float | None]) -> tuple[dict[Candidate, Proportion], int, float]:
    calibration = _HOSTED["calibration"]
    return calibration.measure(*job), calibration.evaluated, calibration.seconds


class HostedCalibration:
    """A `Calibration` whose `measure` runs in a worker process, given its copy before anything is timed: the
    same answers, journal and counters (`evaluated`, `seconds`)."""

    def __init__(self, calibration: Calibration, worker: FreshWorker) -> None:
        self.kind, self.indices = calibration.kind, calibration.indices
        self.evaluated, self.seconds = calibration.evaluated, calibration.seconds
        self._worker = worker
        worker.run_copied(_host, calibration)  # returns once the worker holds it

    def size(self, split: str = SEARCH) -> int:
        return len(self.indices[split])

    def measure(self, candidates: Sequence[Candidate], split: str = SEARCH,
                stop_above: float | None = None) -> dict[Candidate, Proportion]:
        """`Calibration.measure`, in the worker."""
        found, self.evaluated, self.seconds = self._worker.run(_measure, (list(candidates), split, stop_above))
        return found


@contextmanager
def hosted(calibration: Calibration) -> Iterator[HostedCalibration]:
    """`calibration` handed to a new worker process for as long as the block runs."""
    with FreshWorker() as worker:
        yield HostedCalibration(calibration, worker)
