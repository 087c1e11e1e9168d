"""Recall by step size and by the trace's noise, precision, and the honesty of the stated detection limits.

For every shuffled trace of the bank (tests/data) and a few seeds, one level shift is injected into the real
samples (every sample above a count scaled, so the trace's noise and drift stay as measured) at a count within
the step policy's reach (the top `--reach` counts), in each size class: 5-8%, 8-15%, 15-20%. The adaptive search
then runs on a replay with its default settings and that reach, as the offline computation does; each run's replay
starts at its own seeded point of the recording's first half (`ReplaySource.seeded`), so that a trace's runs meet
different stretches of the machine instead of one first minute counted once a run. Scored:

- recall per size class and per noise class (the trace's noise a visit, as `pomt record` states it: <= 3%,
  above): the injected step found when a confirmed step of the same sign lies within +-2 tokens;
- precision: confirmed steps within reach that lie within +-2 tokens of the injected step or of a step the dense
  trace itself confirms (`steps_in_trace` at 3%), among all confirmed within reach; the untouched traces count too.
  Its 95% interval (`precision_interval`) is the wider of Wilson's and a bootstrap over the traces: a trace's runs
  share its curve and often its false steps, so counting them as independent draws alone reads it too narrow.
  Counted apart among the false ones: those within one token of a step of the same sign that the dense trace
  confirms at 2-3% (a run reports a step whose paired estimate less one standard error reaches the minimum step,
  3%, and its interval is a point or more wide: the device's step, not an invention). On the AMD batch-1 traces,
  whose curves step at most counts, such a step lies next to 30-60% of the positions within reach, so the count
  says where the false steps come from, not that they are right. Stricter, and printed as a second precision: a
  false step is consistent with the dense trace when the trace confirms (paired, alpha 1e-3) a step of the same
  sign within a token whose size lies inside the run's own 95% interval of it: measured right, only sized near the
  3% line;
- honesty: of the injected steps at least as large as the limit the run stated (`measurement.detection_limit_pct`),
  the share found (issue 29's goal: at least 80%);
- the visits each run spent (against the full grid's), untouched traces apart;
- why each miss was missed (`why_missed`): not shown by the run's own windows, or shown and then its paired second
  look not served by the replay (a short trace runs out of visits where a live run would measure them), not paid
  for by the budget, or not backing it;
- beside the search, what the windows alone could show with as many visits within reach as the run spent
  there, spread evenly (each count's first visits in the trace, drift divided out over the whole trace, the
  untouched trace's smooth trend divided out, `pomt.measurement.windows.scan` at the run's alpha; no paired
  second look): a ceiling that tells "the visits could not show it" from "the search did not confirm it".

No timing: everything replays recorded samples, each run a pure function of its trace and seeds, so the runs go on
`--jobs` processes (one per CPU by default) with the same answer as on one. Usage:
    python benchmarks/detection_limits.py [--seeds 2] [--reach 48] [--traces NAME ...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import os
import zlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats
from tqdm import tqdm

from pomt.formats.trace import Trace, inject_steps, read_trace
from pomt.measurement.drift import corrected_values, relative_noise
from pomt.measurement.robust import SMOOTH_SHARE, lowess
from pomt.measurement.search import BUDGET_SPENT, LatencySearch, SearchResult, SearchScope, SearchSettings
from pomt.measurement.sources import MeasurementRun, ReplaySource, TraceExhausted
from pomt.measurement.steps import Step, steps_in_trace
from pomt.measurement.windows import WindowShift, WindowTest, scan, window_span
from pomt.stats import wilson_interval

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
SIZES = {"5-8%": (0.05, 0.08), "8-15%": (0.08, 0.15), ">=15%": (0.15, 0.20)}
NEAR = 2


def bank() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.csv") if "sequential" not in p.stem)


def search(trace: Trace, reach: int, seed: int, start: Sequence[int]) -> SearchResult:
    """The offline computation's adaptive search on a replay whose clock starts where the seed `start` says
    (`ReplaySource.seeded`)."""
    return LatencySearch(MeasurementRun(ReplaySource.seeded(trace, start)),
                         SearchScope(trace.counts, trace.num_tokens, focus_from=reach), SearchSettings(), seed=seed,
                         progress=False).run()


def confirmed_within(result: SearchResult, reach: int) -> list[tuple[int, str]]:
    return [(s.tokens, s.kind) for s in result.steps if s.tokens >= reach]


def smooth_trend(trace: Trace) -> dict[int, float]:
    """{count: the trace's smooth level (ms)}: LOWESS through its counts' median drift-corrected visits, as the
    priced curve's trend (`pomt.measurement.robust`)."""
    values = corrected_values(list(trace.visits))
    counts = np.array(sorted(values), float)
    medians = np.array([np.median(values[int(n)]) for n in counts])
    visits = np.array([len(values[int(n)]) for n in counts], float)
    trend = lowess(counts, medians, visits, SMOOTH_SHARE * float(np.ptp(counts)))
    return dict(zip(counts.astype(int).tolist(), trend.tolist(), strict=True))


def windows_alone(trace: Trace, trend: dict[int, float], reach: int, visits: int,
                  injected: tuple[int, str, float]) -> bool:
    """Whether the windows alone show the injected step with `visits` visits within reach spread evenly (module
    docstring): a shift of its sign within NEAR of it, significant at the search's alpha."""
    values = corrected_values(list(trace.visits))
    below, _ = window_span(trace.counts, (reach, trace.num_tokens))
    inside = [n for n in sorted(values) if n >= below]
    each = max(1, visits // len(inside))
    flat = {n: [v / trend[n] for v in values[n][:each]] for n in inside}
    settings = SearchSettings()
    found = scan(flat, (reach, trace.num_tokens), relative_noise(flat),
                 WindowTest(settings.step_alpha, settings.min_step), below=below)
    return shows(found.shifts, injected)


def shows(shifts: Sequence[WindowShift], injected: tuple[int, str, float]) -> bool:
    """Whether a window shift of the injected step's sign lies within NEAR of it."""
    where, kind, _ = injected
    return any(abs(s.high - where) <= NEAR and (s.saving_pct > 0) == (kind == "drop") for s in shifts)


def consistent(found: Step, dense: Sequence[Step]) -> bool:
    """Whether the dense trace confirms a step of the same sign within a token of `found` whose size lies
    inside `found`'s own 95% interval: a step the run measured right, only sized near the scoring's 3%."""
    low, high = found.paired_ci_pct or (found.paired_pct, found.paired_pct)
    return any(abs(found.tokens - d.tokens) <= 1 and d.kind == found.kind and low <= d.paired_pct <= high
               for d in dense)


MISSES = {
    "not shown": "the run's own windows did not show it",
    "unserved": "shown; the trace could not serve its paired rounds (a live run would measure them)",
    "budget": "shown; the visit budget was spent before its paired rounds",
    "not backed": "shown; the paired rounds did not back it (or pinned it elsewhere)",
}


def why_missed(result: SearchResult, injected: tuple[int, str, float]) -> str:
    """Why a run missed the injected step (a key of MISSES): whether its own windows showed it (a shift of its sign
    within NEAR), and if they did, what became of the paired second look near it."""
    if result.detection is None or not shows(result.detection.shifts, injected):
        return "not shown"
    near = [c.reason for c in result.candidates if abs(c.high - injected[0]) <= NEAR]
    if any(TraceExhausted.WORDS in reason for reason in near):
        return "unserved"
    if any(BUDGET_SPENT in reason for reason in near):
        return "budget"
    return "not backed"


def print_recall(title: str, found: dict[tuple[str, str], list[bool]]) -> None:
    """One line per size class: found / injected by noise class."""
    print(title)
    for size in SIZES:
        cells = [f"{noisy}: {sum(found[(size, noisy)])}/{len(found[(size, noisy)])}"
                 for noisy in ("noise <= 3%", "noise > 3%") if found[(size, noisy)]]
        print(f"  {size:>6}  " + "   ".join(cells))


@dataclass(frozen=True)
class Outcome:
    """One replay scored: what the scoring in `main` adds up (module docstring)."""

    untouched: bool
    size: str | None
    noisy: str
    hit: bool = False
    alone: bool = False
    why: str | None = None  # a key of MISSES, for a miss
    honest: bool | None = None  # found, for an injected step at or above the stated limit; None below it
    true_pos: int = 0
    false_pos: int = 0
    small_steps: int = 0
    measured_right: int = 0
    lines: tuple[str, ...] = ()  # what --show prints: false steps, then the miss
    spent: str = ""  # for an untouched trace: its visits, limit and noise


@functools.cache
def loaded(name: str) -> tuple[Trace, dict[int, float]]:
    """A bank trace and its smooth trend, read once per process."""
    trace = read_trace(DATA / f"{name}.csv")
    return trace, smooth_trend(trace)


@functools.cache
def dense_steps(name: str) -> tuple[list[int], list[tuple[int, str]], list[Step]]:
    """What the untouched trace itself confirms, read once per process: the counts of its steps of 3% or more,
    (count, kind) of those of 2% or more, and every significant one."""
    visits = list(loaded(name)[0].visits)
    return ([s.tokens for s in steps_in_trace(visits, min_step=0.03)],
            [(s.tokens, s.kind) for s in steps_in_trace(visits, min_step=0.02)],
            steps_in_trace(visits, min_step=0.0))


def replay(name: str, seed: int, size: str | None, reach_below: int) -> Outcome:
    """One run: a step of `size` (none: the trace untouched) injected where the seed says, the search replayed,
    its steps and stated limit scored. A pure function of its arguments and the bank, so runs may go in any order
    and in any process."""
    trace, trend = loaded(name)
    reach = max(trace.counts[0], trace.num_tokens - reach_below)
    noise = relative_noise(corrected_values(list(trace.visits)))
    noisy = "noise > 3%" if noise > 0.03 else "noise <= 3%"
    own, small, significant = dense_steps(name)
    size_index = 0 if size is None else list(SIZES).index(size) + 1
    rng = np.random.default_rng([seed, len(name), size_index])
    injected = None
    if size is not None:
        low, high = SIZES[size]
        where = int(rng.integers(reach + 4, trace.num_tokens - 4))
        factor = 1.0 + float(rng.uniform(low, high))
        if rng.random() < 0.3:
            factor = 1.0 / factor  # a rise
        injected = (where, "drop" if factor > 1 else "rise", 100 * abs(1 - factor))
        trace = inject_steps(trace, {where: factor})
    result = search(trace, reach, seed, [seed, zlib.crc32(name.encode()), size_index])
    found = confirmed_within(result, reach)
    truth = [*own, *([injected[0]] if injected else [])]
    scores = {"true_pos": 0, "false_pos": 0, "small_steps": 0, "measured_right": 0}
    lines = []
    for step in (s for s in result.steps if s.tokens >= reach):
        tokens, kind = step.tokens, step.kind
        ok = any(abs(tokens - t) <= NEAR for t in truth)
        device = not ok and any(abs(tokens - t) <= 1 and kind == k for t, k in small)
        scores["true_pos"] += ok
        scores["false_pos"] += not ok
        scores["small_steps"] += device
        scores["measured_right"] += not ok and consistent(step, significant)
        if not ok:
            lines.append(f"false step: {name} seed {seed} injected {injected}: {kind} at {tokens}"
                         + (" (next to a step of 2-3% in the dense trace)" if device else ""))
    detection = getattr(result, "detection", None)
    limit = detection.limit_pct if detection else None
    limit_text = "-" if limit is None else f"{limit:.1f}%"
    if injected is None:
        return Outcome(True, size, noisy, lines=tuple(lines), **scores,
                       spent=f"{name} seed {seed}: {result.visits}/{result.full_grid_visits} visits, limit "
                             f"{limit_text}, noise {100 * noise:.1f}%"
                             + (f", passes stopped: {detection.stopped}" if detection and detection.stopped else ""))
    hit = any(abs(t - injected[0]) <= NEAR and kind == injected[1] for t, kind in found)
    below, _ = window_span(trace.counts, (reach, trace.num_tokens))
    within = sum(v.tokens >= below for v in result.design)  # the visits the run's windows tested
    if not hit:
        lines.append(f"missed: {name} seed {seed} {injected[1]} of {injected[2]:.1f}% at {injected[0]} "
                     f"(stated limit {limit_text}; found {found})")
    return Outcome(False, size, noisy, hit=hit, alone=windows_alone(trace, trend, reach, within, injected),
                   why=None if hit else why_missed(result, injected),
                   honest=hit if limit is not None and injected[2] >= limit else None, lines=tuple(lines), **scores)


def precision_interval(by_trace: dict[str, tuple[int, int]], confidence: float = 0.95) -> tuple[float, float]:
    """An interval of the precision (`by_trace`: name -> (true, false) confirmed steps): the wider of the Wilson
    interval, which counts every confirmed step as an independent draw, and a bootstrap over the traces, since a
    trace's runs share its curve and often its false steps (a count that misleads one seed misleads the next)."""
    cells = np.array([(t, t + f) for t, f in by_trace.values() if t + f], int)
    if not len(cells):
        return math.nan, math.nan
    low, high = wilson_interval(int(cells[:, 0].sum()), int(cells[:, 1].sum()), confidence)
    if len(cells) >= 2:
        found = scipy_stats.bootstrap((cells[:, 0], cells[:, 1]), lambda t, n, axis: t.sum(axis) / n.sum(axis),
                                      paired=True, confidence_level=confidence, method="percentile",
                                      n_resamples=4000, rng=np.random.default_rng(0))
        low, high = min(low, float(found.confidence_interval.low)), max(high, float(found.confidence_interval.high))
    return low, high


def outcomes(runs: list[tuple[str, int, str | None]], reach_below: int, jobs: int) -> Iterator[Outcome]:
    """`replay` of every run, in order, on `jobs` processes (1: in this one)."""
    if jobs <= 1:
        yield from (replay(name, seed, size, reach_below) for name, seed, size in runs)
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from pool.map(replay, *zip(*runs, strict=True), [reach_below] * len(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--reach", type=int, default=48, help="counts below N a schedule may land on")
    parser.add_argument("--traces", nargs="*", default=None)
    parser.add_argument("--show", action="store_true", help="print every missed injected step and every false step")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="replays run at once, each in its own process (default: one per CPU; nothing is timed, "
                             "so they do not disturb each other's answers)")
    args = parser.parse_args()
    names = args.traces or bank()
    recall: dict[tuple[str, str], list[bool]] = defaultdict(list)
    alone: dict[tuple[str, str], list[bool]] = defaultdict(list)
    honest: list[bool] = []
    missed: dict[tuple[str, str, str], int] = defaultdict(int)
    true_pos = false_pos = small_steps = measured_right = 0
    by_trace: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    spent: list[str] = []
    runs = [(name, seed, size) for name in names for seed in range(args.seeds) for size in [None, *SIZES]]
    for (name, _, _), out in zip(runs, tqdm(outcomes(runs, args.reach, args.jobs), total=len(runs), desc="replays"),
                                 strict=True):
        true_pos, false_pos = true_pos + out.true_pos, false_pos + out.false_pos
        by_trace[name] = (by_trace[name][0] + out.true_pos, by_trace[name][1] + out.false_pos)
        small_steps, measured_right = small_steps + out.small_steps, measured_right + out.measured_right
        for line in out.lines if args.show else ():
            tqdm.write(line)
        if out.untouched:
            spent.append(out.spent)
            continue
        recall[(out.size, out.noisy)].append(out.hit)
        alone[(out.size, out.noisy)].append(out.alone)
        if out.why is not None:
            missed[(out.size, out.noisy, out.why)] += 1
        if out.honest is not None:
            honest.append(out.honest)
    print_recall("\nrecall of one injected step within reach (found / injected)", recall)
    print_recall("the windows alone, the run's visits within reach spread evenly (a ceiling, no paired second look)",
                 alone)
    print("why the search missed (misses by size class, noise <= 3% | noise > 3%)")
    for why, text in MISSES.items():
        cells = [f"{size} {missed[(size, 'noise <= 3%', why)]}|{missed[(size, 'noise > 3%', why)]}" for size in SIZES]
        print(f"  {text}: " + ", ".join(cells))
    total = true_pos + false_pos
    if total:
        low, high = precision_interval(by_trace)
        print(f"precision within reach: {true_pos}/{total} = {true_pos / total:.3f} (95% [{low:.3f}, {high:.3f}]: "
              f"Wilson's or the traces resampled, the wider); of the {false_pos} false, {small_steps} lie within a "
              "token of a step of the same sign the dense trace confirms at 2-3%")
        print(f"  of the {false_pos} false, {measured_right} are consistent with the dense trace: it confirms a step "
              "of the same sign within a token, its size inside the run's own 95% interval; counted true, "
              f"precision would read {(true_pos + measured_right) / total:.3f}")
    else:
        print("precision: no steps")
    print(f"stated limits honest: {sum(honest)}/{len(honest)} injected steps at or above the stated limit found"
          if honest else "stated limits: no injected step reached a stated limit")
    print("untouched traces:")
    for line in spent:
        print("  " + line)


if __name__ == "__main__":
    main()
