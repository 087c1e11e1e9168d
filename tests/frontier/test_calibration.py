"""Accuracy of candidate schedules on calibration images: the splits, the cache, candidates evaluated together
(the blocks before their first cut run once for all), the unpruned model's classes found once per split and kept
in the cache, and the calibration hosted in a worker process."""

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from pomt.accuracy import AGREEMENT, TOP1, eval_transform, open_image_folder
from pomt.errors import AccuracyCacheError, DatasetError, PatchError
from pomt.frontier.cache import AccuracyCache
from pomt.frontier.calibration import (
    HELD_OUT,
    SEARCH,
    Calibration,
    Classifier,
    candidate_logits,
    count_correct,
    dataset_digest,
    hosted,
    image_outcomes,
    model_identity,
    shares_prefix,
    split_indices,
    surely_dropped_more,
    unpruned_classes,
)
from pomt.frontier.candidates import NONE, Candidate
from pomt.models.registry import create_model
from pomt.patching import patch, patch_state, unpatch
from pomt.stats import Proportion

from support.tiny_data import make_image_folder

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
    return Calibration(Classifier(model, kind, batch_size=4), dataset, AccuracyCache(path, model_identity(model)))


def test_the_split_is_seeded_disjoint_and_complete():
    split = split_indices(30, 0.4, seed=3)
    assert split == split_indices(30, 0.4, seed=3) and split != split_indices(30, 0.4, seed=4)
    assert len(split[HELD_OUT]) == 12 and sorted(split[SEARCH] + split[HELD_OUT]) == list(range(30))
    with pytest.raises(DatasetError, match="at least 2 images"):
        split_indices(1)


def test_measured_accuracies_are_the_counts_on_the_splits_images(model, images, tmp_path):
    cal = calibration(model, images, tmp_path / "acc.sqlite")
    found = cal.measure(CANDIDATES, SEARCH)
    search = [images[i] for i in cal.indices[SEARCH]]
    batch = (torch.stack([x for x, _ in search]), torch.stack([y for _, y in search]))
    assert found == count_correct(Classifier(model), CANDIDATES, [batch])
    assert all(p.paired for p in found.values())
    assert cal.evaluated == 3 and found[CANDIDATES[0]].trials == cal.size(SEARCH) == 15


def test_results_are_read_back_from_the_cache_and_another_models_is_refused(model, images, tmp_path):
    path = tmp_path / "acc.sqlite"
    first = calibration(model, images, path).measure(CANDIDATES, SEARCH)
    again = calibration(model, images, path)
    assert again.measure(CANDIDATES, SEARCH) == first and again.evaluated == 0
    calibration(model, images, path).measure(CANDIDATES[:1])
    other = create_model("test_vit", 64, num_classes=4)
    with torch.no_grad():
        other.head.bias.add_(1.0)
    with pytest.raises(AccuracyCacheError, match="belongs to another model .*weights"):
        calibration(other, images, path)
    path.unlink()
    path.write_text("not a database\n")
    with pytest.raises(AccuracyCacheError, match="is not SQLite or is corrupt"):
        calibration(model, images, path)


def test_other_images_or_another_kind_are_other_keys(model, images, tmp_path):
    path = tmp_path / "acc.sqlite"
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
    path = tmp_path / "acc.sqlite"
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


SHARED_CANDIDATES = [Candidate.of(method, removal) for method in ("pomt", "topk", "tome", "l2norm")
              for removal in ({0: 3}, {2: 4, 4: 2}, {5: 3}, {1: 2, 2: 2, 3: 2, 4: 2})] + [Candidate.of("pomt", {})]


@pytest.fixture(scope="module")
def vit():
    return create_model("test_vit", 64, num_classes=10)  # 17 tokens, 6 blocks, seeded random weights


def own_logits(vit, candidate, images):
    if not candidate.unpruned:
        patch(vit, candidate.method, candidate.as_dict())
    try:
        return vit(images)
    finally:
        unpatch(vit)


@pytest.mark.parametrize("avg_pool", [False, True])
def test_shared_prefix_logits_equal_each_patched_models_own_exactly(vit, avg_pool):
    if avg_pool:  # ToMe then also weights the pooling by token size
        vit = create_model("test_vit", 64, num_classes=10)
        vit.global_pool = "avg"
    images = torch.randn(5, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    assert shares_prefix(vit)
    with torch.inference_mode():
        shared = candidate_logits(vit, SHARED_CANDIDATES, images)
        for candidate in SHARED_CANDIDATES:
            assert torch.equal(shared[candidate], own_logits(vit, candidate, images)), candidate.key
    assert patch_state(vit) is None  # left unpatched


def test_without_sharing_every_candidate_runs_its_own_forward(vit):
    images = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        shared = candidate_logits(vit, SHARED_CANDIDATES, images, share=True)
        alone = candidate_logits(vit, SHARED_CANDIDATES, images, share=False)
    assert all(torch.equal(shared[c], alone[c]) for c in SHARED_CANDIDATES)


def test_counts_against_labels_or_against_the_unpruned_model(vit):
    images = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        unpruned = vit(images).argmax(-1)
    batches = [(images[:5], unpruned[:5]), (images[5:], unpruned[5:])]
    labelled = count_correct(Classifier(vit), SHARED_CANDIDATES, batches)
    agreeing = count_correct(Classifier(vit, AGREEMENT), SHARED_CANDIDATES, batches)
    assert labelled == agreeing  # labels that are the unpruned top-1: the same counts
    assert agreeing[NONE] == Proportion(8, 8, lost=0, gained=0)
    for candidate in SHARED_CANDIDATES:  # against the unpruned model: only lost, and what it lost is what it missed
        assert agreeing[candidate].trials == 8 and agreeing[candidate].gained == 0
        assert agreeing[candidate].lost == 8 - agreeing[candidate].successes


def test_a_candidate_that_stop_accepts_is_measured_no_further(vit):
    images = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    labels = torch.arange(8) % 10
    batches = [(images[:5], labels[:5]), (images[5:], labels[5:])]
    stopping = SHARED_CANDIDATES[0]
    counted = count_correct(Classifier(vit), SHARED_CANDIDATES, batches,
                            stop=lambda p, seen=[]: seen.append(p) or len(seen) == 1)  # the first asked stops
    first = count_correct(Classifier(vit), SHARED_CANDIDATES, batches[:1])
    full = count_correct(Classifier(vit), SHARED_CANDIDATES, batches)
    assert counted[stopping] == first[stopping] and counted[stopping].trials == 5  # its counts on the first batch
    assert all(counted[c] == full[c] for c in SHARED_CANDIDATES[1:])  # the others: every image
    assert counted[NONE] == full[NONE]  # the unpruned model is never stopped
    outcomes = image_outcomes(Classifier(vit), [stopping], batches, stop=lambda p: True)
    assert len(outcomes[stopping]) == len(outcomes[NONE]) == 5  # all asked for stopped: so did the pass


def test_what_a_candidate_lost_and_gained_is_counted_image_by_image(vit):
    images = torch.randn(12, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    labels = torch.arange(12) % 10
    counted = count_correct(Classifier(vit), SHARED_CANDIDATES, [(images, labels)])
    with torch.inference_mode():
        logits = candidate_logits(vit, [NONE, *SHARED_CANDIDATES], images)
    reference = logits[NONE].argmax(-1) == labels
    for candidate in SHARED_CANDIDATES:
        right = logits[candidate].argmax(-1) == labels
        assert counted[candidate] == Proportion(int(right.sum()), 12, int((reference & ~right).sum()),
                                                int((right & ~reference).sum()))


def test_labels_beyond_the_models_classes_are_a_dataset_error(vit):
    with pytest.raises(DatasetError, match="more classes than the model's 10 outputs"):
        count_correct(Classifier(vit), SHARED_CANDIDATES[:1], [(torch.randn(2, 3, 64, 64), torch.tensor([3, 12]))])


HOSTED_CANDIDATES = [NONE, Candidate.of("tome", {0: 2, 1: 2}), Candidate.of("topk", {2: 6})]


def tiny_calibration(path):
    model = create_model("test_vit", 64, num_classes=4)
    generator = torch.Generator().manual_seed(0)
    images = TensorDataset(torch.randn(30, 3, 64, 64, generator=generator),
                           torch.randint(0, 4, (30,), generator=generator))
    return Calibration(Classifier(model, TOP1, batch_size=4), images, AccuracyCache(path, model_identity(model)))


def refuse_forward(*_, **__):
    raise AssertionError("the accuracy forwards ran in the timing process")


def test_a_hosted_calibration_answers_as_here_caches_the_same_and_runs_no_forward_here(tmp_path):
    here = tiny_calibration(tmp_path / "here.sqlite")
    expected = {split: here.measure(HOSTED_CANDIDATES, split) for split in (SEARCH, HELD_OUT)}
    away = tiny_calibration(tmp_path / "away.sqlite")
    with hosted(away) as hosted_away:
        away.classifier.model.forward = refuse_forward  # the worker holds its own model object, given before this
        # its own copy: weights a worker maps in shared memory slowed the parent's forwards by 40%
        assert not any(p.is_shared() for p in away.classifier.model.parameters())
        assert hosted_away.kind == TOP1 and hosted_away.size(SEARCH) == here.size(SEARCH)
        assert {split: hosted_away.measure(HOSTED_CANDIDATES, split) for split in (SEARCH, HELD_OUT)} == expected
        assert hosted_away.evaluated == 2 * len(HOSTED_CANDIDATES) and hosted_away.seconds > 0
        later = HOSTED_CANDIDATES[1:]
        assert hosted_away.measure(later, SEARCH) == {c: expected[SEARCH][c] for c in later}
        assert hosted_away.evaluated == 2 * len(HOSTED_CANDIDATES)  # read back from its cache, not measured again
    identity = model_identity(here.classifier.model)
    away_cache = AccuracyCache(tmp_path / "away.sqlite", identity)
    here_cache = AccuracyCache(tmp_path / "here.sqlite", identity)
    for candidate in HOSTED_CANDIDATES:
        for split in here.split_ids.values():
            assert away_cache.get(candidate, split) == here_cache.get(candidate, split)


def test_an_error_in_the_worker_arrives_here_as_itself(tmp_path):
    with hosted(tiny_calibration(tmp_path / "j.sqlite")) as away, pytest.raises(PatchError, match="remove at most 15"):
        away.measure([Candidate.of("pomt", {0: 40})], SEARCH)  # test_vit at 64 px has 16 patch tokens


def counting_blocks(model):
    """A list that grows by one each time any block of `model` runs."""
    runs = []
    for block in model.blocks:
        block.register_forward_hook(lambda *_: runs.append(1))
    return runs


@pytest.mark.parametrize("kind", [TOP1, AGREEMENT])
def test_given_the_unpruned_classes_the_counts_are_the_same_and_the_unpruned_model_does_not_run(kind):
    vit = create_model("test_vit", 64, num_classes=10)
    images = torch.randn(9, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    batches = [(images[:4], torch.arange(4) % 10), (images[4:], torch.arange(5) % 10)]
    early = [Candidate.of("tome", {0: 2}), Candidate.of("pomt", {0: 5})]  # both cut at the first block
    plain = count_correct(Classifier(vit, kind), early, batches)
    classes = unpruned_classes(Classifier(vit, kind), batches)
    runs = counting_blocks(vit)
    given = count_correct(Classifier(vit, kind), early, batches, unpruned=classes)
    assert given == plain
    assert len(runs) == 2 * len(early) * len(vit.blocks)  # each candidate's own blocks, per batch, and no more
    reference = count_correct(Classifier(vit, kind), [NONE], batches)
    assert count_correct(Classifier(vit, kind), [NONE], batches, unpruned=classes) == reference


def test_a_calibration_finds_the_unpruned_classes_once_per_split(model, images, tmp_path):
    measured = calibration(model, images, tmp_path / "cache.sqlite")
    first = measured.measure(CANDIDATES[:1])
    kept = measured.unpruned[SEARCH].clone()
    second = measured.measure(CANDIDATES[1:])
    assert torch.equal(measured.unpruned[SEARCH], kept) and set(measured.unpruned) == {SEARCH}
    fresh = calibration(model, images, None)  # nothing cached: counted in one pass of its own
    assert fresh.measure(CANDIDATES) == {**first, **second}


def test_a_second_calibration_on_the_same_cache_reads_the_unpruned_classes_kept_there(images, tmp_path):
    vit = create_model("test_vit", 64, num_classes=4)
    first = calibration(vit, images, tmp_path / "cache.sqlite")
    first.measure(CANDIDATES[:1])
    runs = counting_blocks(vit)
    second = calibration(vit, images, tmp_path / "cache.sqlite").measure(CANDIDATES[1:2])
    read_back, runs[:] = len(runs), []
    alone = calibration(vit, images, None).measure(CANDIDATES[1:2])  # nothing kept: a reference pass of its own
    reference_pass = len(vit.blocks) * math.ceil(first.size(SEARCH) / 4)
    assert second == alone and len(runs) == read_back + reference_pass
