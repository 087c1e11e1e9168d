"""The speed-accuracy frontier of schedules across blocks and reducers, searched on a measured-accuracy budget.

Latency is predicted (`LatencyModel`); accuracy is measured on the search split, every candidate counting against
`max_evals`, cached or not, so a resumed search decides alike. A search may start from `known` schedules, measured on
these images by searches for other latency curves: held from the start and priced here, they count against `max_evals`
too, but such a search always keeps `WARM_FRESH` of `max_evals` fresh measurements for proposals of its own (spent on
the reducers whose proposals promise a gain over the fastest schedule held within the goal: the others' known
schedules stand for them), and the unpruned model and uniform families it holds cost nothing. In order: the unpruned
model and the uniform families; per reducer, single-block probes that fit an additive stand-in for the drop
(`pomt.frontier.surrogate`), whose dynamic programme proposes the fastest schedules; the rest of the budget split
between reducers by promise (`bisection_shares`), half bisecting the proposals, half refitting the stand-in (`refine`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

from pomt.checks import check_method
from pomt.frontier.candidates import FAMILY_POINTS, NONE, REDUCERS, Candidate, uniform_families
from pomt.frontier.choice import Evaluated, FrontierResult, drop_within, pareto_front
from pomt.frontier.latency import LatencyModel
from pomt.frontier.surrogate import (
    BlockProgramme,
    DropSurrogate,
    fit_surrogate,
    fit_to_schedules,
    judged_drop,
    landing_counts,
    probe_candidates,
    refit_shares,
)
from pomt.stats import CONFIDENCE, Proportion

Oracle = Callable[[Sequence[Candidate]], Mapping[Candidate, Proportion]]
Promise = Callable[[Evaluated, Evaluated], float]  # a schedule's chance to be certified, given the unpruned one
MAX_EVALS = 80  # measured accuracies a search may spend by default
MIN_BISECTION = 3  # evaluations a reducer's bisection gets at least (as far as its proposals go)
NEAR_MISS = 2  # times the goal: how far past it by the refitted stand-in a proposal may still be measured
WARM_FRESH = 0.1  # of max_evals: the fresh measurements a search holding known schedules has for its own proposals
AIM = 0.5  # the chance to be certified a schedule needs to count as within the goal, where the search has a promise


@dataclass(frozen=True)
class FrontierSettings:
    """How hard and where to search; `steps` are the confirmed steps' fast-side token counts (`Step.fast_tokens`)."""

    reducers: tuple[str, ...] = REDUCERS
    max_evals: int = MAX_EVALS
    max_accuracy_drop: float = 1.0  # points
    confidence: float = CONFIDENCE  # of the drop (`pomt.frontier.choice.drop_within`)
    latency_budget_ms: float | None = None
    steps: tuple[int, ...] = ()
    family_points: int = FAMILY_POINTS
    probe_blocks: int = 4
    probe_shares: tuple[float, ...] = (0.25, 0.5)
    max_share: float = 0.75
    grid: int = 24
    buckets_per_drop: int = 16  # the programme's resolution: stand-in drop buckets per max_accuracy_drop
    drop_span: int = 6  # stand-in drops up to this many times max_accuracy_drop are searched closely
    stand_in_blocks: int = 4  # the stand-in judges drops so that this many blocks' doubt adds up to one schedule's

    def __post_init__(self) -> None:
        for method in self.reducers:
            check_method(method, REDUCERS)

    @property
    def closely_searched(self) -> float:
        """The largest drop (a fraction) the search tells apart: `drop_span` times the goal; beyond it a schedule is
        fitted as that much, no larger share is probed, and its accuracy may stop early."""
        return self.drop_span * self.max_accuracy_drop / 100

    @property
    def stand_in_confidence(self) -> float:
        """The confidence the stand-in and its refit judge drops at: z / sqrt(`stand_in_blocks`), so that k blocks'
        one-sided margins add up to a k-block schedule's (which grows as sqrt of the images changed)."""
        z = NormalDist().inv_cdf(self.confidence)
        return NormalDist().cdf(z / math.sqrt(self.stand_in_blocks))


@dataclass(frozen=True)
class ReducerPlan:
    """One reducer's proposals (slowest first), the fastest within the goal's latency, and the probes' stand-in."""

    proposals: list[Candidate]
    promised_ms: float
    surrogate: DropSurrogate


class FrontierSearch:
    """One search: the latency model, the accuracy oracle, the settings, the `known` schedules it starts from, the
    `promise` of certification its finalists face (None: none), and what it holds so far."""

    def __init__(self, latency: LatencyModel, oracle: Oracle, settings: FrontierSettings = FrontierSettings(),
                 known: Mapping[Candidate, Proportion] | None = None, promise: Promise | None = None) -> None:
        self.latency, self.oracle, self.settings, self.promise = latency, oracle, settings, promise
        self.known = dict(known or {})
        self.records: dict[Candidate, Evaluated] = known_records(latency, settings, self.known)
        self.asked = self.forced = 0  # fresh measurements, and those of them forced (unpruned, uniform families)
        self.notes: list[str] = []

    @property
    def left(self) -> int:
        """What the budget still allows: `max_evals` less what was asked, or with known schedules `warm_left`."""
        if not self.known:
            return max(0, self.settings.max_evals - self.asked)
        return warm_left(self.settings.max_evals, len(self.records), self.asked - self.forced)

    def measure(self, labelled: Mapping[Candidate, str], force: bool = False) -> None:
        """Measure the candidates not held yet in one oracle call, within the budget unless `force`."""
        new = [c for c in labelled if c not in self.records][: None if force else self.left]
        if not new:
            return
        results = self.oracle(new)
        self.asked += len(new)
        self.forced += len(new) if force else 0
        self.records.update({c: Evaluated(c, labelled[c], self.latency.predict(c), results[c]) for c in new})

    def run(self) -> FrontierResult:
        """Search within the budget and return every schedule evaluated, with the frontier."""
        s = self.settings
        self.measure({NONE: "unpruned"}, force=True)
        self.measure(family_labels(self.latency, self.settings), force=True)
        if self.asked > s.max_evals and not self.left:
            self.notes.append(f"the uniform families alone took {self.asked} evaluations (max_evals "
                              f"{s.max_evals}): no per-block search")
        plans = {m: self.plan_reducer(m, self.left // (len(s.reducers) - i)) for i, m in enumerate(s.reducers)}
        shares = self.bisection_shares({m: p for m, p in plans.items() if p is not None})
        spare = 0
        for method, share in shares.items():
            first = share // 2 if share >= 2 * MIN_BISECTION else share
            self.bisect(plans[method].proposals, f"search-{method}", first)
            spare += self.refine(method, plans[method], share - first)
        for method in shares:  # what a refit left unspent, to the most promising reducer that can use it
            if shares[method] or not self.known:
                spare = self.refine(method, plans[method], spare)
        if self.known:
            self.notes.append(f"started from {len(self.known)} schedules other searches measured on these images; "
                              f"{self.asked} measured fresh")
        evaluated = tuple(self.records.values())
        return FrontierResult(self.records[NONE], evaluated, tuple(pareto_front(evaluated)), self.asked,
                              tuple(self.notes))

    def plan_reducer(self, method: str, budget: int) -> ReducerPlan | None:
        """Probes within half of `budget`, their stand-in and proposals (None: too few for probes at two blocks)."""
        s, lat = self.settings, self.latency
        blocks = self.probe_blocks(method, budget)
        if blocks < 2:
            if budget:
                self.notes.append(f"{method}: {budget} evaluations left, too few for a per-block search")
            return None
        probes = probe_candidates(method, lat.num_tokens, lat.prefix_tokens, lat.depth, blocks, s.probe_shares)
        self.measure_probes(method, probes)
        measured = {probes[c]: self.records[c].search for c in probes if c in self.records}
        surrogate = fit_surrogate(measured, self.records[NONE].search, s.stand_in_confidence)
        proposals, within = self.propose(method, surrogate)
        return ReducerPlan(proposals, min((lat.predict(c) for c in within), default=lat.baseline), surrogate)

    def probe_blocks(self, method: str, budget: int) -> int:
        """The blocks to probe at: as many as half of `budget` measures, up to `probe_blocks`; with known schedules,
        more where the probes not held yet fit in it."""
        s, lat = self.settings, self.latency
        fitting = min(s.probe_blocks, (budget // 2) // max(1, len(s.probe_shares)))

        def fresh(blocks: int) -> int:
            probes = probe_candidates(method, lat.num_tokens, lat.prefix_tokens, lat.depth, blocks, s.probe_shares)
            return sum(c not in self.records for c in probes)

        more = range(s.probe_blocks, fitting, -1) if self.known else ()
        return next((blocks for blocks in more if fresh(blocks) <= budget // 2), fitting)

    def propose(self, method: str, surrogate: DropSurrogate) -> tuple[list[Candidate], list[Candidate]]:
        """The programme's proposals, slowest first (the fastest for each stand-in drop up to `drop_span` times
        the goal, and the fastest of all), and those within the goal by the stand-in."""
        s, lat = self.settings, self.latency
        programme = BlockProgramme(lat, method, surrogate,
                                   landing_counts(lat.num_tokens, lat.prefix_tokens, s.steps, s.grid), s.max_share)
        step = s.max_accuracy_drop / 100 / s.buckets_per_drop
        within = [c for c in programme.schedules(step, s.buckets_per_drop) if not c.unpruned]
        found = programme.schedules(step, s.buckets_per_drop * s.drop_span) + programme.schedules(math.inf, 0)
        proposals = sorted({c for c in found if not c.unpruned}, key=lambda c: (-lat.predict(c), c))
        return proposals, within

    def measure_probes(self, method: str, probes: Mapping[Candidate, tuple[int, float]]) -> None:
        """The probes in waves by share, smallest first: a block's next share only where its last one's judged drop
        stayed within `closely_searched` (a larger cut would fail further still)."""
        s = self.settings
        limit, baseline = s.closely_searched, self.records[NONE].search
        by_block: dict[int, list[Candidate]] = {}
        for candidate, (block, _) in sorted(probes.items(), key=lambda item: item[1]):
            by_block.setdefault(block, []).append(candidate)

        def worth_a_larger_share(probed: Candidate) -> bool:
            record = self.records.get(probed)
            return record is not None and judged_drop(record.search, baseline, s.stand_in_confidence) <= limit

        for rank in range(max((len(cs) for cs in by_block.values()), default=0)):
            wave = [cs[rank] for cs in by_block.values()
                    if rank < len(cs) and (rank == 0 or worth_a_larger_share(cs[rank - 1]))]
            self.measure(dict.fromkeys(wave, f"probe-{method}"))

    def bisection_shares(self, plans: Mapping[str, ReducerPlan]) -> dict[str, int]:
        """The budget left, split between reducers, most promising first: each at least MIN_BISECTION, the rest by
        how much faster than the fastest measured within the goal their `promised_ms` is; unspent goes on. With known
        schedules, a reducer promising no gain gets nothing."""
        s, incumbent = self.settings, self.fastest_within_goal_ms()
        gains = {m: max(0.0, incumbent / p.promised_ms - 1) for m, p in plans.items()}
        order = sorted(plans, key=lambda m: (-gains[m], s.reducers.index(m)))
        funded = [m for m in order if gains[m] > 0 or not self.known]
        left = self.left
        floors = dict.fromkeys(order, 0)
        for m in funded:  # as far as the budget goes, the most promising first
            floors[m] = min(MIN_BISECTION, len(plans[m].proposals), left - sum(floors.values()))
        spare, total = left - sum(floors.values()), sum(gains.values())
        extra = {m: (spare * gains[m] / total if total > 0 else spare / max(1, len(funded))) if m in funded else 0.0
                 for m in order}
        shares, carried = {}, 0.0
        for m in order:
            want = floors[m] + extra[m] + carried
            shares[m] = min(len(plans[m].proposals), int(want))
            carried = want - shares[m]
        for m in funded:  # what rounding left, to the most promising that can use it
            shares[m] += max(0, min(len(plans[m].proposals) - shares[m], left - sum(shares.values())))
        if total > 0:
            self.notes.append("bisection budget by predicted gain over the best measured within the goal: "
                              + ", ".join(f"{m} {shares[m]} ({100 * gains[m]:+.1f}%)" for m in order))
        return shares

    def within_goal(self, point: Evaluated) -> bool:
        """Whether `point` is within the goal: its drop within it at `confidence` and, given a promise, a chance of
        `AIM` to be certified (the search then seeks what certification passes, not the measured drop's edge)."""
        s, baseline = self.settings, self.records[NONE]
        if not drop_within(point, baseline.accuracy, s.max_accuracy_drop, s.confidence):
            return False
        return self.promise is None or point.candidate.unpruned or self.promise(point, baseline) >= AIM

    def fastest_within_goal_ms(self) -> float:
        """The predicted latency of the fastest schedule measured within the goal so far (unpruned where none)."""
        within = [e.predicted_ms for e in self.records.values() if self.within_goal(e)]
        return min(within, default=self.latency.baseline)

    def refine(self, method: str, plan: ReducerPlan, budget: int) -> int:
        """Up to `budget` measurements, each picked (`refit_pick`) on the stand-in refitted to every schedule of
        `method` measured so far, judged drops capped at `closely_searched`; returns what it left unspent."""
        s, lat = self.settings, self.latency
        baseline, cap = self.records[NONE].search, s.closely_searched
        near = NEAR_MISS * s.max_accuracy_drop / 100
        shares = refit_shares(plan.surrogate.shares)
        stop = self.asked + min(budget, self.left)
        while self.asked < stop:
            observed = [(c, lat.counts(c), min(cap, judged_drop(e.search, baseline, s.stand_in_confidence)))
                        for c, e in self.records.items() if c.method == method]
            surrogate = fit_to_schedules(plan.surrogate.blocks, shares, observed, lat.prefix_tokens)
            proposals, within = self.propose(method, surrogate)
            pick = refit_pick(proposals, within, self.records, lat.predict, self.fastest_within_goal_ms(),
                              lambda c, fit=surrogate: fit.predict(lat.counts(c), c, lat.prefix_tokens) <= near)
            if pick is None:
                break
            self.measure({pick: f"search-{method}"})
        return max(0, stop - self.asked)

    def bisect(self, proposals: list[Candidate], family: str, budget: int) -> None:
        """Measure proposals (slowest first) to find the fastest within the accuracy drop."""
        s, stop = self.settings, self.asked + budget

        def measured(i: int) -> Evaluated | None:
            if proposals[i] not in self.records and self.asked < stop:
                self.measure({proposals[i]: family})
            return self.records.get(proposals[i])

        if s.latency_budget_ms is not None:
            edge = next((i for i, c in enumerate(proposals) if self.latency.predict(c) <= s.latency_budget_ms), None)
            for i in () if edge is None else (edge, edge + 1):
                if i < len(proposals):
                    measured(i)
        low, high = -1, len(proposals)
        while high - low > 1:
            middle = (low + high) // 2
            point = measured(middle)
            if point is None:
                break
            low, high = (middle, high) if self.within_goal(point) else (low, middle)
        # what is left: the proposals faster than the fastest known to pass (accuracy is not monotone along the
        # order), then the slower ones, which can fill in the frontier; nearest first
        faster, slower = range(low + 1, len(proposals)), range(low, -1, -1)
        for i in [*faster, *slower]:
            if self.asked >= stop:
                break
            measured(i)


def warm_left(max_evals: int, held: int, proposed: int) -> int:
    """What the budget of a search holding known schedules still allows: `max_evals` less the schedules it `held`,
    but at least what is left of `WARM_FRESH` of `max_evals` after the fresh measurements it `proposed`."""
    return max(0, max_evals - held, math.ceil(WARM_FRESH * max_evals) - proposed)


def family_labels(latency: LatencyModel, settings: FrontierSettings) -> dict[Candidate, str]:
    """The unpruned model and every uniform family's candidates, each labelled by the first family holding it."""
    labelled = {NONE: "unpruned"}
    families = uniform_families(latency.num_tokens, latency.prefix_tokens, latency.depth, settings.steps,
                                settings.family_points)
    for name, candidates in families.items():
        labelled.update({c: name for c in candidates if c not in labelled})
    return labelled


def known_records(latency: LatencyModel, settings: FrontierSettings,
                  known: Mapping[Candidate, Proportion]) -> dict[Candidate, Evaluated]:
    """The `known` schedules priced by `latency`, labelled by family (`known-<method>` outside them), families
    first, the rest in order."""
    labelled = family_labels(latency, settings) if known else {}
    order = [*(c for c in labelled if c in known), *sorted(set(known) - set(labelled))]
    return {c: Evaluated(c, labelled.get(c, f"known-{c.method}"), latency.predict(c), known[c]) for c in order}


def refit_pick(proposals: Sequence[Candidate], within: Sequence[Candidate], measured: Container[Candidate],
               predict: Callable[[Candidate], float], best_ms: float,
               near_miss: Callable[[Candidate], bool]) -> Candidate | None:
    """The next schedule a refit measures: the fastest unmeasured one of `within` predicted faster than `best_ms`;
    else the nearest such proposal that is a `near_miss`; else None."""
    fresh = [c for c in within if c not in measured and predict(c) < best_ms]
    if fresh:
        return min(fresh, key=lambda c: (predict(c), c))
    faster = [c for c in proposals if c not in measured and predict(c) < best_ms and near_miss(c)]
    return max(faster, key=lambda c: (predict(c), c), default=None)


def search_frontier(latency: LatencyModel, oracle: Oracle, settings: FrontierSettings = FrontierSettings(),
                    known: Mapping[Candidate, Proportion] | None = None,
                    promise: Promise | None = None) -> FrontierResult:
    """The frontier of schedules `latency` prices and `oracle` measures the accuracy of, starting from the `known`
    ones, aiming at those `promise` gives a chance to be certified (`FrontierSearch`)."""
    return FrontierSearch(latency, oracle, settings, known, promise).run()


def with_held_out(result: FrontierResult, oracle: Oracle,
                  candidates: Sequence[Candidate] | None = None) -> FrontierResult:
    """The result with held-out accuracies for `candidates` (default: the frontier and unpruned), not budgeted."""
    wanted = list(dict.fromkeys([NONE, *(e.candidate for e in result.frontier)] if candidates is None else candidates))
    held = oracle(wanted)

    def update(e: Evaluated) -> Evaluated:
        return e.with_held_out(held[e.candidate]) if e.candidate in held else e

    return replace(result, baseline=update(result.baseline), evaluated=tuple(map(update, result.evaluated)),
                   frontier=tuple(map(update, result.frontier)))
