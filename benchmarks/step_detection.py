"""Step detection on the curve bank: recall and precision of the adaptive search, and what it costs.

For every recorded trace in tests/data (shuffled passes; the sequential demonstration trace is left out) and
a few seeds, known steps are injected into the real trace (every sample above a count scaled by +-6..12%,
so real noise and drift stay as measured), then the adaptive search runs on a replay of it with its
default settings, its clock started at a seeded point of the recording's first half (`ReplaySource.seeded`).
Ground truth is the steps the dense trace itself confirms by paired visits within passes
(`pomt.measurement.steps.steps_in_trace` on the recorded trace) and the injected ones. Scoring, for steps of at
least 5%:
recall = truth steps with a confirmed step within +-2 tokens; precision = confirmed steps of 5% or more
lying within +-2 tokens of a truth step or of one the dense trace confirms at 3% or more. The recall against
`steps_in_trace` of the injected trace (the truth before 2026-11-23) is printed too: injecting moves the
trace's trend, and at the low counts, where the curve bends, edges of 4-5% beyond the old trend then read
5% beyond the new one (deit_tiny bs4: 4 -> 6, 6 -> 8, 16 -> 18 in two of three seeds), steps of neither the
device nor the injection. Evaluations are visits against the full grid's (passes x counts). It also counts
the candidates that paired rounds rejected across which the saved curve shows a shift of the minimum step or
more outside the paired interval of that ratio (issue 9's "no saved curve shows a level shift that its own
paired confirmation rejected"). For each truth step missed it names what became of the most significant
candidate near or around it (not examined because the budget or the trace ran out, rejected and why, screened
by its coarse rounds) or that none was flagged, and where the visits went (coarse scan, refining, paired rounds
by their verdict). No timing: everything replays recorded samples.

First it prints, per trace, how a round of two neighbouring counts scatters when the recording visited them back
to back, as a live search's rounds are, and apart in one pass, as a replay serves every other pair: rounds from
visits apart scatter more (drift divided out; on the two aligned AMD traces, whose 407 back-to-back rounds
measure it best, 1.66% against 2.29% for deit_tiny and 1.57% against 1.92% for deit_small; 2.2% against 6.2% on
the H100), so on a trace not recorded with `pomt record --chain` the bank under-reads recall of steps off the
aligned edges, every injected step among them. The chained traces (2026-11-24, a noisier day) serve any
neighbouring pair back to back: 2.3-2.7% against 2.8-3.2% apart.

`--reach K` runs the search as the offline computation does for a policy that removes at most K tokens (its
coarse scan pairs the aligned edges within reach only, the candidates within reach are examined first) and prints
the recall of the truth steps within reach too: the steps a schedule can land below.

`--oracle` replaces detection by knowledge: after the same coarse scan and aligned-edge verdicts, it
measures each truth step's two counts (one pass) and confirms it directly, the largest first, while the budget
lasts. Its recall is a ceiling on what any search with this confirmation rule reaches on this bank at that
budget: what it misses, paired rounds did not confirm (or the trace ran out of visits for them).

Goals (issue 9): recall >= 0.9 and precision >= 0.9 with <= 1/5 of the full grid's evaluations.
Usage: python benchmarks/step_detection.py [--seeds 3] [--inject 3] [--budget 0.2] [--align 8] [--oracle]
       [--reach K] [--traces NAME ...]
"""

from __future__ import annotations

import argparse
import math
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import median_abs_deviation

from pomt.formats.trace import Trace, inject_steps, read_trace
from pomt.measurement.confirmation import Confirmation, confirmed_steps, rejected
from pomt.measurement.design import design_rounds
from pomt.measurement.drift import corrected_values, drift_profile, relative_noise
from pomt.measurement.search import LatencySearch, SearchResult, SearchScope, SearchSettings
from pomt.measurement.sources import MeasurementRun, ReplaySource, TraceExhausted
from pomt.measurement.steps import Step, steps_in_trace

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
BIG, LOOSE, TOLERANCE = 0.05, 0.03, 2


def near(step: Step | Known, others: list[Step]) -> bool:
    return any(abs(step.tokens - o.tokens) <= TOLERANCE or abs(step.upper_tokens - o.upper_tokens) <= TOLERANCE
               for o in others)


@dataclass(frozen=True)
class Known:
    """An injected step: every sample above `tokens` scaled (`pomt.formats.trace.inject_steps`)."""

    tokens: int
    upper_tokens: int
    paired_pct: float


def known_steps(planted: dict[int, float]) -> list[Known]:
    return [Known(k, k + 1, 100.0 * (1.0 - 1.0 / f)) for k, f in planted.items()]


def contradicted(candidate: Confirmation, levels: dict[int, float], min_step: float) -> bool:
    """The saved curve shows a shift of at least `min_step` across a rejected candidate, and its ratio
    L(low) / L(high) lies outside the interval its paired rounds measured for that ratio. Both sides are
    measured ratios: the verdict's test subtracts the trend fitted when it was judged, which moves as
    later counts arrive, so a saved level over the final trend would compare two different trends."""
    saved = levels[candidate.low] / levels[candidate.high]
    low, high = candidate.effect.ci
    return abs(saved - 1.0) >= min_step and not low <= saved <= high


def injections(trace: Trace, count: int, rng: np.random.Generator, avoid: list[Step]) -> dict[int, float]:
    """Up to `count` level shifts of 6-12% (either sign) at counts at least 8 tokens from each other and
    from the trace's own steps, away from the ends of the grid (fewer where the trace leaves no room)."""
    counts = trace.counts[8:-8]
    taken = [s.tokens for s in avoid]
    chosen: dict[int, float] = {}
    for k in rng.permutation(counts):
        if len(chosen) == count:
            break
        if all(abs(int(k) - t) >= 8 for t in [*taken, *chosen]):
            chosen[int(k)] = float(1 + rng.choice([-1, 1]) * rng.uniform(0.06, 0.12))
    return chosen


def why_missed(step: Step, candidates: list[Confirmation]) -> str:
    """Why a truth step has no confirmed step near it: the verdict on the most significant candidate near or
    around it (`not examined` split by whether the budget or the trace ran out), or that none was flagged."""
    around = [c for c in candidates if abs(c.low - step.tokens) <= TOLERANCE or abs(c.high - step.upper_tokens)
              <= TOLERANCE or c.low <= step.tokens < step.upper_tokens <= c.high]
    if not around:
        return "never a candidate"
    verdict = max(around, key=lambda c: c.candidate_z)
    if verdict.screened:
        return "screened by its coarse rounds"
    if verdict.reason.startswith("not examined"):
        return "not examined: " + ("budget spent" if "budget" in verdict.reason else "trace ran out")
    return "rejected: " + verdict.reason.split(" (")[0]


def spending(search: LatencySearch, truth: list[Step]) -> Counter[str]:
    """Where a run's visits went: its coarse passes, the passes that refined candidates, and the paired rounds
    it added to the design's, by the verdict they led to."""
    spent: Counter[str] = Counter()
    for visit in search.measurer.design:
        spent["coarse scan" if visit.pass_index <= search.settings.coarse_passes else "refining"] += 1
    for pair, rounds in search.judge.rounds.items():
        added = 2 * max(0, len(rounds) - len(design_rounds(search.measurer.design, *pair)))
        verdict = search.judge.judged.get(pair)
        if verdict is not None and verdict.accepted:
            on_truth = near(Known(*pair, 0.0), truth)
            spent["rounds confirming a truth step" if on_truth else "rounds confirming another step"] += added
        else:
            spent["rounds rejecting or cut short"] += added
    return spent


def pairing_noise(trace: Trace) -> dict[bool, tuple[float, int]]:
    """How much a round's log ratio of two neighbouring grid counts scatters (robust SD, and how many rounds)
    when the recording visited them back to back (True) and apart in the same pass (False), each visit's drift
    divided out (`drift_profile`), each pair's median taken out: what a replay's rounds carry."""
    visits = list(trace.visits)
    _, drift_log = drift_profile(visits)
    where = {(v.pass_index, v.tokens): i for i, v in reversed(list(enumerate(visits)))}  # first visit in a pass
    residuals: dict[bool, list[float]] = {True: [], False: []}
    for low, high in zip(trace.counts, trace.counts[1:], strict=False):
        rounds = []
        for p in sorted({v.pass_index for v in visits}):
            i, j = where.get((p, low)), where.get((p, high))
            if i is not None and j is not None:
                ratio = math.log(visits[i].median_ms / visits[j].median_ms) - drift_log[i] + drift_log[j]
                rounds.append((abs(i - j) == 1, ratio))
        if len(rounds) >= 4:
            middle = float(np.median([r for _, r in rounds]))
            for adjacent, r in rounds:
                residuals[adjacent].append(r - middle)
    return {k: (float(median_abs_deviation(r, scale="normal")) if len(r) >= 10 else math.nan, len(r))
            for k, r in residuals.items()}


def oracle(search: LatencySearch, truth: list[Step]) -> SearchResult:
    """The search's coarse scan and aligned-edge verdicts, then each truth step not yet matched by a confirmed
    one, largest first: its counts measured in one pass, then confirmed (see the module docstring)."""
    s, m, judged = search.settings, search.measurer, search.judge.judged
    m.reps = m.measuring.source.preferred_reps
    m.measure_units(search.coarse, s.coarse_passes)
    search.judge_anchors()
    for step in sorted(truth, key=lambda t: -abs(t.paired_pct)):
        confirmed = confirmed_steps(search.curve(), list(judged.values()))
        if near(step, confirmed) or m.left() < 2 * s.confirm_rounds + 3:
            continue
        pair = (step.tokens, step.upper_tokens)
        try:
            unmeasured = [n for n in pair if n not in {p.tokens for p in search.curve()}]
            if unmeasured:
                m.measure_passes(unmeasured, 1)
            judged[pair] = search.confirm(*pair, z=float("inf"))
        except TraceExhausted as exc:
            judged[pair] = rejected(*pair, f"not examined: {exc}", float("inf"))
    points = search.curve()
    verdicts = list(judged.values())
    return SearchResult(points=points, steps=confirmed_steps(points, verdicts), candidates=verdicts, drift=None,
                        noise=relative_noise(corrected_values(m.visits())), reps=m.reps, visits=m.measuring.visits,
                        measured=m.measuring.measured, full_grid_visits=search.full_grid_visits,
                        budget_visits=search.budget, budget_spent=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--inject", type=int, default=3, help="steps injected per run")
    parser.add_argument("--budget", type=float, default=SearchSettings.budget,
                        help="the search's visit budget, a fraction of the full grid's (to see recall against cost)")
    parser.add_argument("--align", type=int, default=SearchSettings.align,
                        help="the search's anchor alignment (0: a plain strided coarse scan)")
    parser.add_argument("--oracle", action="store_true",
                        help="confirm the truth steps directly instead of searching for them (a ceiling)")
    parser.add_argument("--reach", type=int, default=None,
                        help="the policy's most tokens removed: the search examines candidates within it first "
                             "(`focus_from`, as the offline computation does) and recall within it is printed too")
    parser.add_argument("--traces", nargs="*", default=None, help="trace names in tests/data (default: all shuffled)")
    args = parser.parse_args()
    names = args.traces or sorted(p.stem for p in DATA.glob("*_shuffled.csv"))
    totals = {"truth": 0, "hit": 0, "found": 0, "right": 0, "injected": 0, "injected_hit": 0, "rejected": 0,
              "shown": 0, "previous": 0, "previous_hit": 0,
              "within": 0, "within_hit": 0}
    ratios = []
    reasons: Counter[str] = Counter()
    spent: Counter[str] = Counter()
    print("replay pairing: how a round of two neighbouring counts scatters when the recording visited them back "
          "to back (as a live search does) and apart in one pass (drift divided out)")
    for name in names:
        noise = pairing_noise(read_trace(DATA / f"{name}.csv"))
        print(f"  {name:36s} back to back {100 * noise[True][0]:5.2f}% ({noise[True][1]:4d} rounds)   apart "
              f"{100 * noise[False][0]:5.2f}% ({noise[False][1]:4d} rounds)")
    print()
    print(f"{'trace':34s} {'seed':>4s} {'visits':>12s} {'ratio':>6s} {'truth':>5s} {'hit':>4s} {'found':>5s} "
          f"{'right':>5s}  missed / wrong")
    for name in names:
        base = read_trace(DATA / f"{name}.csv")
        own = steps_in_trace(base.visits, min_step=BIG)
        own_loose = steps_in_trace(base.visits, min_step=LOOSE)
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            planted = injections(base, args.inject, rng, own)
            trace = inject_steps(base, planted)
            truth = [*own, *known_steps(planted)]
            loose = [*own_loose, *known_steps(planted)]
            previous = steps_in_trace(trace.visits, min_step=BIG)
            source = ReplaySource.seeded(trace, [seed, zlib.crc32(name.encode())])
            settings = SearchSettings(budget=args.budget, align=args.align)
            reach = None if args.reach is None else trace.num_tokens - args.reach
            search = LatencySearch(MeasurementRun(source),
                                   SearchScope(trace.counts, trace.num_tokens, focus_from=reach), settings, seed=seed,
                                   progress=False)
            result = oracle(search, truth) if args.oracle else search.run()
            spent += spending(search, truth)
            tested = [c for c in result.rejected if c.effect is not None]
            levels = {p.tokens: p.latency_ms for p in result.points}
            shown = [c for c in tested if contradicted(c, levels, settings.min_step)]
            totals["rejected"] += len(tested)
            totals["shown"] += len(shown)
            big = [s for s in result.steps if abs(s.paired_pct) >= 100 * BIG]
            hit = [t for t in truth if near(t, result.steps)]
            totals["previous"] += len(previous)
            totals["previous_hit"] += sum(near(t, result.steps) for t in previous)
            right = [s for s in big if near(s, loose)]
            if reach is not None:
                within = [t for t in truth if t.tokens >= reach]
                totals["within"] += len(within)
                totals["within_hit"] += sum(t in hit for t in within)
            totals["truth"] += len(truth)
            totals["hit"] += len(hit)
            totals["found"] += len(big)
            totals["right"] += len(right)
            ratios.append(result.evaluation_ratio)
            totals["injected"] += len(planted)
            totals["injected_hit"] += sum(any(abs(s.tokens - k) <= TOLERANCE for s in result.steps) for k in planted)
            missed = [f"{t.upper_tokens}->{t.tokens}" for t in truth if t not in hit]
            for t in truth:
                if t not in hit:
                    reasons[why_missed(t, result.candidates)] += 1
            wrong = [f"{s.upper_tokens}->{s.tokens}" for s in big if s not in right]
            print(f"{name:34s} {seed:>4d} {result.visits:>5d}/{result.full_grid_visits:<6d} "
                  f"{result.evaluation_ratio:6.3f} {len(truth):>5d} {len(hit):>4d} {len(big):>5d} {len(right):>5d}  "
                  f"{' '.join(missed) or '-'} / {' '.join(wrong) or '-'}")
    recall = totals["hit"] / max(1, totals["truth"])
    precision = totals["right"] / max(1, totals["found"])
    print(f"\nrecall {recall:.3f} ({totals['hit']}/{totals['truth']}), precision {precision:.3f} "
          f"({totals['right']}/{totals['found']}), evaluations {np.mean(ratios):.3f} of the full grid's on average, "
          f"{max(ratios):.3f} at most")
    print(f"recall against steps_in_trace of the injected trace (the previous truth): "
          f"{totals['previous_hit'] / max(1, totals['previous']):.3f} ({totals['previous_hit']}/{totals['previous']})")
    if args.reach is not None:
        print(f"recall within the policy's reach ({args.reach} tokens below N): "
              f"{totals['within_hit'] / max(1, totals['within']):.3f} ({totals['within_hit']}/{totals['within']})")
    found_share = totals["injected_hit"] / max(1, totals["injected"])
    print(f"injected steps (6-12%) found within +-{TOLERANCE}: {totals['injected_hit']}/{totals['injected']} "
          f"({found_share:.3f}); the rest of the truth is the traces' own steps")
    print(f"saved curves: {totals['shown']} of {totals['rejected']} candidates that paired rounds rejected show a "
          f"shift of the minimum step or more that lies outside the paired interval")
    print("visits went to: " + ", ".join(f"{what} {count / max(1, spent.total()):.1%}"
                                         for what, count in spent.most_common()))
    print("truth steps missed, by what became of the candidate nearest them: " + ", ".join(
        f"{reason} {count}" for reason, count in reasons.most_common()))
    verdict = {True: "met", False: "NOT met"}
    print(f"goals: recall >= 0.9 {verdict[recall >= 0.9]}; precision >= 0.9 {verdict[precision >= 0.9]}; "
          f"<= 1/5 of the full grid {verdict[max(ratios) <= 0.2]} (budget {args.budget:g}, align {args.align}"
          f"{', oracle' if args.oracle else ''})")


if __name__ == "__main__":
    main()
