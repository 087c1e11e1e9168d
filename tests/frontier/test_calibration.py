"""Measured accuracies of candidates: splits, the journal that caches them, resuming, refusing another model."""

import json

import pytest
import torch
from torch.utils.data import TensorDataset

from pomt.accuracy import AGREEMENT, TOP1, eval_transform, open_image_folder
from pomt.errors import AccuracyCacheError, DatasetError
from pomt.frontier.calibration import (
    HELD_OUT,
    SEARCH,
    Calibration,
    count_correct,
    dataset_digest,
    split_indices,
    surely_dropped_more,
)
from pomt.frontier.candidates import Candidate
from pomt.frontier.journal import AccuracyJournal, model_identity
from pomt.models.registry import create_model
from pomt.stats import Proportion

from tiny_data import make_image_folder

CANDIDATES = [Candidate.of("tome", {0: 2, 1: 2}), Candidate.of("pomt", {2: 6}), Candidate.of("topk", {})]


@pytest.fixture(scope="module")
def model():
    return create_model("test_vit", 64, num_classes=4)


@pytest.fixture(scope="module")
def images():
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(30, 3, 64, 64, generator=generator)
    return TensorDataset(pixels, torch.randint(0, 4, (30,), generator=generator))


def calibration(model, dataset, path, kind=TOP1):
    return Calibration(model, dataset, kind, AccuracyJournal(path, model_identity(model)), batch_size=4)


def test_the_split_is_seeded_disjoint_and_complete():
    split = split_indices(30, 0.4, seed=3)
    assert split == split_indices(30, 0.4, seed=3) and split != split_indices(30, 0.4, seed=4)
    assert len(split[HELD_OUT]) == 12 and sorted(split[SEARCH] + split[HELD_OUT]) == list(range(30))
    with pytest.raises(DatasetError, match="at least 2 images"):
        split_indices(1)


def test_measured_accuracies_are_the_counts_on_the_splits_images(model, images, tmp_path):
    cal = calibration(model, images, tmp_path / "acc.jsonl")
    found = cal.measure(CANDIDATES, SEARCH)
    search = [images[i] for i in cal.indices[SEARCH]]
    batch = (torch.stack([x for x, _ in search]), torch.stack([y for _, y in search]))
    assert found == count_correct(model, CANDIDATES, [batch], agreement=False)
    assert all(p.paired for p in found.values())
    assert cal.evaluated == 3 and found[CANDIDATES[0]].trials == cal.size(SEARCH) == 15


def test_a_journal_is_read_back_and_a_killed_line_measured_again(model, images, tmp_path):
    path = tmp_path / "acc.jsonl"
    first = calibration(model, images, path).measure(CANDIDATES, SEARCH)
    with path.open("ab") as handle:
        handle.write(b'{"key": "search|half-writ')  # a kill in the middle of a line
    again = calibration(model, images, path)
    assert again.measure(CANDIDATES, SEARCH) == first and again.evaluated == 0
    assert path.read_bytes().endswith(b"}\n")  # the cut line is gone
    held = again.measure(CANDIDATES[:1], HELD_OUT)
    assert again.evaluated == 1 and held[CANDIDATES[0]].trials == 15
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["identity"]["weights"] == model_identity(model)["weights"] and len(lines) == 5


def test_a_line_journalled_before_drops_were_paired_is_measured_again(model, images, tmp_path):
    path = tmp_path / "acc.jsonl"
    first = calibration(model, images, path).measure(CANDIDATES[:1])[CANDIDATES[0]]
    header, line = path.read_text().splitlines()
    entry = json.loads(line)
    del entry["lost"], entry["gained"]  # as such a journal wrote it
    path.write_text(header + "\n" + json.dumps(entry) + "\n")
    again = calibration(model, images, path)
    assert again.cached(CANDIDATES[0]) is None
    assert again.measure(CANDIDATES[:1])[CANDIDATES[0]] == first and again.evaluated == 1
    assert calibration(model, images, path).cached(CANDIDATES[0]) == first  # the later line wins


def test_a_journal_of_another_model_is_refused(model, images, tmp_path):
    path = tmp_path / "acc.jsonl"
    calibration(model, images, path).measure(CANDIDATES[:1])
    other = create_model("test_vit", 64, num_classes=4)
    with torch.no_grad():
        other.head.bias.add_(1.0)
    with pytest.raises(AccuracyCacheError, match="belongs to another model .*weights"):
        calibration(other, images, path)
    path.write_text("not json\n")
    with pytest.raises(AccuracyCacheError, match="not a pomt accuracy cache"):
        calibration(model, images, path)


def test_other_images_or_another_kind_are_other_keys(model, images, tmp_path):
    path = tmp_path / "acc.jsonl"
    calibration(model, images, path).measure(CANDIDATES[:1])
    moved = TensorDataset(images.tensors[0] + 1, images.tensors[1])
    assert calibration(model, moved, path).cached(CANDIDATES[0]) is None
    agreement = calibration(model, images, path, AGREEMENT)
    assert agreement.cached(CANDIDATES[0]) is None
    assert agreement.measure([Candidate.of("pomt", {})])[Candidate.of("pomt", {})].value == 1.0


def test_an_image_folder_is_named_by_its_files(model, tmp_path):
    root = make_image_folder(tmp_path / "data", per_class=2)
    dataset, _ = open_image_folder(root, eval_transform(model, (64, 64)))
    before = dataset_digest(dataset)
    next(root.rglob("*.png")).write_bytes(next(reversed(sorted(root.rglob("*.png")))).read_bytes())
    assert dataset_digest(open_image_folder(root, eval_transform(model, (64, 64)))[0]) != before


def test_a_drop_surely_beyond_the_limit_stops_and_counts_only_where_stopping_is_asked(model, images, tmp_path):
    path = tmp_path / "acc.jsonl"
    cal = calibration(model, images, path)
    stopped = cal.measure(CANDIDATES, SEARCH, stop_above=-0.95)  # on 4 images, surely above -95 points
    pruned, unpruned = CANDIDATES[:2], CANDIDATES[2]  # topk removing nothing is the unpruned model
    assert all(stopped[c].trials == 4 for c in pruned)  # one batch of 4 of the 15 search images
    assert stopped[unpruned].trials == 15  # the reference is never stopped
    assert cal.evaluated == 3
    again = calibration(model, images, path)  # a resumed search that stops reads them back
    assert again.measure(CANDIDATES, SEARCH, stop_above=-0.95) == stopped and again.evaluated == 0
    full = again.measure(CANDIDATES[:1], SEARCH)  # without stopping: measured again on every image
    assert full[CANDIDATES[0]].trials == 15 and again.evaluated == 1
    assert again.measure(CANDIDATES, SEARCH)[CANDIDATES[0]] == full[CANDIDATES[0]]
    assert again.evaluated == 2  # the other stopped one measured again, the complete unpruned one read back


def test_surely_dropped_more_reads_the_lower_bound_of_the_drop():
    assert surely_dropped_more(Proportion(30, 100, lost=40, gained=0), 0.06)  # 40 points lost of 100
    assert not surely_dropped_more(Proportion(66, 100, lost=4, gained=0), 0.06)  # 4 points: maybe less than 6
    assert not surely_dropped_more(Proportion(66, 100), 0.06)  # not paired: never stopped
    assert surely_dropped_more(Proportion(60, 100, lost=10, gained=0), 0.03, confidence=0.9)
    assert not surely_dropped_more(Proportion(60, 100, lost=10, gained=0), 0.03, confidence=0.9999)
