"""Which token counts to measure: the full grid, or an adaptive refinement around steps; resumable.

Partial results live in a JSON-lines `PointStore` (a header with the run's settings, then one
`LatencyPoint` per line, fsynced), so a killed search continues where it stopped.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from pomt.errors import CurveError, GridError
from pomt.measure import LatencyPoint
from pomt.steps import IQR_TO_SD, MEDIAN_SE, NOISE_FLOOR, StepReport, detect_steps, low_quartile_sd, trend

STORE_FORMAT = "pomt.points"
STORE_VERSION = 1

Measure = Callable[[int], LatencyPoint]
FLAG = 0.4  # refine an interval whose level shift reaches FLAG * k standard errors
FOLLOW = 0.3  # keep bisecting the half that holds a shift while it reaches FOLLOW * k
JUMP = 3.0  # noise units of one change that keep a neighbouring point out of a level estimate
REPLICATES = 4  # coarse counts measured twice: their spread is the noise between measurements
BETWEEN_MARGIN = 2.0  # between-measurement noise replaces the within-run figure only above this ratio


def token_grid(start: int, stop: int, stride: int, *, min_tokens: int, max_tokens: int) -> list[int]:
    """Counts from `start` towards `stop` every `stride` (both ends included), ascending.

    `min_tokens` is P + 1 (one patch token kept), `max_tokens` is N.
    """
    lo, hi = min(start, stop), max(start, stop)
    if stride < 1:
        raise GridError(f"token grid stride must be at least 1, got {stride}")
    if lo < min_tokens or hi > max_tokens:
        raise GridError(
            f"token grid {lo}..{hi} lies outside the allowed range [{min_tokens}, {max_tokens}] "
            "(at least one patch token kept, at most all N tokens)"
        )
    direction = 1 if stop >= start else -1
    counts = set(range(start, stop + direction, direction * stride))
    counts.add(stop)
    return sorted(counts)


def _jsonable(meta: dict) -> dict:
    return json.loads(json.dumps(meta, sort_keys=True, default=str))


class PointStore:
    """Append-only JSON-lines file of measured points, headed by the settings they were measured with."""

    def __init__(self, path: str | os.PathLike, meta: dict):
        self.path = Path(path)
        self.meta = _jsonable(meta)
        if self.path.exists() and self.path.stat().st_size > 0:
            self._check_header()
            self._drop_partial_tail()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            header = {"format": STORE_FORMAT, "version": STORE_VERSION, "meta": self.meta}
            self._append(json.dumps(header, sort_keys=True))

    def _check_header(self) -> None:
        with self.path.open(encoding="utf-8") as f:
            first = f.readline()
        try:
            header = json.loads(first)
            stored = header["meta"]
            ok = header.get("format") == STORE_FORMAT
        except (json.JSONDecodeError, KeyError, TypeError):
            ok, stored = False, None
        if not ok:
            raise CurveError(f"{self.path} is not a pomt partial-search file; move it away or drop --resume")
        if stored != self.meta:
            keys = sorted(k for k in set(stored) | set(self.meta) if stored.get(k) != self.meta.get(k))
            diffs = ", ".join(f"{k}={stored.get(k)!r} (now {self.meta.get(k)!r})" for k in keys)
            raise CurveError(
                f"{self.path} was measured with other settings: {diffs}; delete it or drop --resume"
            )

    def _drop_partial_tail(self) -> None:
        """Cut a last line that a killed run left half-written, so new lines start clean."""
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        with self.path.open("r+b") as f:
            f.truncate(cut)

    def _append(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def add(self, point: LatencyPoint) -> None:
        """Append one point durably (flushed and fsynced)."""
        row = point.to_row()
        row["clocks"] = point.clocks
        self._append(json.dumps(row, sort_keys=True, default=str))

    def records(self) -> list[LatencyPoint]:
        """Every stored point in the order measured (a re-measured count appears more than once)."""
        lines = self.path.read_text(encoding="utf-8").splitlines()[1:]
        out = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                out.append(LatencyPoint(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as exc:
                if i == len(lines) - 1:
                    break  # truncated by a killed run
                raise CurveError(f"{self.path} line {i + 2} is corrupt ({exc}); delete the file") from exc
        return out

    def load(self) -> dict[int, LatencyPoint]:
        """Latest point per token count."""
        return {p.tokens: p for p in self.records()}


def _record(points: dict[int, LatencyPoint], point: LatencyPoint, store: PointStore | None) -> None:
    points[point.tokens] = point
    if store is not None:
        store.add(point)


def _measure(measure: Measure, n: int) -> LatencyPoint:
    point = measure(n)
    if point.tokens != n:
        raise CurveError(f"measure({n}) returned a point for {point.tokens} tokens")
    return point


def full_search(
    measure: Measure, grid: list[int], *, store: PointStore | None = None, progress: bool = True
) -> dict[int, LatencyPoint]:
    """Measure every grid count not already in the store; returns the grid's points, ascending."""
    points = store.load() if store is not None else {}
    todo = [n for n in sorted(set(grid)) if n not in points]
    for n in tqdm(todo, desc="latency (full grid)", unit="pt", disable=not progress):
        _record(points, _measure(measure, n), store)
    return {n: points[n] for n in sorted(set(grid))}


def adaptive_search(
    measure: Measure,
    grid: list[int],
    *,
    coarse_stride: int | None = None,
    k: float = 5.0,
    store: PointStore | None = None,
    progress: bool = True,
    max_evals: int | None = None,
) -> dict[int, LatencyPoint]:
    """Measure a coarse subset of the grid, then bisect (on the grid) every interval whose latency change
    departs from the local trend, until each step lies within one grid interval; re-measure spikes once.

    An interval is refined when the level shift across it (up to two measured points each side, the
    robust trend of `pomt.steps.trend` taken out) reaches FLAG * k standard errors of the measured noise.
    After a bisection the half whose ends lie on different levels is followed while its shift reaches
    FOLLOW * k, the other half too when it reaches FLAG * k, so a step is tracked down to adjacent grid
    points. A point whose two neighbouring changes jump and cancel is re-measured once before anything
    is bisected around it. The coarse stride defaults to sqrt(grid size); steps closer together than
    about two coarse strides can read as a slope at first and cost extra evaluations. Counts already in
    the store are not measured again. Returns every measured point, ascending.
    """
    grid = sorted(set(grid))
    if not grid:
        raise GridError("the token grid is empty")
    if coarse_stride is not None and coarse_stride < 1:
        raise GridError(f"coarse stride must be at least 1, got {coarse_stride}")
    stride = coarse_stride or max(2, round(math.sqrt(len(grid))))
    position = {n: i for i, n in enumerate(grid)}
    points = store.load() if store is not None else {}
    remeasured = _remeasured(store)
    evals = 0
    bar = tqdm(desc="latency (adaptive)", unit="pt", disable=not progress)

    def budget_left() -> bool:
        return max_evals is None or evals < max_evals

    def take(n: int, again: bool = False) -> None:
        nonlocal evals
        if (n in points and not again) or not budget_left():
            return
        _record(points, _measure(measure, n), store)
        evals += 1
        bar.update(1)

    coarse = sorted(set(grid[::stride]) | {grid[0], grid[-1]})
    for n in coarse:
        take(n)
    first = {n: points[n].median_ms for n in _replicate_counts(coarse)}
    for n in first:
        if n not in remeasured:
            remeasured.add(n)
            take(n, again=True)
    between = _between_noise(first, points, store)

    pending: set[tuple[int, int]] = set()
    while budget_left():
        snap = _Snapshot(points, [n for n in grid if n in points], between)
        if len(snap.measured) < 3:
            break
        for n in snap.spike_like(k / 2.0):
            if n not in remeasured:
                remeasured.add(n)
                take(n, again=True)
        if not pending:
            snap = _Snapshot(points, [n for n in grid if n in points], between)
            pending = {iv for iv in snap.flagged(FLAG * k) if position[iv[1]] - position[iv[0]] > 1}
            if not pending:
                break
        work, pending = sorted(pending), set()
        for lo, hi in work:
            if position[hi] - position[lo] <= 1:
                continue
            mid = grid[(position[lo] + position[hi]) // 2]
            take(mid)
            if mid not in points:
                break
            snap = _Snapshot(points, [n for n in grid if n in points], between)
            halves = [(lo, mid), (mid, hi)]
            best = 1 if snap.nearer_lower(lo, mid, hi) else 0
            if snap.z(halves[best]) >= FOLLOW * k:
                pending.add(halves[best])
            if snap.z(halves[1 - best]) >= FLAG * k:
                pending.add(halves[1 - best])
    _localise_reported_steps(points, grid, position, take, budget_left, k, remeasured)
    bar.close()
    left = None if max_evals is None else max_evals - evals
    return remeasure_spikes(
        points, lambda n: _measure(measure, n), k=k, rounds=1, store=store, skip=remeasured, max_evals=left
    )


def _localise_reported_steps(points, grid, position, take, budget_left, k: float, remeasured: set) -> None:
    """Bisect until every step that `detect_steps` reports has no unmeasured grid count inside it.

    The refinement above judges intervals locally; this pass makes the search agree with the detector
    the caller reports from, so no reported step is left spanning a coarse interval. A "spike" that
    survived re-measurement is a real feature narrower than the coarse stride (a valley or ridge a few
    tokens wide): both intervals beside it are bisected until it resolves into steps.
    """
    while budget_left():
        ordered = sorted(points)
        report = steps_of_points(points.values(), k)
        spans = [(step.tokens, step.upper_tokens) for step in report.steps]
        for n in report.spikes:
            if n in remeasured and 0 < ordered.index(n) < len(ordered) - 1:
                i = ordered.index(n)
                spans += [(ordered[i - 1], n), (n, ordered[i + 1])]
        gaps = []
        for low, high in spans:
            lo, hi = position.get(low), position.get(high)
            if lo is None or hi is None:
                continue
            inside = [grid[i] for i in range(lo + 1, hi) if grid[i] not in points]
            if inside:
                gaps.append(inside[len(inside) // 2])
        if not gaps:
            return
        for n in sorted(set(gaps)):
            take(n)


class _Snapshot:
    """The measured curve at one moment of an adaptive search: detrended levels and their noise."""

    def __init__(self, points: dict[int, LatencyPoint], measured: list[int], between: float = 0.0):
        self.measured = measured
        self.index = {n: i for i, n in enumerate(measured)}
        if len(measured) < 3:
            return
        t = np.array(measured, dtype=float)
        y = np.array([points[n].median_ms for n in measured])
        floor = _iqr_noise([points[n] for n in measured])
        if floor <= 0:  # no measured spread: a lower-quartile spread of the changes (robust to steps)
            r = np.diff(y) - np.median(np.diff(y) / np.diff(t)) * np.diff(t)
            floor = low_quartile_sd(r) / math.sqrt(2)
        if between > BETWEEN_MARGIN * floor:  # four pairs estimate it roughly: only a clear excess counts
            floor = between
        self.sigma = max(floor, NOISE_FLOOR * float(np.median(np.abs(y))), 1e-12)
        self.e = y - trend(t, y, self.sigma)

    def _below_above(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Levels of the point at `lo` and the one before it, and of `hi` and the one after it; the
        outer point only when no large jump lies between (a neighbouring step must not leak in)."""
        i, j = self.index[lo], self.index[hi]
        jump = np.abs(np.diff(self.e)) >= JUMP * self.sigma * math.sqrt(2.0)
        below = [i - 1, i] if i >= 1 and not jump[i - 1] else [i]
        above = [j, j + 1] if j + 1 < len(self.e) and not jump[j] else [j]
        return self.e[below], self.e[above]

    def z(self, interval: tuple[int, int]) -> float:
        """Level shift across the interval (two points each side) over its standard error."""
        below, above = self._below_above(*interval)
        h = above.mean() - below.mean()
        return float(abs(h) / (self.sigma * math.sqrt(1 / below.size + 1 / above.size)))

    def flagged(self, threshold: float) -> list[tuple[int, int]]:
        pairs = zip(self.measured, self.measured[1:], strict=False)
        return [iv for iv in pairs if self.z(iv) >= threshold]

    def nearer_lower(self, lo: int, mid: int, hi: int) -> bool:
        """Whether the level at `mid` is closer to the level below `lo` than to the one above `hi`."""
        below, above = self._below_above(lo, hi)
        level = self.e[self.index[mid]]
        return abs(level - below.mean()) < abs(level - above.mean())

    def spike_like(self, threshold: float) -> list[int]:
        """Interior counts whose two neighbouring changes are large, opposite, and cancel."""
        r = np.diff(self.e) / (self.sigma * math.sqrt(2.0))
        return [
            self.measured[j]
            for j in range(1, len(self.measured) - 1)
            if r[j - 1] * r[j] < 0
            and min(abs(r[j - 1]), abs(r[j])) >= threshold
            and abs(r[j - 1] + r[j]) < 0.5 * max(abs(r[j - 1]), abs(r[j]))
        ]


def steps_of_points(points: Iterable[LatencyPoint], k: float = 5.0) -> StepReport:
    """`detect_steps` on measured points: medians, with their IQR and sample counts as the noise."""
    ordered = sorted(points, key=lambda p: p.tokens)
    return detect_steps(
        [p.tokens for p in ordered],
        [p.median_ms for p in ordered],
        k=k,
        iqr_ms=[p.iqr_ms for p in ordered],
        samples=[p.samples for p in ordered],
    )


def _replicate_counts(coarse: list[int]) -> list[int]:
    """Interior coarse counts, evenly spread, that are measured a second time."""
    interior = coarse[1:-1] or coarse
    step = max(1, len(interior) // REPLICATES)
    return interior[step // 2 :: step][:REPLICATES]


def _between_noise(first: dict[int, float], points: dict[int, LatencyPoint], store: PointStore | None) -> float:
    """Noise of one measured median between measurements (drift, contention), from repeated counts.

    Within-run spread (IQR) misses what changes between runs on a shared machine; two measurements of
    the same count a few seconds apart show it. On resume the pairs come from the store's history.
    """
    pairs = [(value, points[n].median_ms) for n, value in first.items() if n in points]
    if store is not None:
        history: dict[int, list[float]] = {}
        for point in store.records():
            history.setdefault(point.tokens, []).append(point.median_ms)
        pairs = [(values[0], values[1]) for n, values in history.items() if n in first and len(values) >= 2]
    differences = np.array([a - b for a, b in pairs], dtype=float)
    return float(np.sqrt(np.mean(differences**2) / 2.0)) if differences.size else 0.0


def _iqr_noise(points: list[LatencyPoint]) -> float:
    """Noise of a point's median from its measured IQR and sample count (median over points)."""
    se = [p.iqr_ms / IQR_TO_SD * MEDIAN_SE / math.sqrt(max(p.samples, 1)) for p in points]
    return float(np.median(se)) if se else 0.0


def _remeasured(store: PointStore | None) -> set[int]:
    """Counts the store already holds more than once (re-measured in an earlier run)."""
    if store is None:
        return set()
    seen: set[int] = set()
    twice: set[int] = set()
    for p in store.records():
        (twice if p.tokens in seen else seen).add(p.tokens)
    return twice


def remeasure_spikes(
    points: dict[int, LatencyPoint],
    measure: Measure,
    *,
    k: float = 5.0,
    rounds: int = 2,
    store: PointStore | None = None,
    skip: Iterable[int] = (),
    max_evals: int | None = None,
) -> dict[int, LatencyPoint]:
    """Re-measure the counts `detect_steps` calls spikes (the new value replaces the old), up to `rounds`
    times; counts in `skip` are left as they are. Returns the updated points."""
    points = dict(points)
    done = set(skip)
    evals = 0
    for _ in range(rounds):
        report = steps_of_points(points.values(), k)
        spikes = [n for n in report.spikes if n not in done]
        if not spikes:
            break
        for n in spikes:
            if max_evals is not None and evals >= max_evals:
                return points
            _record(points, _measure(measure, n), store)
            evals += 1
    return dict(sorted(points.items()))
