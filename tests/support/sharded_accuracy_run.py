"""A torchrun job: the accuracy of a few candidates on a tiny seeded ViT, computed by the ranks together.

`python -m torch.distributed.run --nproc-per-node N sharded_accuracy_run.py OUT_DIR [--other-images]` writes each
rank's unpruned classes, counts (also against those classes, given), outcomes and errors met (`report`) to
OUT_DIR/rank<R>.json; with --other-images rank 1 holds other
images than rank 0, and every rank prints the one-line error and exits 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import timm
import torch
from torch.utils.data import Dataset, TensorDataset

from pomt.errors import DatasetError, PomtError
from pomt.frontier.cache import AccuracyCache
from pomt.frontier.calibration import Calibration, Classifier, model_identity, surely_dropped_more
from pomt.frontier.candidates import Candidate
from pomt.frontier.distributed import (
    check_same_images,
    join_from_env,
    leave_group,
    sharded_classes,
    sharded_counts,
    sharded_outcomes,
)
from pomt.stats import Proportion

IMAGES, BATCH = 54, 8  # 7 batches, the last of 6 images: the last round of 2 ranks has one batch
CANDIDATES = [Candidate.parse("topk:1=4"), Candidate.parse("tome:0=3,2=3"), Candidate.parse("pomt:1=5")]


def lost_three(measured: Proportion) -> bool:
    """Stop once 3 images the unpruned model gets right are lost (here: one candidate after batch 1, one after 4)."""
    return measured.lost >= 3


STOPS = {"none": None, "lost": lost_three,  # "drop": every candidate stops after batch 0, ending the pass
         "drop": partial(surely_dropped_more, drop=0.0, confidence=0.6)}


def build(other: bool = False) -> tuple[Classifier, TensorDataset]:
    """A seeded ViT whose top-1 varies with the image (weights wider than timm's init), and labelled images: the
    unpruned model's top-1 for most, random for the rest; `other` changes one image."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=4,
                              num_classes=5).eval()
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.1, generator=generator)
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(IMAGES, 3, 32, 32, generator=generator)
    with torch.inference_mode():
        top1 = model(images).argmax(-1)
    guesses = torch.randint(0, 5, (IMAGES,), generator=generator)
    labels = torch.where(torch.rand(IMAGES, generator=generator) < 0.7, top1, guesses)
    if other:
        images[-1] += 1.0
    return Classifier(model, batch_size=BATCH), TensorDataset(images, labels)


def errors(count: Callable[[Dataset, Callable | None], object], dataset: TensorDataset) -> dict[str, str | None]:
    """By stop rule, the error `count(images, stop)` meets where the last image's label is no class of the model
    (found in the last batch unless every candidate stopped before it); None where it meets none."""
    images, labels = dataset.tensors
    beyond = TensorDataset(images, torch.cat([labels[:-1], torch.tensor([5])]))
    found: dict[str, str | None] = {}
    for rule in ("none", "drop"):
        try:
            count(beyond, STOPS[rule])
            found[rule] = None
        except DatasetError as exc:
            found[rule] = str(exc)
    return found


GIVEN = " (unpruned classes given)"  # a counts entry against the classes found beforehand


def report(classes: torch.Tensor, counts: dict[str, dict[Candidate, Proportion]],
           outcomes: dict[str, dict[Candidate, torch.Tensor]], failures: dict[str, str | None]) -> str:
    """The unpruned classes, counts and per-image outcomes by stop rule and candidate key, and the errors met, as
    sorted JSON."""
    return json.dumps({
        "classes": classes.tolist(),
        "errors": failures,
        "counts": {rule: {c.key: [p.successes, p.trials, p.lost, p.gained] for c, p in found.items()}
                   for rule, found in counts.items()},
        "outcomes": {rule: {c.key: right.tolist() for c, right in found.items()} for rule, found in outcomes.items()},
    }, sort_keys=True)


def main(out: Path, other_images: bool) -> int:
    place = join_from_env("cpu")
    try:
        classifier, dataset = build(other_images and place.rank == 1)
        journal = AccuracyCache(None, model_identity(classifier.model))
        check_same_images(Calibration(classifier, dataset, journal).split_ids, place)
        counts = {rule: sharded_counts(classifier, CANDIDATES, dataset, BATCH, stop) for rule, stop in STOPS.items()}
        classes = sharded_classes(classifier, dataset, BATCH)
        counts |= {rule + GIVEN: sharded_counts(classifier, CANDIDATES, dataset, BATCH, stop, unpruned=classes)
                   for rule, stop in STOPS.items()}
        outcomes = {rule: sharded_outcomes(classifier, CANDIDATES, dataset, BATCH, stop, ranks=place)
                    for rule, stop in STOPS.items()}
        failures = errors(lambda images, stop: sharded_counts(classifier, CANDIDATES, images, BATCH, stop), dataset)
    except PomtError as exc:
        print(exc, file=sys.stderr, flush=True)
        return 2
    finally:
        leave_group()
    (out / f"rank{place.rank}.json").write_text(report(classes, counts, outcomes, failures))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), "--other-images" in sys.argv[2:]))
