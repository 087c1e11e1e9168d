"""benchmarks/detection_limits.py's precision interval: the wider of Wilson's and a bootstrap over the traces."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from pomt.stats import wilson_interval

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "detection_limits.py"


@pytest.fixture(scope="module")
def bank_benchmark():
    spec = importlib.util.spec_from_file_location("detection_limits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_false_steps_on_one_trace_widen_the_interval_more_than_the_same_steps_spread(bank_benchmark):
    spread = {f"trace{i}": (18, 1) for i in range(12)}  # 216 true, 12 false
    bunched = {**{f"trace{i}": (19, 0) for i in range(11)}, "trace11": (7, 12)}  # the same totals, one bad trace
    assert sum(t for t, _ in spread.values()) == sum(t for t, _ in bunched.values())
    (a, b), (c, d) = bank_benchmark.precision_interval(spread), bank_benchmark.precision_interval(bunched)
    point = 216 / 228
    assert a <= point <= b and c <= point <= d
    assert (a, b) == wilson_interval(216, 228)  # evenly spread, resampling the traces adds nothing
    assert d - c > 2 * (b - a)  # bunched, one trace's false steps are one draw, not twelve


def test_wilson_alone_where_the_traces_cannot_be_resampled(bank_benchmark):
    assert bank_benchmark.precision_interval({"only": (30, 2), "empty": (0, 0)}) == wilson_interval(30, 32)
    assert all(math.isnan(x) for x in bank_benchmark.precision_interval({"empty": (0, 0)}))
