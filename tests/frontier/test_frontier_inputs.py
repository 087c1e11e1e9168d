"""Bad input to the frontier search and to the schedules it writes (issue 30): one line on stderr and exit
code 2, before anything is measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pomt.errors import CalibrationError
from pomt.frontier.cache import AccuracyCache
from pomt.frontier.certify import check_certifiable, images_to_certify_unchanged

from conftest import assert_one_line_error, run_in_process, schedule_dict
from support.tiny_data import make_image_folder

TINY = ("--model", "deit_tiny", "--input-size", "64", "--batch-size", "1", "--no-progress", "--no-pretrained")
STEM = "deit_tiny_patch16_224_cpu_bs1_is64"


def _nothing_measured(folder: Path) -> None:
    """No latency visit in the run's journal (opened, with its header only), no schedule written."""
    for trace in folder.glob("*.trace.csv"):
        assert len(trace.read_text().splitlines()) <= 1, trace.read_text()
    assert not list(folder.glob("*.schedule.json"))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """16 unlabelled images (agreement needs no labels): 8 search images at the default held-out share."""
    return make_image_folder(tmp_path_factory.mktemp("flat"), per_class=4, labelled=False)


def _schedule(tmp_path: Path, method: str, prune: list[tuple[int, int]]) -> Path:
    data = schedule_dict(method=method, prune=[{"block": b, "remove": r} for b, r in prune],
                         kept_tokens=197 - sum(r for _, r in prune))
    path = tmp_path / "bad.schedule.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("method", "prune", "fragments"), [
    ("pomt", [(3, 10), (12, 5)], ("block 12", "outside the model's blocks 0..11")),
    ("topk", [(0, 150), (4, 46)], ("block 4 cannot remove 46", "only 46 patch tokens are left")),
    ("tome", [(0, 60), (1, 69)], ("ToMe merges at most half the 136 patch tokens entering block 1", "r = 69")),
])
def test_a_schedule_the_model_cannot_run_is_refused(tmp_path, method, prune, fragments):
    path = _schedule(tmp_path, method, prune)
    result = run_in_process("bench", "--schedule", str(path), "--model", "deit_tiny",
                            "--output-dir", str(tmp_path / "out"))
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_too_few_calibration_images_for_the_drop_is_refused_before_measuring(tmp_path, images):
    result = run_in_process("offline", *TINY, "--dataset-root", str(images), "--agreement",
                            "--output-dir", str(tmp_path))
    assert_one_line_error(result, "held-out images cannot certify a drop within 1 points at 95% for 4 finalists",
                          f"that takes {images_to_certify_unchanged(0.01, 0.95)}")
    _nothing_measured(tmp_path)


def test_an_accuracy_cache_of_another_model_is_refused_before_measuring(tmp_path, images):
    cache = tmp_path / "foreign.sqlite"
    AccuracyCache(cache, {"model": "deit_small_patch16_224", "weights": "0123456789abcdef"})
    result = run_in_process("offline", *TINY, "--dataset-root", str(images), "--agreement", "--accuracy-cache",
                            str(cache), "--max-accuracy-drop", "50", "--output-dir", str(tmp_path))
    assert_one_line_error(result, "belongs to another model", "deit_small_patch16_224")
    _nothing_measured(tmp_path)


def test_a_grid_that_stops_above_the_lowest_count_is_refused_before_measuring(tmp_path, images):
    result = run_in_process("offline", *TINY, "--dataset-root", str(images), "--agreement", "--max-accuracy-drop",
                            "50", "--grid-token-stop", "9", "--output-dir", str(tmp_path))
    assert_one_line_error(result, "down to 2 kept tokens", "the grid stops at 9")
    _nothing_measured(tmp_path)


@pytest.mark.parametrize(("args", "fragments"), [
    (("--policy", "frontier"), ("the frontier policy measures each schedule's accuracy", "--dataset-root")),
    (("--max-accuracy-drop", "0"), ("--max-accuracy-drop must be positive",)),
    (("--max-evals", "0"), ("--max-evals", "greater than or equal to 1")),
    (("--held-out", "1"), ("--held-out", "less than or equal to 0.95")),
    (("--accuracy-confidence", "0.4"), ("--accuracy-confidence", "greater than or equal to 0.5")),
    (("--accuracy-confidence", "1"), ("--accuracy-confidence", "less than or equal to 0.999")),
])
def test_frontier_settings_out_of_range_are_refused(tmp_path, args, fragments):
    assert_one_line_error(run_in_process("offline", *TINY, *args, "--output-dir", str(tmp_path)), *fragments)


def test_the_held_out_images_must_certify_an_unchanged_schedule():
    needed = images_to_certify_unchanged(0.01, 0.95)
    check_certifiable(needed, 0.01, 0.95)
    with pytest.raises(CalibrationError, match=rf"{needed - 1} held-out images cannot certify .* takes {needed}"):
        check_certifiable(needed - 1, 0.01, 0.95)
    with pytest.raises(CalibrationError, match="must be positive"):
        check_certifiable(1000, 0.0, 0.95)
