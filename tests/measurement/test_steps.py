"""Step detection on seeded synthetic curves: linear trend + planted steps + Gaussian noise + spikes."""


import numpy as np
import pytest

from pomt.errors import CurveError
from pomt.formats.trace import inject_steps, read_trace
from pomt.measurement.steps import Step, detect_steps, steps_in_trace

from conftest import DATA

SIGMA = 0.05  # ms of Gaussian noise on every point


def staircase(seed: int, n_max: int = 197, n_steps: int = 4, spikes: tuple[int, ...] = ()):
    """L(n) = 10 + 0.05 n + 1e-4 n^2 ms, plus steps of 5.5-10 sigma at random counts >= 12 apart.

    A step at p raises every count above p: pruning to p lands below it (p is the low side).
    """
    rng = np.random.default_rng(seed)
    n = np.arange(2, n_max + 1)
    while True:
        pos = np.sort(rng.choice(np.arange(15, n_max - 15), n_steps, replace=False))
        if np.all(np.diff(pos) >= 12):
            break
    heights = rng.uniform(5.5, 10.0, n_steps) * SIGMA
    y = 10 + 0.05 * n + 1e-4 * n**2 + rng.normal(0, SIGMA, n.size)
    for p, h in zip(pos, heights, strict=True):
        y = y + h * (n > p)
    for s in spikes:
        y[n == s] += 12 * SIGMA
    return n, y, pos


def matches(found: list[Step], planted) -> bool:
    return len(found) == len(planted) and all(
        any(abs(s.tokens - p) <= 1 for s in found) for p in planted
    )


@pytest.mark.parametrize("seed", range(6))
def test_planted_steps_found_within_one_token(seed):
    n, y, pos = staircase(seed)
    report = detect_steps(n, y)
    assert matches(report.steps, pos), ([s.tokens for s in report.steps], pos)
    assert all(s.kind == "drop" and s.significance >= 5 for s in report.steps)
    assert report.noise_ms == pytest.approx(SIGMA, rel=0.3)


@pytest.mark.parametrize("seed", range(6))
def test_no_false_positive_on_linear_noise(seed):
    rng = np.random.default_rng(100 + seed)
    n = np.arange(2, 198)
    y = 10 + 0.05 * n + rng.normal(0, SIGMA, n.size)
    report = detect_steps(n, y)
    assert report.steps == []
    assert report.spikes == []


def test_step_fields():
    n = np.arange(2, 60)
    y = 10 + 0.1 * n + 1.0 * (n > 30)  # noiseless: 1 ms step between 30 and 31
    (step,) = detect_steps(n, y).steps
    assert (step.tokens, step.upper_tokens, step.kind) == (30, 31, "drop")
    assert step.before_ms == pytest.approx(10 + 3.1 + 1.0)
    assert step.after_ms == pytest.approx(13.0)
    assert step.drop_ms == pytest.approx(1.1)
    assert step.drop_pct == pytest.approx(100 * 1.1 / 14.1)
    assert step.excess_ms == pytest.approx(1.0)
    assert step.to_dict()["tokens"] == 30


def test_spikes_reported_not_steps():
    n, y, pos = staircase(3, spikes=(40, 120))
    report = detect_steps(n, y)
    assert sorted(report.spikes) == [40, 120]
    assert matches(report.steps, pos)


def test_non_monotone_region_is_a_rise():
    rng = np.random.default_rng(7)
    n = np.arange(2, 198)
    # counts 90..99 cost 0.6 ms more than the trend: 100 -> 99 gets slower (rise), 90 -> 89 faster (drop)
    y = 10 + 0.05 * n + 0.6 * ((n >= 90) & (n <= 99)) + rng.normal(0, SIGMA, n.size)
    steps = {(s.tokens, s.kind) for s in detect_steps(n, y).steps}
    assert any(kind == "rise" and abs(tok - 99) <= 1 for tok, kind in steps), steps
    assert any(kind == "drop" and abs(tok - 89) <= 1 for tok, kind in steps), steps
    assert len(steps) == 2


def test_step_spread_over_three_tokens_reported_once():
    rng = np.random.default_rng(11)
    n = np.arange(2, 198)
    # 100 -> 99 -> 98 -> 97 each drop a third of 1.2 ms: pruning to 97 lands below all of it
    stairs = (n >= 98).astype(float) + (n >= 99) + (n >= 100)
    y = 10 + 0.05 * n + 0.4 * stairs + rng.normal(0, SIGMA, n.size)
    (step,) = detect_steps(n, y).steps
    assert abs(step.tokens - 97) <= 1
    assert abs(step.upper_tokens - 100) <= 1


def test_irregular_unsorted_grid():
    rng = np.random.default_rng(5)
    n = np.unique(np.concatenate([np.arange(2, 198, 7), np.arange(60, 80), [140, 141, 142, 143]]))
    y = 10 + 0.05 * n + 0.5 * (n > 70) + 0.6 * (n > 141) + rng.normal(0, SIGMA, n.size)
    order = rng.permutation(n.size)
    steps = detect_steps(n[order], y[order]).steps
    assert [(s.tokens, s.upper_tokens) for s in steps] == [(70, 71), (141, 142)]


def test_given_noise_raises_the_bar():
    n, y, _ = staircase(0)
    report = detect_steps(n, y, noise_ms=0.8)
    assert report.noise_ms == pytest.approx(0.8)
    assert report.steps == []


def test_per_point_noise_hides_only_the_steps_where_it_is_large():
    n, y, pos = staircase(2)
    noisy = np.abs(n - pos[0]) <= 8  # the points around the first step were measured badly
    report = detect_steps(n, y, noise_ms=np.where(noisy, 20 * SIGMA, SIGMA))
    found = [s.tokens for s in report.steps]
    assert not any(abs(t - pos[0]) <= 1 for t in found), found
    assert all(any(abs(t - p) <= 1 for t in found) for p in pos[1:]), (found, pos)


def test_explicit_noise_and_k():
    n, y, pos = staircase(1)
    assert detect_steps(n, y, noise_ms=1.0).steps == []
    assert len(detect_steps(n, y, k=50).steps) < len(pos)


@pytest.mark.parametrize("points", [([5], [1.0]), ([5, 9], [1.0, 2.0]), ([5, 9, 7], [1.0, 2.0, 1.5])])
def test_tiny_inputs(points):
    report = detect_steps(*points)
    assert report.steps == [] and report.spikes == []


def test_bad_inputs():
    with pytest.raises(CurveError):
        detect_steps([1, 2, 3], [1.0, 2.0])
    with pytest.raises(CurveError):
        detect_steps([1, 2, 3, 4], [1.0, np.nan, 2.0, 3.0])




def test_a_dense_trace_confirms_its_own_steps_by_paired_visits():
    """The Intel deit_tiny trace: 57 kept tokens run faster than 56, 94 slower than 93 (paired within passes)."""
    trace = read_trace(DATA / "deit_tiny_bs1_shuffled.csv")
    found = {(s.tokens, s.kind): s for s in steps_in_trace(trace.visits, min_step=0.05)}
    assert (56, "rise") in found and found[(56, "rise")].paired_pct < -10
    assert any(kind == "drop" and 92 <= low <= 94 for low, kind in found)
    assert all(s.p_value < 1e-3 and s.paired_ci_pct[0] <= s.paired_pct <= s.paired_ci_pct[1] for s in found.values())
    deep = inject_steps(read_trace(DATA / "deit_tiny_bs4_amd_shuffled.csv"), {140: 1.08})  # 16 passes to pair
    assert any(s.tokens == 140 and s.kind == "drop" for s in steps_in_trace(deep.visits, min_step=0.05))


def test_two_sequential_sweeps_are_too_few_to_pair():
    assert steps_in_trace(read_trace(DATA / "deit_small_bs4_sequential.csv").visits) == []
