"""Accuracy paths run for real: a generated ImageFolder and a tiny ViT trained in the test."""

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from pomt.accuracy import (
    AGREEMENT,
    TOP1,
    AccuracyCurve,
    Budget,
    HeldBatches,
    Images,
    accuracy_token_counts,
    eval_transform,
    image_loader,
    load_accuracy_curve,
    measure_accuracy,
    open_image_folder,
    outcomes,
    random_images,
    save_accuracy_curve,
    seeded_subset,
    whole_batches,
)
from pomt.errors import CurveError, DatasetError
from pomt.models.registry import create_model

from support.tiny_data import MODEL, SIZE, loader_for, make_image_folder


@pytest.mark.slow
def test_top1_falls_as_tokens_are_removed(trained):
    root, checkpoint, train_accuracy = trained
    assert train_accuracy > 0.8  # chance is 0.25
    model = create_model(MODEL, input_size=SIZE, checkpoint=checkpoint)
    loader, kind = loader_for(root, model)
    assert kind == TOP1
    curve = measure_accuracy(model, Images(loader, kind, progress=False), [2, 6, 13, 25, 37])
    values = [curve.values[n] for n in (2, 6, 13, 25, 37)]
    assert curve.samples == 160
    assert values[-1] > 0.8
    assert values[0] < values[2] < values[-1]
    assert values[0] < 0.6  # one random patch token rarely holds the coloured square


@pytest.mark.slow
def test_agreement_on_unlabelled_folder(trained, tmp_path):
    _, checkpoint, _ = trained
    flat = make_image_folder(tmp_path / "flat", per_class=10, seed=1, labelled=False)
    model = create_model(MODEL, input_size=SIZE, checkpoint=checkpoint)
    loader, kind = loader_for(flat, model)
    assert kind == AGREEMENT
    curve = measure_accuracy(model, Images(loader, kind, progress=False), [2, 37])
    assert curve.values[37] == 1.0  # the unpruned model agrees with itself
    assert curve.values[2] < 0.8


def test_accuracy_of_a_half_precision_model_casts_the_images(tmp_path):
    """Images load as float32; a model in bfloat16 (float16 on CUDA) is fed its own dtype, not an error."""
    model = create_model(MODEL, input_size=SIZE).to(torch.bfloat16).eval()
    folder = make_image_folder(tmp_path / "flat", per_class=2, seed=3, labelled=False)
    loader, kind = loader_for(folder, model)
    curve = measure_accuracy(model, Images(loader, kind, progress=False), [2, 37])
    assert curve.samples == 8 and curve.values[37] == 1.0 and 0 <= curve.values[2] <= 1


def _same(x, _index):
    return x


def _flipped(x, _index):
    return x.flip(-1)  # top-1 class c becomes 2 - c


def test_outcomes_score_each_image_of_each_forward_against_labels_or_the_reference():
    images = torch.tensor([[0.0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 1, 0]])  # "logits": top-1 = 1, 0, 2, 1
    loader = [(images[:2], torch.tensor([1, 0])), (images[2:], torch.tensor([2, 0]))]
    forwards = {"same": _same, "flipped": _flipped}  # flipped top-1: 1, 2, 0, 1
    def listed(right):
        return {key: hits.tolist() for key, hits in right.items()}

    assert listed(outcomes(forwards, Images(loader, TOP1, progress=False), _same)) == {
        "same": [True, True, True, False], "flipped": [True, False, False, False]}
    assert listed(outcomes(forwards, Images(loader, AGREEMENT, progress=False), _same)) == {
        "same": [True, True, True, True], "flipped": [True, False, False, True]}
    with pytest.raises(DatasetError, match="more classes than the model's 3 outputs"):
        outcomes(forwards, Images([(images[:1], torch.tensor([3]))], TOP1, progress=False), _same)


def test_whole_batches_of_seeded_random_images():
    dataset = random_images(10, (4, 4), seed=1)
    assert torch.equal(dataset[3][0], random_images(10, (4, 4), seed=1)[3][0])
    assert [len(images) for images, _ in whole_batches(dataset, 7, 4)] == [4, 4]  # 7 rounded up to 8
    with pytest.raises(DatasetError, match="fewer than one batch of 16"):
        whole_batches(dataset, 3, 16)


def test_dataset_errors(tmp_path):
    model = create_model(MODEL, input_size=SIZE)
    transform = eval_transform(model, (SIZE, SIZE))
    with pytest.raises(DatasetError, match="not found"):
        open_image_folder(tmp_path / "missing", transform)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no images"):
        open_image_folder(tmp_path / "empty", transform)
    (tmp_path / "classes" / "a").mkdir(parents=True)
    with pytest.raises(DatasetError, match="no usable images"):
        open_image_folder(tmp_path / "classes", transform)


def test_too_many_classes_for_the_model_is_a_dataset_error(tmp_path):
    root = make_image_folder(tmp_path / "data", per_class=2)
    model = create_model(MODEL, input_size=SIZE, num_classes=2)
    loader, kind = loader_for(root, model, batch_size=8)
    with pytest.raises(DatasetError, match="more classes"):
        measure_accuracy(model, Images(loader, kind, progress=False), [37])


def test_subset_is_seeded_and_bounded(tmp_path):
    root = make_image_folder(tmp_path / "data", per_class=5)
    dataset, _ = open_image_folder(root, eval_transform(create_model(MODEL, input_size=SIZE), (SIZE, SIZE)))
    a, b = seeded_subset(dataset, 7, seed=3), seeded_subset(dataset, 7, seed=3)
    assert len(a) == 7 and a.indices == b.indices
    assert seeded_subset(dataset, 7, seed=4).indices != a.indices
    assert len(seeded_subset(dataset, 100, seed=0)) == 20
    assert isinstance(next(iter(image_loader(a, 4)))[0], torch.Tensor)


def test_token_counts_cover_both_ends():
    counts = accuracy_token_counts(2, 197, 5, extra=[150, 500])
    assert counts[0] == 2 and counts[-1] == 197 and 150 in counts and 500 not in counts


def test_curve_file_round_trip_and_errors(tmp_path):
    curve = AccuracyCurve({2: 0.3, 10: 0.7, 17: 0.9}, TOP1, 50)
    path = save_accuracy_curve(tmp_path / "a.csv", curve)
    assert load_accuracy_curve(path) == curve
    assert load_accuracy_curve(path).at([6])[6] == pytest.approx(0.5)
    with pytest.raises(CurveError, match="outside"):
        load_accuracy_curve(path, (2, 9))
    bad = tmp_path / "bad.csv"
    bad.write_text("tokens,accuracy\n10,high\n")
    with pytest.raises(CurveError, match="corrupt"):
        load_accuracy_curve(bad)
    bad.write_text("tokens,accuracy\n10,1.5\n")
    with pytest.raises(CurveError, match=r"\[0, 1\]"):
        load_accuracy_curve(bad)
    with pytest.raises(CurveError, match="not found"):
        load_accuracy_curve(tmp_path / "none.csv")


class CountedReads(Dataset):
    """A dataset that counts the images read from it."""

    def __init__(self, images: int) -> None:
        generator = torch.Generator().manual_seed(5)
        self.data = TensorDataset(torch.randn(images, 3, 8, 8, generator=generator), torch.arange(images) % 3)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        self.reads += 1
        return self.data[index]


def same_batches(found, expected) -> bool:
    return len(found) == len(expected) and all(torch.equal(a, c) and torch.equal(b, d)
                                               for (a, b), (c, d) in zip(found, expected, strict=True))


BATCH_BYTES = 4 * (3 * 8 * 8 * 4 + 8)  # a batch of 4 images of 3x8x8 float32 and their int64 labels


@pytest.mark.parametrize("kept", [0, 2, 6])
def test_held_batches_are_the_loaders_and_the_kept_ones_are_read_once(kept):
    dataset = CountedReads(23)  # 6 batches of 4, the last of 3
    expected = list(image_loader(dataset.data, 4))
    held = HeldBatches(dataset, 4, Budget(kept * BATCH_BYTES))
    assert len(held) == 6
    stopped = iter(held)
    next(stopped)  # a pass stopped after its first batch
    stopped.close()
    assert same_batches(list(held), expected) and same_batches(list(held), expected)
    # read: 4 images in the stopped pass, then each pass all but those kept before it (kept 2: 19, then 15)
    assert len(held.kept) == kept and dataset.reads == {0: 4 + 23 + 23, 2: 4 + 19 + 15, 6: 4 + 19}[kept]


def test_held_batches_of_two_splits_share_one_budget():
    budget = Budget(3 * BATCH_BYTES)
    first, second = HeldBatches(CountedReads(8), 4, budget), HeldBatches(CountedReads(20), 4, budget)
    list(first), list(second)
    assert len(first.kept) == 2 and len(second.kept) == 1 and budget.left == 0
