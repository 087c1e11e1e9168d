"""A search on a warm accuracy cache: it starts from what searches on other latency curves measured, spends little
of its own, keeps the uniform families' labels, and a resumed search of the same curve decides as one never killed."""

from __future__ import annotations

import math
import multiprocessing
import sqlite3

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from pomt.accuracy import AGREEMENT
from pomt.frontier.cache import AccuracyCache
from pomt.frontier.calibration import HELD_OUT, SEARCH, Calibration, Classifier, hosted, model_identity
from pomt.frontier.candidates import NONE, REDUCERS, Candidate, uniform_families
from pomt.frontier.choice import drop_within
from pomt.frontier.distributed import ShardedCalibration
from pomt.frontier.latency import LatencyModel, ReducerCost
from pomt.frontier.search import (
    WARM_FRESH,
    FrontierSearch,
    FrontierSettings,
    family_labels,
    search_frontier,
    warm_left,
)
from pomt.frontier.surrogate import probe_candidates
from pomt.models.registry import create_model
from pomt.stats import Proportion

N, P, D = 17, 1, 4
COSTS = {m: ReducerCost(m, P, {(N, 4): 0.1, (N, 8): 0.05}) for m in REDUCERS}
BATCH_16 = LatencyModel({n: 2.0 + 0.5 * n - (1.0 if n <= 12 else 0.0) for n in range(P + 1, N + 1)}, N, P, D, COSTS)
BATCH_1 = LatencyModel({n: 3.0 + 0.2 * n - (0.8 if n <= 9 else 0.0) for n in range(P + 1, N + 1)}, N, P, D,
                       {m: ReducerCost(m, P, {(N, 4): 0.3, (N, 8): 0.2}) for m in REDUCERS})


def accuracy(candidate: Candidate) -> float:
    """A known accuracy: each block's cut costs more early, and more than in proportion to the share it removes."""
    counts = BATCH_16.counts(candidate)
    shares = {b: (counts[b] - counts[b + 1]) / (counts[b] - P) for b, _ in candidate.removal}
    return 0.9 - sum(0.03 * (D - b) / D * share ** 1.5 for b, share in shares.items())


class Oracle:
    """The known accuracies, and every candidate asked for."""

    def __init__(self) -> None:
        self.asked: list[Candidate] = []

    def __call__(self, candidates):
        self.asked.extend(candidates)
        return {c: Proportion(round(accuracy(c) * 10**6), 10**6) for c in candidates}


def first_search(settings: FrontierSettings) -> dict[Candidate, Proportion]:
    """What a search on the batch-16 curve measured."""
    return {e.candidate: e.search for e in search_frontier(BATCH_16, Oracle(), settings).evaluated}


@pytest.mark.parametrize("known", [None, {}], ids=["none", "empty"])
def test_a_search_without_known_schedules_is_the_cold_one(known):
    settings = FrontierSettings(max_evals=40, max_accuracy_drop=1.0)
    cold, given = Oracle(), Oracle()
    assert search_frontier(BATCH_1, given, settings, known) == search_frontier(BATCH_1, cold, settings)
    assert given.asked == cold.asked


def test_the_warm_budget_counts_what_is_held_but_keeps_a_floor_of_fresh_proposals():
    assert math.ceil(WARM_FRESH * 80) == 8
    assert warm_left(80, held=30, proposed=0) == 50  # a few known: the budget counts them
    assert warm_left(80, held=95, proposed=3) == 5  # many known: what is left of the floor
    assert warm_left(80, held=95, proposed=20) == 0


@pytest.mark.parametrize("max_evals", [40, 80])
def test_a_search_on_another_curve_starts_from_what_the_first_measured(max_evals):
    settings = FrontierSettings(max_evals=max_evals, max_accuracy_drop=1.0)
    known = first_search(settings)
    own = FrontierSettings(max_evals=max_evals, max_accuracy_drop=1.0, steps=(10,))  # a step of its own: one more
    forced = [c for c in family_labels(BATCH_1, own) if c not in known]  # uniform removal to measure
    assert len(forced) == 1
    oracle = Oracle()
    warm = search_frontier(BATCH_1, oracle, own, known)
    cold = search_frontier(BATCH_1, Oracle(), own)
    assert warm.evals == len(oracle.asked) <= math.ceil(WARM_FRESH * max_evals) + len(forced) < cold.evals
    assert not set(oracle.asked) & set(known) and forced[0] in oracle.asked
    evaluated = {e.candidate: e for e in warm.evaluated}
    assert set(known) <= set(evaluated) and warm.baseline.search == known[NONE]
    assert all(evaluated[c].predicted_ms == BATCH_1.predict(c) for c in known)  # priced on its own curve
    labels = family_labels(BATCH_1, own)
    assert set(labels) == {NONE, *(c for cs in uniform_families(N, P, D, own.steps).values() for c in cs)}
    assert all(evaluated[c].family == label for c, label in labels.items())
    outside = [e for c, e in evaluated.items() if c in known and c not in labels]
    assert outside and all(e.family == f"known-{e.candidate.method}" for e in outside)
    assert f"started from {len(known)} schedules other searches measured on these images; {warm.evals} measured " \
           "fresh" in warm.notes


def fastest_within(result, drop: float = 1.0) -> float:
    return min(e.predicted_ms for e in result.evaluated
               if drop_within(e, result.baseline.accuracy, drop, FrontierSettings().confidence))


@pytest.mark.parametrize("max_evals", [40, 80])
def test_a_warm_search_measures_only_reducers_that_promise_a_gain_and_finds_what_a_cold_one_finds(max_evals):
    settings = FrontierSettings(max_evals=max_evals, max_accuracy_drop=1.0)
    known = first_search(settings)
    oracle = Oracle()
    warm = FrontierSearch(BATCH_1, oracle, settings, known)
    found = warm.run()
    cold = search_frontier(BATCH_1, Oracle(), settings)
    note = next(n for n in found.notes if n.startswith("bisection budget"))
    idle = [m for m in REDUCERS if f"{m} 0 (+0.0%)" in note]
    assert idle and not {c.method for c in oracle.asked} & set(idle)
    assert fastest_within(found) <= fastest_within(cold) * 1.001


def test_a_reducer_whose_probes_are_held_is_planned_without_budget():
    settings = FrontierSettings(max_evals=40)
    probes = probe_candidates("pomt", N, P, D, settings.probe_blocks, settings.probe_shares)
    oracle = Oracle()
    held = oracle([NONE, *probes])
    oracle.asked.clear()
    search = FrontierSearch(BATCH_1, oracle, settings, held)
    assert search.plan_reducer("pomt", 0) is not None and not oracle.asked
    assert FrontierSearch(BATCH_1, oracle, settings, {NONE: held[NONE]}).plan_reducer("pomt", 0) is None
    cold = FrontierSearch(BATCH_1, oracle, settings)
    cold.measure({NONE: "unpruned", **dict.fromkeys(probes, "probe-pomt")})
    assert cold.plan_reducer("pomt", 0) is None  # cold: as today, the budget alone decides


class Killed(Exception):
    pass


def tiny_calibration(path, origin: str, kind: type[Calibration] = Calibration) -> Calibration:
    model = create_model("test_vit", 64)  # 17 tokens, 6 blocks, seeded random weights
    images = TensorDataset(torch.randn(24, 3, 64, 64, generator=torch.Generator().manual_seed(0)),
                           torch.full((24,), -1))
    return kind(Classifier(model, AGREEMENT, batch_size=12), images, AccuracyCache(path, model_identity(model)),
                origin=origin)


def test_a_resumed_warm_search_decides_as_one_never_killed_though_another_wrote_in_between(tmp_path):
    slow = LatencyModel({n: 1.0 + 0.1 * n for n in range(2, 18)}, 17, 1, 6)
    fast = LatencyModel({n: 0.5 + 0.02 * n - (0.1 if n <= 11 else 0.0) for n in range(2, 18)}, 17, 1, 6)
    settings = FrontierSettings(reducers=("topk", "tome"), max_evals=30, max_accuracy_drop=10.0)
    first = tiny_calibration(tmp_path / "whole.sqlite", "batch-16")
    cold = search_frontier(slow, lambda cs: first.measure(cs, SEARCH), settings, first.known())
    assert not any("started from" in note for note in cold.notes)
    with sqlite3.connect(tmp_path / "whole.sqlite") as whole, sqlite3.connect(tmp_path / "killed.sqlite") as copy:
        whole.backup(copy)  # a second cache holding the first search's results alike
    whole.close(), copy.close()

    uninterrupted = tiny_calibration(tmp_path / "whole.sqlite", "batch-1")
    known = uninterrupted.known()
    assert set(known) == {e.candidate for e in cold.evaluated} and all(p.paired for p in known.values())
    warm = search_frontier(fast, lambda cs: uninterrupted.measure(cs, SEARCH), settings, known)
    assert uninterrupted.evaluated == warm.evals <= math.ceil(WARM_FRESH * 30) < cold.evals

    killed = tiny_calibration(tmp_path / "killed.sqlite", "batch-1")
    calls = []

    def measured_until_killed(candidates):
        if len(calls) == 2:
            raise Killed
        calls.append(candidates)
        return killed.measure(candidates, SEARCH)

    with pytest.raises(Killed):
        search_frontier(fast, measured_until_killed, settings, killed.known())
    fresh = [e.candidate for e in warm.evaluated if e.candidate not in known]
    meanwhile = tiny_calibration(tmp_path / "killed.sqlite", "batch-4")  # another curve's search, before the resume
    meanwhile.measure(fresh, SEARCH)
    assert meanwhile.evaluated == len(fresh) - killed.evaluated > 0
    resumed = tiny_calibration(tmp_path / "killed.sqlite", "batch-1")
    assert resumed.known() == known  # its own results are read back, not known, nor what others wrote since it began
    again = search_frontier(fast, lambda cs: resumed.measure(cs, SEARCH), settings, resumed.known())
    assert again == warm and killed.evaluated > 0 and resumed.evaluated == 0  # the rest read back as measured


def test_a_hosted_calibration_measures_under_its_origin_and_knows_what_others_measured(tmp_path):
    path = tmp_path / "acc.sqlite"
    other = tiny_calibration(path, "batch-16")
    other.measure([NONE, Candidate.of("topk", {2: 6})])
    with hosted(tiny_calibration(path, "")) as away:
        away.origin = "batch-1"
        assert set(away.known()) == {NONE, Candidate.of("topk", {2: 6})}
        away.measure([Candidate.of("tome", {0: 2})])
        assert set(away.known()) == {NONE, Candidate.of("topk", {2: 6})}  # its own left out
    assert other.known() == {Candidate.of("tome", {0: 2}): other.cached(Candidate.of("tome", {0: 2}))}


SPAWN = multiprocessing.get_context("spawn")


def known_on_rank(rank: int, folder, answers) -> None:
    """One of two gloo ranks, each with its own cache file (rank 0's holds one result): the schedules it knows."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{folder / 'group'}", rank=rank, world_size=2)
    calibration = tiny_calibration(folder / f"rank{rank}.sqlite", "batch-1", ShardedCalibration)
    if rank == 0:
        calibration.cache.add(NONE, calibration.split_ids[SEARCH], Proportion(12, 12, 0, 0), origin="batch-16")
    answers.put((rank, calibration.known()))
    torch.distributed.destroy_process_group()


def on_two_ranks(target, folder) -> dict:
    """{rank: what `target(rank, folder, answers)` put} for two gloo ranks started as processes of their own."""
    answers = SPAWN.Queue()
    ranks = [SPAWN.Process(target=target, args=(rank, folder, answers)) for rank in (0, 1)]
    for rank in ranks:
        rank.start()
    found = dict(answers.get(timeout=120) for _ in ranks)
    for rank in ranks:
        rank.join(60)
        rank.kill()  # only if it is still running
    return found


def test_every_rank_of_a_sharded_search_starts_from_rank_zeros_known_schedules(tmp_path):
    found = on_two_ranks(known_on_rank, tmp_path)
    assert found == {0: {NONE: Proportion(12, 12, 0, 0)}, 1: {NONE: Proportion(12, 12, 0, 0)}}


def classes_on_rank(rank: int, folder, answers) -> None:
    """One of two gloo ranks, each with its own cache file (rank 0's keeps classes for the search split, made up):
    the unpruned classes each counts against, on the search split and, found by both together, the held-out one."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{folder / 'group'}", rank=rank, world_size=2)
    calibration = tiny_calibration(folder / f"rank{rank}.sqlite", "batch-1", ShardedCalibration)
    if rank == 0:
        calibration.cache.add_classes(calibration.split_ids[SEARCH], np.full(calibration.size(SEARCH), 3))
    found = {split: calibration.reference_classes(split).tolist() for split in (SEARCH, HELD_OUT)}
    answers.put((rank, found))
    torch.distributed.destroy_process_group()


def test_every_rank_of_a_sharded_search_counts_against_the_classes_rank_zero_reads_or_they_find_together(tmp_path):
    found = on_two_ranks(classes_on_rank, tmp_path)
    alone = tiny_calibration(None, "batch-1")
    assert found[0] == found[1]
    assert found[0][SEARCH] == [3] * alone.size(SEARCH)
    assert found[0][HELD_OUT] == alone.reference_classes(HELD_OUT).tolist()
