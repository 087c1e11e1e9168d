"""The benchmark predicts from the curve the offline computation priced from (smoothed between its steps)."""

import contextlib
import io

import pytest

from pomt.bench.predict import predictor
from pomt.cli import main
from pomt.formats.schedule import load_schedule
from pomt.models.registry import geometry_of

from conftest import DATA


def test_the_benchmark_predicts_a_schedule_as_the_offline_computation_did(tmp_path):
    # a noisy trace (8.6% a visit), where the smoothed curve's unpruned level is 2% off the measured point's
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
        main(["offline", "--replay", str(DATA / "deit_tiny_bs4_amd_noisy_chained.csv"), "--output-dir", str(tmp_path),
              "--no-progress", "--policy", "budget", "--latency-budget-ms", "135"])
        raise SystemExit(0)
    assert exit_.value.code in (0, None)
    source = next(tmp_path.glob("*.schedule.json"))
    schedule = load_schedule(source)
    assert schedule.removal
    ratio = predictor(schedule, source, geometry_of(schedule.model, 224))
    expected = schedule.predicted.pruned_ms / schedule.predicted.baseline_ms  # a replay measures no method cost
    assert ratio(schedule.method, schedule.removal) == pytest.approx(expected, abs=1e-4)
