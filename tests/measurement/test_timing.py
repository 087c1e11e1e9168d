"""Measurement tests compare workloads of known relative cost; they never check absolute times."""

import numpy as np
import pytest
import torch

from pomt.measurement.timing import fixed_threads, interleaved, summarise, time_callable


def _matmul(size: int):
    a = torch.randn(size, size)
    return lambda: a @ a


def test_summarise_statistics():
    stats = summarise([4.0, 1.0, 3.0, 2.0, 100.0])
    assert stats.median_ms == 3.0
    assert stats.min_ms == 1.0
    assert stats.samples == 5
    assert stats.iqr_ms == pytest.approx(np.percentile([1, 2, 3, 4, 100], 75) - 2.0)
    with pytest.raises(ValueError):
        summarise([])


def test_heavier_workload_times_longer():
    light, _ = time_callable(_matmul(64), threads=1, min_run_s=0.05)
    heavy, threads = time_callable(_matmul(384), threads=1, min_run_s=0.05)
    assert threads == 1
    assert heavy.median_ms > 5 * light.median_ms  # 216x the multiply-adds
    assert light.samples >= 5 and heavy.samples >= 5


def test_thread_count_is_fixed_and_restored():
    before = torch.get_num_threads()
    with fixed_threads(1) as used:
        assert used == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before


def test_interleaved_orders_known_costs():
    two = interleaved({"a": _matmul(64), "b": _matmul(384)}, threads=1, rounds=8).stats
    assert two["b"].median_ms / two["a"].median_ms > 5
    assert two["b"].min_ms / two["a"].min_ms > 5
    three = interleaved({"s": _matmul(32), "m": _matmul(128), "l": _matmul(384)}, threads=1, rounds=6)
    medians = [three.stats[k].median_ms for k in ("s", "m", "l")]
    assert medians == sorted(medians)
