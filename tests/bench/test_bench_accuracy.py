"""pomt.bench.accuracy: accuracy differences with their intervals, paired on the same images, and accuracy
measured in half precision and on an image folder."""

from __future__ import annotations

import math

import pytest
import torch

from pomt.bench.accuracy import Comparison, compare
from pomt.cli import main
from pomt.stats import Proportion, difference_interval

from support.bench_files import read_csv


def test_difference_interval_is_newcombes():
    low, high = difference_interval(Proportion(56, 70), Proportion(48, 80))  # Newcombe (1998), method 10
    assert (round(low, 4), round(high, 4)) == (0.0524, 0.3339)
    low, high = difference_interval(Proportion(40, 50), Proportion(40, 50))
    assert low < 0 < high and math.isclose(-low, high)


def test_a_difference_whose_interval_holds_zero_is_not_ranked():
    rows = [{"method": "none", "accuracy_correct": 50, "latency_ms": 10.0},
            {"method": "schedule", "accuracy_correct": 45, "latency_ms": 8.0, "amount": "-10@3"},
            {"method": "tome", "accuracy_correct": 44, "latency_ms": 8.1, "amount": "r=2"},
            {"method": "topk", "accuracy_correct": 20, "latency_ms": 7.9, "amount": "-20@3"}]
    by = {c.name: c for c in compare(rows, 50)}
    assert by["tome"].verdict == "indistinguishable" and "not ranked" in by["tome"].line()
    assert by["topk"].verdict == "behind" and "schedule more accurate" in by["topk"].line()
    assert by["none"].verdict == "ahead" and by["tome"].latency_ratio == pytest.approx(8.1 / 8.0)
    assert Comparison.from_dict(by["topk"].to_dict()).line() == by["topk"].line()
    assert compare([{**row, "accuracy_correct": None} for row in rows], 0) == []


def test_variants_on_the_same_images_are_compared_paired():
    """ToMe loses 10 of the 600 images the schedule got right and gains none: unpaired, 590 against 600 of 800
    is not ranked; paired, those ten images are the whole difference and it is ranked."""
    right = torch.zeros(800, dtype=torch.bool)
    right[:600] = True
    tome = right.clone()
    tome[:10] = False
    rows = [{"method": "none", "accuracy_correct": 600, "latency_ms": 10.0},
            {"method": "schedule", "accuracy_correct": 600, "latency_ms": 8.0, "amount": "-10@3"},
            {"method": "tome", "accuracy_correct": 590, "latency_ms": 8.1, "amount": "r=2"}]
    unpaired = {c.name: c for c in compare(rows, 800)}
    paired = {c.name: c for c in compare(rows, 800, {"none": right, "schedule": right, "tome": tome})}
    assert unpaired["tome"].verdict == "indistinguishable" and not unpaired["tome"].paired
    assert paired["tome"].verdict == "behind" and paired["tome"].paired and paired["tome"].ci[1] < 0
    assert paired["none"].ci == pytest.approx((0.0, 0.0), abs=0.01)  # the same images right: no difference
    again = Comparison.from_dict(paired["tome"].to_dict())
    assert again.paired and again.line() == paired["tome"].line()


def test_half_precision_benchmark_measures_accuracy(tmp_path):
    """--dtype bfloat16 (float16 on CUDA): the accuracy images are cast to the models' dtype."""
    args = "--model test_vit --input-size 96 --methods none,topk --remove 10 --rounds 2 --warmup 0 --threads 1"
    main(["bench", *args.split(), "--dtype", "bfloat16", "--accuracy-samples", "4", "--no-profile",
          "--output-dir", str(tmp_path)])
    _, rows = read_csv(tmp_path / "test_vit_cpu_bs1_is96.benchmark.csv")
    by = {r["method"]: r for r in rows}
    assert float(by["none"]["accuracy"]) == 1.0 and 0 <= float(by["topk"]["accuracy"]) <= 1


@pytest.mark.slow
def test_top1_on_an_image_folder(tmp_path, trained):
    from support.tiny_data import SIZE

    root, checkpoint, _ = trained  # a model whose classifier has the folder's classes
    args = f"--model test_vit --input-size {SIZE} --methods none,random --remove 10 --batch-size 2"
    args += " --accuracy-samples 6 --rounds 2 --warmup 0 --no-profile"
    main(["bench", *args.split(), "--dataset-root", str(root), "--checkpoint", str(checkpoint),
          "--output-dir", str(tmp_path)])
    _, rows = read_csv(next(tmp_path.glob("*.benchmark.csv")))
    assert {r["accuracy_kind"] for r in rows} == {"top1"}
    assert all(0 <= float(r["accuracy"]) <= 1 for r in rows)
