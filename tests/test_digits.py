"""The digits case: sklearn's digits as ImageFolders, and a ViT trained on them, cached by its recipe."""

import json

import numpy as np
import torch

from pomt.accuracy import TOP1, eval_transform, open_image_folder
from pomt.digits import SMALL, DigitsSpec, digits_case, learning_rate, render, split_per_class, write_digits
from pomt.models.registry import create_model


def test_a_digit_is_upscaled_deterministically():
    pixels = np.arange(64, dtype=float).reshape(8, 8) % 17
    image = render(pixels, 112)
    assert image.size == (112, 112) and image.mode == "L"
    assert np.array_equal(np.asarray(image), np.asarray(render(pixels, 112)))


def test_the_split_is_per_class_seeded_and_disjoint():
    targets = np.repeat(np.arange(10), 30)
    split = split_per_class(targets, DigitsSpec(per_class=20, calibration=0.25))
    assert len(split["train"]) == 150 and len(split["calibration"]) == 50
    assert not set(split["train"]) & set(split["calibration"])
    assert np.bincount(targets[split["calibration"]]).tolist() == [5] * 10
    assert split == split_per_class(targets, DigitsSpec(per_class=20, calibration=0.25))


def test_the_folders_are_written_once_and_read_as_image_folders(tmp_path):
    spec = DigitsSpec(size=32, per_class=6)
    root = write_digits(tmp_path, spec)
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["images"] == {"train": 40, "calibration": 20}
    stamp = (root / "manifest.json").stat().st_mtime_ns
    assert write_digits(tmp_path, spec) == root and (root / "manifest.json").stat().st_mtime_ns == stamp
    assert write_digits(tmp_path, DigitsSpec(size=32, per_class=6, seed=1)) != root
    dataset, kind = open_image_folder(root / "calibration", eval_transform(create_model("test_vit", 32), (32, 32)))
    assert kind == TOP1 and dataset.classes == [str(d) for d in range(10)] and len(dataset) == 20
    assert dataset[0][0].shape == (3, 32, 32)


def test_the_learning_rate_warms_up_then_decays_to_zero():
    rates = [learning_rate(step, 100, SMALL) for step in range(100)]
    assert rates[9] == SMALL.lr and rates[0] == SMALL.lr / 10 and rates[-1] < 0.01 * SMALL.lr
    assert all(a >= b for a, b in zip(rates[9:-1], rates[10:], strict=True))


def test_a_trained_case_is_cached_by_its_recipe_and_loads_with_create_model(tmp_path):
    case = digits_case(SMALL, tmp_path)
    assert not case.reused and case.checkpoint.is_file() and case.calibration_images == 50
    assert 0.0 <= case.accuracy <= 1.0 and case.train_s > 0
    again = digits_case(SMALL, tmp_path)
    assert again.reused and again.checkpoint == case.checkpoint and again.accuracy == case.accuracy
    model = again.load()
    assert model.num_classes == 10 and not model.training
    trained = torch.load(case.checkpoint, weights_only=True)["state_dict"]
    assert torch.equal(model.head.weight, trained["head.weight"])
    assert json.loads(case.checkpoint.with_suffix(".json").read_text())["recipe"]["epochs"] == SMALL.epochs
