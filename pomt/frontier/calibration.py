"""The accuracy of candidate schedules, measured on the patched model itself over calibration images.

The images are split once, seeded, into a search and a held-out split; top-1 against the labels, or without labels
agreement with the unpruned model. Candidates run together batch by batch (`candidate_logits`), spread over the
ranks of a torch.distributed job where there is one (`pomt.frontier.distributed`), every result kept in the shared
accuracy cache (`pomt.frontier.cache`); `HostedCalibration` measures in a worker, away from the timing process.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from pomt.accuracy import AGREEMENT, TOP1, Budget, HeldBatches, _batches
from pomt.errors import DatasetError
from pomt.frontier.cache import AccuracyCache
from pomt.frontier.candidates import NONE, Candidate
from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.patching import patch, unpatch
from pomt.stats import Proportion
from pomt.verification.fresh import FreshWorker

SEARCH, HELD_OUT = "search", "held_out"
STOP_CONFIDENCE = 0.999  # of a drop beyond `stop_above`, checked after every batch (`surely_dropped_more`)
FORMAT = "pomt.accuracy-journal"


class Stop(Protocol):
    """A stopping test on a running paired count (`pomt.frontier.certify.Certifier`), named by what it depends on."""

    def __call__(self, measured: Proportion) -> bool: ...

    def key(self) -> str: ...
VERSION = 1


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


def weights_digest(model: nn.Module) -> str:
    """A digest of every parameter and buffer, by name: the same weights give the same digest anywhere."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)};".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def model_identity(model: nn.Module) -> dict:
    """What makes two models the same for accuracy: architecture, token geometry, classes, weights."""
    geometry = model_geometry(model)
    return {"model": geometry.model, "input_size": list(geometry.input_size), "num_tokens": geometry.num_tokens,
            "prefix_tokens": geometry.prefix_tokens, "depth": geometry.depth,
            "num_classes": getattr(model, "num_classes", None), "weights": weights_digest(model)}


def entry_key(candidate: Candidate, split: str) -> str:
    """The cache key of one result: the candidate's key and the split's (which names its images)."""
    return f"{split}|{candidate.key}"


@dataclass(frozen=True, eq=False)
class Classifier:
    """The model whose top-1 is counted against the labels (TOP1) or the unpruned model's (AGREEMENT)."""

    model: nn.Module
    kind: str = TOP1
    device: str = "cpu"
    dtype: torch.dtype | None = None
    batch_size: int = 16


class Calibration:
    """The model as counted, its calibration images in two splits, and the cache of what was measured on them; what
    it measures is cached under `origin` (the search's latency curve: `known` leaves its own results out)."""

    def __init__(self, classifier: Classifier, dataset: Dataset, cache: AccuracyCache, *,
                 held_out: float = 0.5, seed: int = 0, progress: bool = False, origin: str = "") -> None:
        self.classifier, self.kind, self.cache, self.progress = classifier, classifier.kind, cache, progress
        self.origin = origin
        self.indices = split_indices(len(dataset), held_out, seed)
        self.datasets = {name: Subset(dataset, idx) for name, idx in self.indices.items()}
        data = dataset_digest(dataset)
        self.split_ids = {name: f"{name}:{self.kind}:{data}:" + hashlib.sha256(str(idx).encode()).hexdigest()[:12]
                          for name, idx in self.indices.items()}
        self.evaluated, self.seconds = 0, 0.0  # candidates measured (not read back) by this object, and their time
        self.unpruned: dict[str, torch.Tensor] = {}  # the unpruned model's top-1 classes by split, once counted
        self.held: dict[str, HeldBatches] = {}  # each split's batches, decoded once within `budget`
        self.budget = Budget()

    def size(self, split: str = SEARCH) -> int:
        return len(self.indices[split])

    def cached(self, candidate: Candidate, split: str = SEARCH, stopped: bool = False,
               test: str = "") -> Proportion | None:
        """Its journalled accuracy on `split` (under the stopping `test` that measured it); None if not measured, not
        paired, or stopped (unless `stopped`)."""
        found = self.cache.get(candidate, self.split_ids[split] + test)
        if found is None or not found.paired or (found.trials < self.size(split) and not stopped):
            return None
        return found

    def known(self, split: str = SEARCH, stopped: bool = False) -> dict[Candidate, Proportion]:
        """The paired results on `split` that other origins measured first (those stopped early too if `stopped`)."""
        size = self.size(split)
        return {c: p for c, p in self.cache.known(self.split_ids[split], self.origin).items()
                if p.paired and (stopped or p.trials >= size)}

    def measure(self, candidates: Sequence[Candidate], split: str = SEARCH, stop_above: float | None = None,
                certifier: Stop | None = None) -> dict[Candidate, Proportion]:
        """{candidate: its accuracy on `split`}, the unjournalled measured in one pass; with `stop_above` (a drop) one
        `surely_dropped_more` stops, with a `certifier` one it stops (journalled under its key), its accuracy that
        of the images it saw."""
        unique = list(dict.fromkeys(candidates))
        stopped = stop_above is not None or certifier is not None
        test = "" if certifier is None else f"|{certifier.key()}"
        missing = [c for c in unique if self.cached(c, split, stopped, test) is None]
        if missing:
            start = time.perf_counter()
            stop = certifier if stop_above is None else partial(surely_dropped_more, drop=stop_above)
            counted = self.count(missing, split, stop)
            for candidate in missing:
                self.cache.add(candidate, self.split_ids[split] + test, counted[candidate], self.origin)
            self.evaluated += len(missing)
            self.seconds += time.perf_counter() - start
        return {c: self.cached(c, split, stopped, test) for c in unique}

    def count(self, candidates: Sequence[Candidate], split: str,
              stop: Callable[[Proportion], bool] | None) -> dict[Candidate, Proportion]:
        """`count_correct` over the split's images in one pass (`ShardedCalibration`: over the job's ranks), against
        the unpruned model's classes on the split (`reference_classes`)."""
        return count_correct(self.classifier, candidates, self.batches(split), stop, self.reference_classes(split))

    def reference_classes(self, split: str) -> torch.Tensor:
        """The unpruned model's top-1 class of each image of `split`: kept in the cache, else found in a pass of
        their own (`reference_pass`) and kept there, so that no run finds them twice."""
        if split not in self.unpruned:
            found = self.kept_classes(split)
            if found is None:
                found = self.reference_pass(split)
                self.cache.add_classes(self.split_ids[split], found.numpy())
            self.unpruned[split] = found
        return self.unpruned[split]

    def kept_classes(self, split: str) -> torch.Tensor | None:
        """The classes the cache keeps for `split`; None where it keeps none (or not one per image)."""
        kept = self.cache.classes(self.split_ids[split])
        return torch.from_numpy(kept) if kept is not None and len(kept) == self.size(split) else None

    def reference_pass(self, split: str) -> torch.Tensor:
        """The unpruned model's classes on `split`, in a pass of their own."""
        return unpruned_classes(self.classifier, self.batches(split))

    def batches(self, split: str) -> Iterable:
        """The split's images and labels in batches, in order (with a progress bar where asked), decoded once as far
        as the calibration's `HELD_BYTES` go."""
        if split not in self.held:
            self.held[split] = HeldBatches(self.datasets[split], self.classifier.batch_size, self.budget)
        return _batches(self.held[split], self.progress)


def surely_dropped_more(measured: Proportion, drop: float, confidence: float = STOP_CONFIDENCE) -> bool:
    """Whether the drop's lower one-sided bound at `confidence` exceeds `drop` (a fraction); checked every batch."""
    floor = measured.drop_floor(confidence)
    return floor is not None and floor > drop


def shares_prefix(model: nn.Module) -> bool:
    """Whether the model's forward is timm VisionTransformer's own (embedding, blocks, norm, head)."""
    kind = type(model)
    return (isinstance(model, VisionTransformer) and kind.forward is VisionTransformer.forward
            and kind.forward_features is VisionTransformer.forward_features
            and not getattr(model, "grad_checkpointing", False))


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
    """{candidate: logits} on `images`; `share` (default: `shares_prefix`) runs the blocks they share once."""
    unique = list(dict.fromkeys(candidates))
    if not (shares_prefix(model) if share is None else share):
        return {c: _logits(model, c, lambda: model(images)) for c in unique}
    depth = len(transformer_blocks(model))
    starts: dict[int, list[Candidate]] = {}
    for candidate in unique:
        starts.setdefault(depth if candidate.unpruned else candidate.first_block, []).append(candidate)
    predictions: dict[Candidate, torch.Tensor] = {}
    hidden = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))  # before the blocks
    for block in range(depth + 1):
        for candidate in starts.get(block, ()):
            predictions[candidate] = _logits(model, candidate, lambda b=block, h=hidden: _finish(model, h, b))
        if block < depth and any(start > block for start in starts):
            hidden = model.blocks[block](hidden)
        elif block < depth:
            break
    return {c: predictions[c] for c in unique}


def _outcomes_of_batch(classifier: Classifier, candidates: Sequence[Candidate], images: torch.Tensor,
                       labels: torch.Tensor, unpruned: torch.Tensor | None = None) -> dict[Candidate, torch.Tensor]:
    """{candidate: whether each image's top-1 is right} on one batch; `NONE` among the candidates, not run where
    `unpruned` holds its top-1 classes on the batch."""
    model, agreement = classifier.model, classifier.kind == AGREEMENT
    classes = getattr(model, "num_classes", None)
    if not agreement and classes is not None and int(labels.max()) >= classes:
        raise DatasetError(f"the images have more classes than the model's {classes} outputs; use a "
                           "matching checkpoint or unlabelled images (agreement)")
    run = [c for c in candidates if unpruned is None or not c.unpruned]
    logits = candidate_logits(model, run, images.to(classifier.device, classifier.dtype)) if run else {}
    top1 = {c: out.argmax(dim=-1) for c, out in logits.items()}
    if unpruned is not None:
        top1[NONE] = unpruned.to(classifier.device)
    target = top1[NONE] if agreement else labels.to(classifier.device)
    return {c: (top1[c] == target).cpu() for c in candidates}


def unpruned_classes(classifier: Classifier, batches: Iterable) -> torch.Tensor:
    """The unpruned model's top-1 class of each image, in order: what `image_outcomes` compares with instead of
    running it again."""
    with torch.inference_mode():
        found = [classifier.model(images.to(classifier.device, classifier.dtype)).argmax(dim=-1).cpu()
                 for images, _ in batches]
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.long)


def image_outcomes(classifier: Classifier, candidates: Sequence[Candidate], batches: Iterable,
                   stop: Callable[[Proportion], bool] | None = None,
                   unpruned: torch.Tensor | None = None) -> dict[Candidate, torch.Tensor]:
    """{candidate: for each image in order, whether its top-1 is right}, `NONE` among them (not run where `unpruned`
    holds its `unpruned_classes`); after each batch a candidate whose `paired_counts` `stop` accepts stops, and once
    all asked for have, so does the pass."""
    wanted = list(dict.fromkeys([*candidates, NONE]))
    right: dict[Candidate, list[torch.Tensor]] = {c: [] for c in wanted}
    asked, active, start = set(candidates), list(wanted), 0
    with torch.inference_mode():
        for images, labels in batches:
            classes = None if unpruned is None else unpruned[start: start + len(images)]
            start += len(images)
            for candidate, outcome in _outcomes_of_batch(classifier, active, images, labels, classes).items():
                right[candidate].append(outcome)
            if stop is not None:
                seen = torch.cat(right[NONE])
                active = [c for c in active if c.unpruned or not stop(paired_counts(torch.cat(right[c]), seen))]
                if not any(c in asked for c in active):  # the unpruned model ran only as their reference
                    break
    return {c: torch.cat(r) if r else torch.zeros(0, dtype=torch.bool) for c, r in right.items()}


def paired_counts(outcomes: torch.Tensor, reference: torch.Tensor) -> Proportion:
    """Images right of those seen, with those lost and gained against the `reference` (the unpruned model's)."""
    reference = reference[: len(outcomes)]
    return Proportion(int(outcomes.sum()), len(outcomes), int((reference & ~outcomes).sum()),
                      int((outcomes & ~reference).sum()))


def count_correct(classifier: Classifier, candidates: Sequence[Candidate], batches: Iterable,
                  stop: Callable[[Proportion], bool] | None = None,
                  unpruned: torch.Tensor | None = None) -> dict[Candidate, Proportion]:
    """{candidate: its `paired_counts` against the unpruned model} (`image_outcomes`, with its `stop` and
    `unpruned`)."""
    right = image_outcomes(classifier, candidates, batches, stop, unpruned)
    return {c: paired_counts(right[c], right[NONE]) for c in dict.fromkeys(candidates)}


_HOSTED: dict[str, Calibration] = {}  # in the worker: the calibration it was given


def _host(calibration: Calibration) -> None:
    """The worker's side of `HostedCalibration`: keep the calibration, time nothing until asked."""
    _HOSTED["calibration"] = calibration


def _measure(job: tuple[str, list[Candidate], str, float | None, Stop | None]) -> tuple[dict[Candidate, Proportion],
                                                                                       int, float]:
    calibration = _HOSTED["calibration"]
    calibration.origin, *asked = job
    return calibration.measure(*asked), calibration.evaluated, calibration.seconds


def _known(job: tuple[str, str, bool]) -> dict[Candidate, Proportion]:
    calibration = _HOSTED["calibration"]
    calibration.origin, split, stopped = job
    return calibration.known(split, stopped)


class HostedCalibration:
    """A `Calibration` whose `measure` and `known` run in a worker process holding its copy: the same answers and
    counters, under this object's `origin`."""

    def __init__(self, calibration: Calibration, worker: FreshWorker) -> None:
        self.kind, self.indices, self.origin = calibration.kind, calibration.indices, calibration.origin
        self.evaluated, self.seconds = calibration.evaluated, calibration.seconds
        self._worker = worker
        worker.run_copied(_host, calibration)  # returns once the worker holds it

    def size(self, split: str = SEARCH) -> int:
        return len(self.indices[split])

    def measure(self, candidates: Sequence[Candidate], split: str = SEARCH, stop_above: float | None = None,
                certifier: Stop | None = None) -> dict[Candidate, Proportion]:
        """`Calibration.measure` in the worker; its counters follow."""
        job = (self.origin, list(candidates), split, stop_above, certifier)
        found, self.evaluated, self.seconds = self._worker.run(_measure, job)
        return found

    def known(self, split: str = SEARCH, stopped: bool = False) -> dict[Candidate, Proportion]:
        """`Calibration.known` in the worker."""
        return self._worker.run(_known, (self.origin, split, stopped))


@contextmanager
def hosted(calibration: Calibration) -> Iterator[HostedCalibration]:
    """`calibration` handed to a new worker process for as long as the block runs."""
    with FreshWorker() as worker:
        yield HostedCalibration(calibration, worker)
