"""The frontier search on synthetic latency models and accuracy oracles, and on a tiny real model end to end."""

import itertools
from functools import cache

import pytest
import torch
from torch.utils.data import TensorDataset

from pomt.accuracy import AGREEMENT, TOP1, eval_transform, open_image_folder
from pomt.errors import PatchError
from pomt.frontier.cache import AccuracyCache
from pomt.frontier.calibration import HELD_OUT, SEARCH, Calibration, Classifier, model_identity
from pomt.frontier.candidates import NONE, REDUCERS, Candidate, uniform_families
from pomt.frontier.choice import Goal, ordered, pareto_front
from pomt.frontier.latency import LatencyModel, ReducerCost
from pomt.frontier.search import (
    MIN_BISECTION,
    FrontierSearch,
    FrontierSettings,
    ReducerPlan,
    refit_pick,
    search_frontier,
    with_held_out,
)
from pomt.frontier.surrogate import DropSurrogate, judged_drop
from pomt.models.registry import create_model
from pomt.patching.blocks import token_counts
from pomt.stats import Proportion

N, P, D = 17, 1, 4
CURVE = {n: 2.0 + 0.5 * n - (1.0 if n <= 12 else 0.0) for n in range(P + 1, N + 1)}  # a step at 13 -> 12
LATENCY = LatencyModel(CURVE, N, P, D, {m: ReducerCost(m, P, {(N, 4): 0.1, (N, 8): 0.05}) for m in REDUCERS})
DAMAGE = {"pomt": 1.0, "topk": 1.3, "tome": 0.8, "l2norm": 2.0}


def true_accuracy(candidate: Candidate) -> float:
    """A known accuracy: each block's cut costs more early and more than in proportion past a quarter of the
    tokens it receives (so the optimum spreads its cuts over blocks)."""
    counts = LATENCY.counts(candidate)
    drop = 0.0
    for block, _ in candidate.removal:
        share = (counts[block] - counts[block + 1]) / (counts[block] - P)
        drop += 0.03 * (D - block) / D * (share + 3 * max(0.0, share - 0.25))
    return 0.9 - DAMAGE.get(candidate.method, 0.0) * drop


def oracle(candidates):
    return {c: Proportion(round(true_accuracy(c) * 10**6), 10**6) for c in candidates}


@cache
def every_schedule() -> tuple[Candidate, ...]:
    found = []
    for method in REDUCERS:
        for removal in itertools.product(range(N - P), repeat=D):
            candidate = Candidate.of(method, dict(enumerate(removal)))
            try:
                counts = token_counts(N, P, D, method, candidate.as_dict())
            except PatchError:
                continue
            if method != "tome" or all(r <= (counts[b] - P) // 2 for b, r in enumerate(removal)):
                found.append(candidate)
    return tuple(found)


@pytest.mark.parametrize("drop", [0.5, 1.0, 2.0, 4.0])
def test_the_search_finds_the_known_optimum_within_its_budget(drop):
    feasible = [c for c in every_schedule() if true_accuracy(c) >= 0.9 - drop / 100 - 1e-9]
    optimum = min(LATENCY.predict(c) for c in feasible)
    result = search_frontier(LATENCY, oracle, FrontierSettings(max_evals=60, max_accuracy_drop=drop, grid=N,
                                                             max_share=1.0))
    assert result.evals <= 60
    found = ordered(result.evaluated, result.baseline.accuracy, Goal(drop))[0]  # unpaired: the measured drop
    assert found.predicted_ms == pytest.approx(optimum)


def test_the_uniform_families_are_always_evaluated_and_the_frontier_is_not_dominated():
    result = search_frontier(LATENCY, oracle, FrontierSettings(max_evals=10))
    families = uniform_families(N, P, D)
    evaluated = {e.candidate: e for e in result.evaluated}
    for name, candidates in families.items():
        assert all(c in evaluated for c in candidates), name
    assert result.evals == 1 + len({c for cs in families.values() for c in cs}) > 10
    assert "no per-block search" in result.notes[0]
    for point in result.frontier:
        assert not any(o.predicted_ms < point.predicted_ms and o.accuracy >= point.accuracy for o in result.evaluated)
    assert list(result.frontier) == pareto_front(result.evaluated)


def test_a_killed_search_resumes_to_the_same_answer_from_its_cache():
    settings = FrontierSettings(max_evals=50, max_accuracy_drop=1.0)
    clean = search_frontier(LATENCY, oracle, settings)
    cache: dict[Candidate, Proportion] = {}
    calls = {"n": 0}

    def killed_after_five(candidates):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        cache.update(oracle(candidates))
        return {c: cache[c] for c in candidates}

    with pytest.raises(KeyboardInterrupt):
        search_frontier(LATENCY, killed_after_five, settings)
    before, measured = len(cache), []

    def resumed(candidates):
        measured.extend(c for c in candidates if c not in cache)
        cache.update(oracle([c for c in candidates if c not in cache]))
        return {c: cache[c] for c in candidates}

    again = search_frontier(LATENCY, resumed, settings)
    assert again == clean
    assert before > 0 and len(measured) == clean.evals - before  # only what the kill left unmeasured


def test_held_out_accuracies_are_attached_to_the_frontier():
    result = with_held_out(search_frontier(LATENCY, oracle, FrontierSettings(max_evals=30)), oracle)
    assert result.baseline.held_out is not None
    assert all(e.held_out == e.search for e in result.frontier)
    assert result.to_dict()["frontier"] == [e.candidate.key for e in result.frontier]


def test_a_search_by_agreement_on_a_random_tiny_vit_end_to_end(tmp_path):
    model = create_model("test_vit", 64)  # 17 tokens, 6 blocks, seeded random weights
    images = TensorDataset(torch.randn(24, 3, 64, 64, generator=torch.Generator().manual_seed(0)),
                           torch.full((24,), -1))
    calibration = Calibration(Classifier(model, AGREEMENT, batch_size=8), images,
                              AccuracyCache(tmp_path / "a.sqlite", model_identity(model)))
    latency = LatencyModel({n: 1.0 + 0.1 * n for n in range(2, 18)}, 17, 1, 6)
    settings = FrontierSettings(reducers=("topk", "l2norm"), max_evals=36, max_accuracy_drop=10.0)
    result = search_frontier(latency, lambda cs: calibration.measure(cs, SEARCH), settings)
    assert result.baseline.accuracy == 1.0 and result.evals <= 36 == calibration.evaluated
    assert {e.family for e in result.evaluated} >= {"probe-topk", "probe-l2norm", "tome-constant"}
    assert all(e.search.trials == 12 for e in result.evaluated)


@pytest.mark.slow
def test_a_search_on_a_trained_tiny_vit_end_to_end(trained, tmp_path):
    root, checkpoint, _ = trained
    model = create_model("test_vit", 96, checkpoint=checkpoint)  # 37 tokens, 6 blocks
    dataset, kind = open_image_folder(root, eval_transform(model, (96, 96)))
    assert kind == TOP1
    calibration = Calibration(Classifier(model, kind, batch_size=40), dataset,
                              AccuracyCache(tmp_path / "acc.sqlite", model_identity(model)))
    latency = LatencyModel({n: 1.0 + 0.1 * n for n in range(2, 38)}, 37, 1, 6)
    settings = FrontierSettings(reducers=("pomt", "tome"), max_evals=40, max_accuracy_drop=5.0)
    result = search_frontier(latency, lambda cs: calibration.measure(cs, SEARCH), settings)
    result = with_held_out(result, lambda cs: calibration.measure(cs, HELD_OUT))
    assert result.evals <= 40 and calibration.evaluated == result.evals + len(result.frontier) + 1
    assert result.baseline.search.trials == calibration.size(SEARCH) == 80
    chosen = ordered(result.evaluated, result.baseline.accuracy, Goal(5.0, confidence=0.5))[0]
    assert chosen in result.frontier and chosen.held_out is not None


def test_the_bisection_budget_goes_to_the_reducer_whose_proposals_promise_a_gain():
    """Where only ToMe's schedules can beat what the uniform families measured (every other reducer's own cost
    eats what it saves), ToMe's bisection gets what the others do not need; each other reducer still gets
    MIN_BISECTION evaluations."""
    costly = {m: ReducerCost(m, P, {(N, 1): 4.0, (N, 8): 4.0}) for m in ("pomt", "topk", "l2norm")}
    latency = LatencyModel(CURVE, N, P, D, {**costly, "tome": ReducerCost("tome", P, {(N, 4): 0.1})})
    result = search_frontier(latency, oracle, FrontierSettings(max_evals=70, grid=N, max_share=1.0))
    searched = {m: sum(e.family == f"search-{m}" for e in result.evaluated) for m in REDUCERS}
    assert all(searched[m] <= MIN_BISECTION for m in costly)
    assert searched["tome"] > 2 * MIN_BISECTION
    note = next(n for n in result.notes if n.startswith("bisection budget"))
    assert note.split(": ")[1].startswith("tome")  # the most promising is named first


def test_what_the_bisection_leaves_goes_first_to_proposals_faster_than_the_fastest_that_passed():
    """Accuracy need not follow the predicted order: here proposals 0-4 and 10-11 meet the goal, the others do
    not. The bisection settles between 4 and 5; the budget left must reach 11, the fastest that passes, and
    not be spent on proposals slower than 4, which cannot beat it."""
    proposals = [Candidate.of("pomt", {1: r}) for r in range(1, 16)]
    passing = {*range(5), 10, 11}

    def accuracy(candidates):
        return {c: Proportion(900 if c.unpruned or proposals.index(c) in passing else 800, 1000) for c in candidates}

    search = FrontierSearch(LATENCY, accuracy, FrontierSettings(confidence=0.5, max_evals=100))
    search.measure({NONE: "unpruned"})
    search.bisect(proposals, "search-pomt", 10)
    measured = [i for i, c in enumerate(proposals) if c in search.records]
    assert 11 in measured and len(measured) == 10
    assert not {0, 1, 2} & set(measured)  # slower than one known to pass: never reached


def test_with_a_promise_the_bisection_lands_at_the_edge_certification_can_pass():
    """Proposal i drops i / 10 points: within a 1-point goal up to 10, but the promise (standing for the held-out
    images' certification) gives a chance only up to 4; the bisection settles at 4 with it and at 10 without."""
    proposals = [Candidate.of("pomt", {1: r}) for r in range(1, 16)]

    def accuracy(candidates):
        return {c: Proportion(9000 - (0 if c.unpruned else 10 * proposals.index(c)), 10000) for c in candidates}

    def promise(point, baseline):
        return 1.0 if baseline.accuracy - point.accuracy <= 0.004 + 1e-9 else 0.0

    for aimed, edge in ((None, 10), (promise, 4)):
        search = FrontierSearch(LATENCY, accuracy, FrontierSettings(confidence=0.5, max_evals=100), promise=aimed)
        search.measure({NONE: "unpruned"})
        search.bisect(proposals, "search-pomt", 4)
        passing = [i for i, c in enumerate(proposals) if c in search.records and search.within_goal(search.records[c])]
        assert max(passing) == edge
        assert search.fastest_within_goal_ms() == LATENCY.predict(proposals[edge])


def test_the_bisection_shares_never_exceed_what_is_left_of_the_budget():
    search = FrontierSearch(LATENCY, oracle, FrontierSettings(max_evals=6))
    search.measure({NONE: "unpruned"})  # 5 evaluations left, fewer than MIN_BISECTION for each of 4 reducers
    proposals = [Candidate.of("pomt", {1: r}) for r in range(1, 10)]
    flat = DropSurrogate((0,), (0.5,), ((0.0,),))
    plans = {m: ReducerPlan(proposals, LATENCY.baseline * (0.9 if m == "tome" else 1.0), flat) for m in REDUCERS}
    shares = search.bisection_shares(plans)
    assert sum(shares.values()) == search.left == 5
    assert list(shares)[0] == "tome" and shares["tome"] >= MIN_BISECTION


def test_a_blocks_larger_share_is_probed_only_where_its_smaller_one_stayed_within_the_searched_drops():
    """l2norm loses 30 points wherever it cuts, far past drop_span times the 1-point goal: its probes stop at the
    smaller share of each block, and what they did not spend goes to the other reducers."""

    def accuracy(candidates):
        return {c: Proportion(round((0.6 if c.method == "l2norm" else true_accuracy(c)) * 10**6), 10**6)
                for c in candidates}

    settings = FrontierSettings(max_evals=80, max_accuracy_drop=1.0)
    result = search_frontier(LATENCY, accuracy, settings)
    probed = {m: [e.candidate for e in result.evaluated if e.family == f"probe-{m}"] for m in REDUCERS}
    blocks = {b for c in probed["pomt"] for b, _ in c.removal}
    assert len(probed["pomt"]) == len(blocks) * len(settings.probe_shares)  # cheap cuts: every share probed
    assert len(probed["l2norm"]) == len({b for c in probed["l2norm"] for b, _ in c.removal}) == len(blocks)
    smaller = min(r for c in probed["pomt"] for _, r in c.removal)
    assert all(r == smaller for c in probed["l2norm"] for _, r in c.removal)


def free_below_a_share(candidate: Candidate) -> float:
    """A known accuracy whose cuts are free up to 15% of the tokens a block receives, and cost in proportion
    past it: single-block probes at a quarter and half of the tokens, interpolated from no cut, overprice the
    small cuts spread over every block that the optimum makes (like ToMe's merges on the digits case)."""
    counts = LATENCY.counts(candidate)
    drop = sum(0.1 * max(0.0, (counts[b] - counts[b + 1]) / (counts[b] - P) - 0.15) for b, _ in candidate.removal)
    return 0.9 - drop


@pytest.mark.parametrize("drop", [0.5, 1.0])
def test_the_refitted_stand_in_finds_the_optimum_the_probes_alone_overprice(drop):
    """Fitted on the uniform families and the bisection's schedules too, the stand-in learns that small cuts
    are free here, and its programme's proposals reach the known optimum (the probes' stand-in alone stopped
    1.1% and 11% short of it, with `refine` disabled)."""
    def accuracy(candidates):
        return {c: Proportion(round(free_below_a_share(c) * 10**6), 10**6) for c in candidates}

    feasible = [c for c in every_schedule() if c.method == "pomt" and free_below_a_share(c) >= 0.9 - drop / 100 - 1e-9]
    optimum = min(LATENCY.predict(c) for c in feasible)
    result = search_frontier(LATENCY, accuracy, FrontierSettings(reducers=("pomt",), max_evals=40,
                                                               max_accuracy_drop=drop, grid=N, max_share=1.0))
    assert result.evals <= 40
    found = ordered(result.evaluated, result.baseline.accuracy, Goal(drop))[0]
    assert found.predicted_ms == pytest.approx(optimum)


def test_the_refit_measures_the_fastest_within_the_goal_then_the_nearest_near_miss_then_stops():
    a, b, c, d = (Candidate.of("tome", {0: r}) for r in (1, 2, 3, 4))
    speed = {a: 9.0, b: 8.0, c: 7.0, d: 6.0}.__getitem__
    assert refit_pick([a, b, c, d], [a, b, c], set(), speed, 10.0, lambda x: True) == c
    assert refit_pick([a, b, c, d], [a, b, c], {c}, speed, 10.0, lambda x: True) == b
    assert refit_pick([a, b, c, d], [a], {a}, speed, 10.0, lambda x: x != b) == c  # nearest near miss
    assert refit_pick([a, b, c, d], [a], {a}, speed, 10.0, lambda x: False) is None
    assert refit_pick([a, b, c, d], [a, b, c], set(), speed, 6.5, lambda x: True) == d  # only d beats 6.5
    assert refit_pick([a, b, c, d], [a, b, c], set(), speed, 5.0, lambda x: True) is None  # nothing beats 5.0


def test_the_stand_in_judges_drops_so_four_blocks_doubt_adds_up_to_one_schedules():
    settings = FrontierSettings()
    assert settings.stand_in_confidence == pytest.approx(0.7946, abs=1e-4)  # the normal quantile 1.645 / 2
    assert FrontierSettings(confidence=0.5).stand_in_confidence == 0.5  # the measured drop either way
    assert FrontierSettings(stand_in_blocks=1).stand_in_confidence == pytest.approx(0.95)
    baseline = Proportion(286, 404, 0, 0)
    for probe, schedule in [(Proportion(284, 404, 5, 3), Proportion(278, 404, 20, 12)),  # four blocks' changes
                            (Proportion(286, 404, 4, 4), Proportion(286, 404, 16, 16))]:
        summed = 4 * judged_drop(probe, baseline, settings.stand_in_confidence)
        assert summed == pytest.approx(judged_drop(schedule, baseline, settings.confidence), rel=0.01)
        assert 4 * judged_drop(probe, baseline, settings.confidence) > 1.35 * summed  # at the goal's: overpriced
