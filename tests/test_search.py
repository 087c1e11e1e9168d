"""Grid, point store, full and adaptive search on synthetic latency curves (no timing involved)."""

import json

import numpy as np
import pytest

from pomt.errors import CurveError, GridError
from pomt.measure import LatencyPoint
from pomt.search import PointStore, adaptive_search, full_search, remeasure_spikes, token_grid
from pomt.steps import detect_steps

SIGMA = 0.05  # ms of noise on every measured median
SAMPLES = 5
IQR = SIGMA * 1.349 * np.sqrt(SAMPLES) / 1.2533  # per-call IQR whose median error is SIGMA


class Curve:
    """L(n) = 10 + 0.05 n (197/N) + 2e-5 (197 n / N)^2 ms with planted steps, noise and optional spikes;
    counts its calls like a real measurement would cost them."""

    def __init__(self, seed: int, num_tokens: int, n_steps: int, min_gap: int, spikes: dict | None = None):
        rng = np.random.default_rng(seed)
        while True:
            pos = np.sort(rng.choice(np.arange(12, num_tokens - 12), n_steps, replace=False))
            if np.all(np.diff(pos) >= min_gap):
                break
        self.steps = [int(p) for p in pos]  # the step lies between p and p + 1
        self.heights = rng.uniform(6.0, 10.0, n_steps) * SIGMA
        self.scale = 197 / num_tokens
        self.noise = np.random.default_rng(seed + 1000)
        self.spikes = dict(spikes or {})  # count -> extra ms, on the first call only
        self.calls: list[int] = []

    def __call__(self, n: int) -> LatencyPoint:
        self.calls.append(n)
        value = 10 + 0.05 * n * self.scale + 2e-5 * (n * self.scale) ** 2
        value += sum(h for p, h in zip(self.steps, self.heights, strict=True) if n > p)
        value += self.noise.normal(0, SIGMA) + self.spikes.pop(n, 0.0)
        return LatencyPoint(
            tokens=n, median_ms=float(value), iqr_ms=IQR, samples=SAMPLES, threads=1, device="cpu"
        )


def located(points: dict, step: int) -> bool:
    """Both sides of the step measured on adjacent counts, within one token of it."""
    return any(a in points and a + 1 in points for a in (step - 1, step, step + 1))


def found(points: dict, step: int) -> bool:
    ordered = sorted(points)
    report = detect_steps(
        ordered,
        [points[n].median_ms for n in ordered],
        iqr_ms=[points[n].iqr_ms for n in ordered],
        samples=[points[n].samples for n in ordered],
    )
    return any(abs(s.tokens - step) <= 1 and s.kind == "drop" for s in report.steps)


@pytest.mark.parametrize(
    ("num_tokens", "n_steps", "min_gap", "seed"),
    [(197, 3, 28, 0), (197, 4, 28, 1), (197, 5, 28, 6), (197, 6, 28, 3), (197, 6, 28, 4),
     (785, 3, 56, 0), (785, 4, 56, 1), (785, 6, 56, 2), (785, 6, 56, 3)],
)
def test_adaptive_locates_every_step_with_a_quarter_of_the_evaluations(num_tokens, n_steps, min_gap, seed):
    curve = Curve(seed, num_tokens, n_steps, min_gap)
    grid = token_grid(num_tokens, 2, 1, min_tokens=2, max_tokens=num_tokens)
    points = adaptive_search(curve, grid, progress=False)
    assert len(curve.calls) <= len(grid) / 4, (len(curve.calls), len(grid))
    for step in curve.steps:
        assert located(points, step), (step, sorted(points))
        assert found(points, step), step
    assert {grid[0], grid[-1]} <= set(points)


def test_adaptive_on_a_strided_grid():
    curve = Curve(5, 197, 3, 30)
    grid = token_grid(197, 2, 3, min_tokens=2, max_tokens=197)  # 197, 194, ..., 5, 2
    points = adaptive_search(curve, grid, progress=False)
    assert set(points) <= set(grid)
    position = {n: i for i, n in enumerate(grid)}
    for step in curve.steps:  # both sides on neighbouring grid points
        pairs = [(a, b) for a, b in zip(grid, grid[1:], strict=False) if a <= step < b]
        ((a, b),) = pairs
        assert a in points and b in points and position[b] - position[a] == 1


def test_adaptive_remeasures_a_spike_once():
    curve = Curve(6, 197, 3, 30, spikes={100: 20 * SIGMA})
    grid = token_grid(197, 2, 1, min_tokens=2, max_tokens=197)
    points = adaptive_search(curve, grid, progress=False)
    assert curve.calls.count(100) == 2
    assert abs(points[100].median_ms - (curve(100).median_ms)) < 6 * SIGMA  # the re-measured value kept


def test_adaptive_respects_max_evals():
    curve = Curve(7, 197, 4, 28)
    grid = list(range(2, 198))
    adaptive_search(curve, grid, progress=False, max_evals=20)
    assert len(curve.calls) <= 20


def test_full_search_measures_each_point_once():
    curve = Curve(8, 197, 3, 20)
    grid = token_grid(197, 2, 5, min_tokens=2, max_tokens=197)
    points = full_search(curve, grid, progress=False)
    assert sorted(curve.calls) == grid
    assert list(points) == grid


def test_remeasure_spikes_keeps_the_new_value():
    curve = Curve(9, 197, 2, 40, spikes={70: 20 * SIGMA})
    points = full_search(curve, list(range(2, 198)), progress=False)
    assert points[70].median_ms > curve(70).median_ms + 10 * SIGMA
    fixed = remeasure_spikes(points, curve, rounds=2)
    assert abs(fixed[70].median_ms - points[69].median_ms) < 8 * SIGMA
    assert curve.calls.count(70) == 3  # measured, checked above, re-measured once


META = {"model": "deit_small_patch16_224", "batch_size": 4, "input_size": [224, 224], "device": "cpu"}


def test_store_resume_measures_each_point_once(tmp_path):
    path = tmp_path / "run.points.jsonl"
    grid = list(range(2, 60))
    first = Curve(10, 197, 2, 20)
    full_search(first, grid[:20], store=PointStore(path, META), progress=False)
    with path.open("a") as f:
        f.write('{"tokens": 30, "median_ms": 1')  # a run killed in the middle of a line
    second = Curve(10, 197, 2, 20)
    store = PointStore(path, META)
    assert sorted(store.load()) == grid[:20]
    points = full_search(second, grid, store=store, progress=False)
    assert sorted(second.calls) == grid[20:]
    assert list(points) == grid
    reloaded = PointStore(path, META).load()
    assert sorted(reloaded) == grid
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["meta"] == META
    assert len(lines) == 1 + len(grid)


def test_adaptive_resume_from_store(tmp_path):
    path = tmp_path / "adaptive.jsonl"
    grid = list(range(2, 198))
    done = adaptive_search(Curve(11, 197, 3, 30), grid, store=PointStore(path, META), progress=False)
    again = Curve(11, 197, 3, 30)
    resumed = adaptive_search(again, grid, store=PointStore(path, META), progress=False)
    assert set(resumed) == set(done)
    assert again.calls == []


def test_store_keeps_the_last_of_a_remeasured_point(tmp_path):
    store = PointStore(tmp_path / "p.jsonl", META)
    for value in (5.0, 4.0):
        store.add(LatencyPoint(tokens=50, median_ms=value, iqr_ms=0.1, samples=5, threads=2, device="cpu"))
    assert store.load()[50].median_ms == 4.0


def test_store_meta_mismatch_raises(tmp_path):
    path = tmp_path / "p.jsonl"
    PointStore(path, META)
    with pytest.raises(CurveError, match="batch_size=4"):
        PointStore(path, {**META, "batch_size": 8})
    path.write_text("not json\n")
    with pytest.raises(CurveError):
        PointStore(path, META)


def test_token_grid():
    assert token_grid(197, 2, 1, min_tokens=2, max_tokens=197) == list(range(2, 198))
    grid = token_grid(197, 2, 50, min_tokens=2, max_tokens=197)
    assert grid == [2, 47, 97, 147, 197]  # counted down from the start, both ends kept
    assert token_grid(2, 197, 50, min_tokens=2, max_tokens=197) == [2, 52, 102, 152, 197]
    assert token_grid(100, 100, 1, min_tokens=2, max_tokens=197) == [100]


@pytest.mark.parametrize(("start", "stop", "stride"), [(198, 2, 1), (197, 1, 1), (197, 2, 0)])
def test_token_grid_errors(start, stop, stride):
    with pytest.raises(GridError, match=r"\[2, 197\]|stride"):
        token_grid(start, stop, stride, min_tokens=2, max_tokens=197)


class Valley(Curve):
    """A linear curve with a dip narrower than the coarse stride: counts in [lo, hi] are faster."""

    def __init__(self, lo: int, hi: int, depth: float):
        super().__init__(seed=11, num_tokens=197, n_steps=0, min_gap=1)
        self.lo, self.hi, self.depth = lo, hi, depth

    def __call__(self, n: int) -> LatencyPoint:
        point = super().__call__(n)
        dip = self.depth if self.lo <= n <= self.hi else 0.0
        return LatencyPoint(tokens=n, median_ms=point.median_ms - dip, iqr_ms=IQR, samples=SAMPLES,
                            threads=1, device="cpu")


def test_adaptive_resolves_a_valley_narrower_than_the_coarse_stride():
    curve = Valley(lo=179, hi=191, depth=12 * SIGMA)  # coarse stride 14: one coarse count falls inside
    grid = token_grid(197, 2, 1, min_tokens=2, max_tokens=197)
    points = adaptive_search(curve, grid, progress=False)
    assert len(curve.calls) <= len(grid) / 3  # two edges close together cost more than two steps apart
    assert located(points, 178) and located(points, 191)  # both edges on adjacent measured counts
    ordered = sorted(points)
    report = detect_steps(ordered, [points[n].median_ms for n in ordered],
                          iqr_ms=[points[n].iqr_ms for n in ordered], samples=[points[n].samples for n in ordered])
    kinds = {(s.tokens, s.kind) for s in report.steps}
    assert any(abs(t - 191) <= 1 and kind == "drop" for t, kind in kinds), kinds
    assert any(abs(t - 178) <= 1 and kind == "rise" for t, kind in kinds), kinds
