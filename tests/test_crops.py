"""The crops case: regions of the photos installed packages ship as ImageFolders, and a ViT trained on them."""

import dataclasses
import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from pomt.accuracy import TOP1, eval_transform, open_image_folder
from pomt.crops import GRIDS, SMALL, CropsSpec, crop_box, crops_case, regions, write_crops
from pomt.digits import CLASSES, calibration_accuracy
from pomt.errors import DatasetError
from pomt.models.registry import create_model

TINY = CropsSpec(size=32, train=3, calibration=2)


def test_the_regions_tile_the_photo_and_make_the_classifier_size():
    boxes = regions(640, 427, (2, 2))
    assert boxes[0] == (0.0, 0.0, 320.0, 213.5) and boxes[-1] == (320.0, 213.5, 640.0, 427.0)
    assert sum(rows * columns for rows, columns in GRIDS.values()) == CLASSES


@pytest.mark.parametrize("draws", [np.zeros(4), np.full(4, 0.999), np.array([0.999, 0.0, 0.5, 0.999])])
def test_a_crop_lies_in_its_grown_region_and_the_photo(draws):
    spec = CropsSpec()
    region = (320.0, 0.0, 640.0, 213.5)
    left, top, right, bottom = crop_box(draws, region, (640, 427), spec)
    grown = spec.overlap * 320.0, spec.overlap * 213.5
    assert 320.0 - grown[0] - 1e-9 <= left < right <= 640.0 and 0.0 <= top < bottom <= 213.5 + grown[1] + 1e-9
    area = (right - left) * (bottom - top) / (320.0 * 213.5)
    assert spec.scale[0] - 1e-9 <= area <= spec.scale[1] + 1e-9
    assert spec.aspect[0] - 1e-9 <= (right - left) / (bottom - top) <= spec.aspect[1] + 1e-9


def test_the_folder_holds_the_asked_images_the_same_for_a_seed(tmp_path):
    root = write_crops(tmp_path / "a", TINY)
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["images"] == {"train": 3 * CLASSES, "calibration": 2 * CLASSES}
    dataset, kind = open_image_folder(root / "train", eval_transform(create_model("test_vit", 32), (32, 32)))
    assert kind == TOP1 and len(dataset.classes) == CLASSES and dataset.classes == sorted(dataset.classes)
    assert np.bincount(dataset.targets).tolist() == [3] * CLASSES
    files = sorted(p for p in root.rglob("*.png"))
    assert len(files) == 5 * CLASSES
    assert {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files} == manifest["files"]
    with Image.open(files[0]) as image:
        assert image.size == (32, 32) and image.mode == "RGB"
    again = json.loads((write_crops(tmp_path / "b", TINY) / "manifest.json").read_text())
    assert again["files"] == manifest["files"] and len(set(manifest["files"].values())) == 5 * CLASSES


def test_the_folder_is_reused_and_rebuilt_for_another_spec(tmp_path):
    root = write_crops(tmp_path, TINY)
    stamp = (root / "manifest.json").stat().st_mtime_ns
    assert write_crops(tmp_path, TINY) == root and (root / "manifest.json").stat().st_mtime_ns == stamp
    other = write_crops(tmp_path, dataclasses.replace(TINY, seed=1))
    assert other != root
    first, second = (json.loads((r / "manifest.json").read_text())["files"] for r in (root, other))
    assert first.keys() == second.keys() and not set(first.values()) & set(second.values())


def test_a_bad_spec_is_refused(tmp_path):
    with pytest.raises(DatasetError, match="at least 1 image"):
        write_crops(tmp_path, dataclasses.replace(TINY, calibration=0))
    with pytest.raises(DatasetError, match="scale and aspect"):
        write_crops(tmp_path, dataclasses.replace(TINY, scale=(0.5, 0.2)))


def test_a_trained_case_is_cached_and_scored_on_its_calibration_folder(tmp_path):
    case = crops_case(SMALL, tmp_path)
    assert not case.reused and case.calibration_images == SMALL.data.calibration * CLASSES
    assert 0.0 <= case.accuracy <= 1.0 and case.train_s > 0
    model = case.load()
    assert model.num_classes == CLASSES and not model.training
    assert calibration_accuracy(model, case.calibration_root, SMALL.data.size) == (case.accuracy,
                                                                                   case.calibration_images)
    stamp = case.checkpoint.stat().st_mtime_ns
    again = crops_case(SMALL, tmp_path)
    assert again.reused and again.checkpoint == case.checkpoint and again.accuracy == case.accuracy
    assert case.checkpoint.stat().st_mtime_ns == stamp
    assert json.loads(case.checkpoint.with_suffix(".json").read_text())["data"] == case.root.name
