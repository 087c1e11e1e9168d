"""Accuracy of candidate schedules spread over the ranks of a torch.distributed group (torchrun).

The batches one process would make are dealt round-robin (batch b to rank b % size); after each round every rank
gathers all outcomes, puts them in global order and applies the stop rule batch by batch as `image_outcomes` does,
so every rank holds the single-process result, bit for bit, and makes the same decisions. The unpruned model's classes
on a split are found by the ranks together once (`sharded_classes`), or read from the cache as rank 0 reads them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, Subset

from pomt.accuracy import _batches, image_loader
from pomt.device.fingerprint import resolve_device
from pomt.errors import DatasetError, PomtError
from pomt.frontier.calibration import (
    NONE,
    SEARCH,
    Calibration,
    Classifier,
    _outcomes_of_batch,
    image_outcomes,
    paired_counts,
    unpruned_classes,
)
from pomt.frontier.candidates import Candidate
from pomt.stats import Proportion

Outcomes = dict[Candidate, torch.Tensor]


@dataclass(frozen=True)
class Ranks:
    """This process's place in the group that shares one evaluation: rank `rank` of `size`, over `backend`."""

    rank: int = 0
    size: int = 1
    backend: str | None = None  # None: no process group


def ranks() -> Ranks:
    """The default process group's ranks, or rank 0 of 1 where torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return Ranks()
    return Ranks(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))


def _or_current(given: Ranks | None) -> Ranks:
    return ranks() if given is None else given


def rank_device(device: str) -> str:
    """The device this rank evaluates on: `cuda:LOCAL_RANK` where `device` is CUDA, else `device` resolved."""
    resolved = resolve_device(device)
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if resolved.startswith("cuda") else resolved


def join_from_env(device: str = "cpu") -> Ranks:
    """Join the group of a torchrun environment (WORLD_SIZE > 1) where none exists yet: nccl when the accuracy runs
    on CUDA (each rank on `cuda:LOCAL_RANK`), gloo on the CPU; elsewhere nothing is joined."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and dist.is_available() and not dist.is_initialized():
        own = rank_device(device)
        if own.startswith("cuda"):
            torch.cuda.set_device(own)
        dist.init_process_group("nccl" if own.startswith("cuda") else "gloo")
    return ranks()


def leave_group() -> None:
    """Leave the default process group, once every rank has reached this point (nothing is left in flight)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _gathered(value: object, place: Ranks) -> list:
    """`value` of every rank, by rank."""
    found: list = [None] * place.size
    dist.all_gather_object(found, value)
    return found


def check_same_images(ids: Mapping[str, str], ranks: Ranks | None = None) -> None:
    """Raise DatasetError on every rank unless every rank names the same images (`Calibration.split_ids`)."""
    place = _or_current(ranks)
    if place.size == 1:
        return
    every = _gathered(dict(ids), place)
    for rank, theirs in enumerate(every):
        if theirs != every[0]:
            names = sorted(k for k in set(theirs) | set(every[0]) if theirs.get(k) != every[0].get(k))
            shown = "; ".join(f"{k} {theirs.get(k)!r}, rank 0 {every[0].get(k)!r}" for k in names)
            raise DatasetError(f"rank {rank} sees other calibration images than rank 0: {shown}; "
                               "give every rank the same images")


def _own_batch(classifier: Classifier, active: Sequence[Candidate], loader: Iterator,
               classes: torch.Tensor | None) -> Outcomes | PomtError:
    """This rank's outcomes on its next batch (against `classes`, the unpruned model's on this rank's images from
    that batch on, where given), or the error that batch raised (for every rank to raise it in turn)."""
    try:
        images, labels = next(loader)
        with torch.inference_mode():
            return _outcomes_of_batch(classifier, active, images, labels,
                                      None if classes is None else classes[: len(images)])
    except PomtError as exc:
        return exc


def _own_classes(classifier: Classifier, loader: Iterator) -> torch.Tensor | PomtError:
    """The unpruned model's top-1 classes on this rank's next batch, or the error that batch raised."""
    try:
        return unpruned_classes(classifier, [next(loader)])
    except PomtError as exc:
        return exc


def _own_share(dataset: Dataset, batch_size: int, place: Ranks, progress: bool) -> tuple[int, list[int], Iterator]:
    """The dataset's number of batches of `batch_size`, the image indices of this rank's (batch b goes to rank
    b % `place.size`) and a loader over them, once every rank is checked to count the same batches."""
    check_same_images({"images": f"{len(dataset)} in batches of {batch_size}"}, place)  # the same rounds everywhere
    total = -(-len(dataset) // batch_size)
    mine = [i for b in range(place.rank, total, place.size)
            for i in range(b * batch_size, min((b + 1) * batch_size, len(dataset)))]
    return total, mine, iter(_batches(image_loader(Subset(dataset, mine), batch_size), progress and place.rank == 0))


def sharded_classes(classifier: Classifier, dataset: Dataset, batch_size: int, *, progress: bool = False,
                    ranks: Ranks | None = None) -> torch.Tensor:
    """`unpruned_classes` over the dataset's batches of `batch_size`, computed by the ranks together: every rank
    holds every image's class, in order."""
    place = _or_current(ranks)
    if place.size == 1:
        return unpruned_classes(classifier, _batches(image_loader(dataset, batch_size), progress))
    total, _, loader = _own_share(dataset, batch_size, place, progress)
    found = []
    for first in range(0, total, place.size):
        own = _own_classes(classifier, loader) if first + place.rank < total else None
        for batch in _gathered(own, place)[: total - first]:  # global order: batch first + rank
            if isinstance(batch, PomtError):
                raise batch
            found.append(batch)
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.long)


def sharded_outcomes(classifier: Classifier, candidates: Sequence[Candidate], dataset: Dataset, batch_size: int,
                     stop: Callable[[Proportion], bool] | None = None, *, progress: bool = False,
                     ranks: Ranks | None = None, unpruned: torch.Tensor | None = None) -> Outcomes:
    """`image_outcomes` over the dataset's batches of `batch_size` (in order, as `image_loader` makes them), computed
    by the ranks together: the same result on every rank as in one process (against the `unpruned` model's classes
    on every image where given, without running it)."""
    place = _or_current(ranks)
    if place.size == 1:
        return image_outcomes(classifier, candidates, _batches(image_loader(dataset, batch_size), progress), stop,
                              unpruned)
    total, mine, loader = _own_share(dataset, batch_size, place, progress)
    classes = None if unpruned is None else unpruned[mine]
    wanted = list(dict.fromkeys([*candidates, NONE]))
    right: dict[Candidate, list[torch.Tensor]] = {c: [] for c in wanted}
    asked, active = set(candidates), list(wanted)
    for number, first in enumerate(range(0, total, place.size)):
        rest = None if classes is None else classes[number * batch_size:]
        own = _own_batch(classifier, active, loader, rest) if first + place.rank < total else None
        for batch in _gathered(own, place)[: total - first]:  # global order: batch first + rank
            if isinstance(batch, PomtError):
                raise batch
            for candidate in active:
                right[candidate].append(batch[candidate])
            if stop is not None:
                seen = torch.cat(right[NONE])
                active = [c for c in active if c.unpruned or not stop(paired_counts(torch.cat(right[c]), seen))]
                if not any(c in asked for c in active):  # the rest of the round is discarded
                    return _joined(right)
    return _joined(right)


def _joined(right: Mapping[Candidate, list[torch.Tensor]]) -> Outcomes:
    return {c: torch.cat(r) if r else torch.zeros(0, dtype=torch.bool) for c, r in right.items()}


def sharded_counts(classifier: Classifier, candidates: Sequence[Candidate], dataset: Dataset, batch_size: int,
                   stop: Callable[[Proportion], bool] | None = None, *, progress: bool = False,
                   ranks: Ranks | None = None, unpruned: torch.Tensor | None = None) -> dict[Candidate, Proportion]:
    """{candidate: its `paired_counts` against the unpruned model} (`count_correct`), computed by the ranks together
    (against the `unpruned` classes where given)."""
    right = sharded_outcomes(classifier, candidates, dataset, batch_size, stop, progress=progress, ranks=ranks,
                             unpruned=unpruned)
    return {c: paired_counts(right[c], right[NONE]) for c in dict.fromkeys(candidates)}


class ShardedCalibration(Calibration):
    """A `Calibration` whose passes the job's ranks share: every rank holds one process's counts exactly."""

    def known(self, split: str = SEARCH, stopped: bool = False) -> dict[Candidate, Proportion]:
        """Rank 0's `Calibration.known` on every rank: the ranks' searches start from the same schedules."""
        place = ranks()
        found = [super().known(split, stopped) if place.rank == 0 else None]
        if place.size > 1:
            dist.broadcast_object_list(found, src=0)
        return found[0]

    def kept_classes(self, split: str) -> torch.Tensor | None:
        """Rank 0's `Calibration.kept_classes` on every rank: the ranks pass over the images together or not at all."""
        place = ranks()
        found = [super().kept_classes(split) if place.rank == 0 else None]
        if place.size > 1:
            dist.broadcast_object_list(found, src=0)
        return found[0]

    def reference_pass(self, split: str) -> torch.Tensor:
        return sharded_classes(self.classifier, self.datasets[split], self.classifier.batch_size,
                               progress=self.progress)

    def count(self, candidates: Sequence[Candidate], split: str,
              stop: Callable[[Proportion], bool] | None) -> dict[Candidate, Proportion]:
        return sharded_counts(self.classifier, candidates, self.datasets[split], self.classifier.batch_size, stop,
                              progress=self.progress, unpruned=self.reference_classes(split))
