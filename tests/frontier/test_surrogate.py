"""The additive stand-in for accuracy drop, fitted on single-block probes and refitted on measured schedules, and
the dynamic programme over blocks: exact for its stand-in drop, landing counts below steps among its moves."""

import itertools
import operator
from dataclasses import replace

import numpy as np
import pytest

from pomt.frontier.candidates import Candidate
from pomt.frontier.latency import LatencyModel, MixedCounts, ReducerCost
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
from pomt.measurement.steps import Step
from pomt.patching.blocks import token_counts
from pomt.stats import Proportion


def share(value: float, lost: int | None = None, gained: int | None = None) -> Proportion:
    """An accuracy of `value` on 1000 images (paired where `lost` and `gained` are given)."""
    return Proportion(round(1000 * value), 1000, lost, gained)


BASELINE = share(0.9, 0, 0)


def test_probes_are_single_block_removals_at_spread_blocks():
    probes = probe_candidates("pomt", 50, 1, 12, blocks=4, shares=(0.25, 0.5))
    assert sorted({b for b, _ in probes.values()}) == [0, 3, 7, 10]  # the last block (11) is no cut
    assert probes[Candidate.of("pomt", {3: 12})] == (3, 12 / 49)
    assert max(c.as_dict()[b] for c, (b, _) in probe_candidates("tome", 50, 1, 12, shares=(0.9,)).items()) == 24


def test_the_fit_interpolates_in_share_and_block_and_never_makes_a_cut_free():
    probes = {(0, 0.25): share(0.88), (0, 0.5): share(0.80), (8, 0.25): share(0.90), (8, 0.5): share(0.92)}
    surrogate = fit_surrogate(probes, BASELINE)
    assert surrogate.at(0, 0.25) == pytest.approx(0.02) and surrogate.at(0, 0.125) == pytest.approx(0.01)
    assert surrogate.at(0, 0.75) == pytest.approx(0.18)  # along the last slope
    assert surrogate.at(8, 0.5) == 0.0  # a gain is no drop
    assert surrogate.at(4, 0.5) == pytest.approx(0.05) and surrogate.at(11, 0.5) == 0.0
    assert surrogate.at(3, 0.0) == 0.0


def test_the_stand_in_adds_the_blocks_cuts():
    surrogate = fit_surrogate({(0, 0.5): share(0.8), (3, 0.5): share(0.9)}, BASELINE)
    candidate = Candidate.of("pomt", {0: 8, 3: 4})
    counts = [17, 9, 9, 9, 5]  # 16 patch tokens, half removed at block 0, then half of the 8 left at block 3
    assert surrogate.predict(counts, candidate, 1) == pytest.approx(0.1 + 0.0)


def test_a_probe_that_reshuffles_predictions_is_judged_by_its_bound_not_its_mean():
    reshuffled = share(0.9, lost=30, gained=30)  # no mean drop, 60 images changed
    untouched = share(0.9, lost=0, gained=0)
    assert judged_drop(reshuffled, BASELINE, 0.5) == pytest.approx(0.0, abs=1e-9)
    assert judged_drop(reshuffled, BASELINE, 0.95) > 0.01  # the goal would judge it over a point
    assert judged_drop(untouched, BASELINE, 0.95) == pytest.approx(0.0, abs=1e-12)  # the floor is paid once
    surrogate = fit_surrogate({(0, 0.5): reshuffled, (4, 0.5): untouched}, BASELINE, 0.95)
    assert surrogate.at(0, 0.5) == pytest.approx(judged_drop(reshuffled, BASELINE, 0.95))
    assert surrogate.at(4, 0.5) == pytest.approx(0.0, abs=1e-12)
    assert fit_surrogate({(0, 0.5): reshuffled}, BASELINE, 0.5).at(0, 0.5) == pytest.approx(0.0, abs=1e-9)


def test_the_bound_grows_with_the_images_changed_at_one_net_loss():
    few, many = share(0.899, lost=1, gained=0), share(0.899, lost=11, gained=10)
    assert judged_drop(many, BASELINE, 0.95) > judged_drop(few, BASELINE, 0.95) > 0.0


def test_a_stand_in_refitted_on_multi_block_schedules_recovers_a_known_additive_drop():
    """Drops that are additive on the grid are fitted back exactly from schedules cutting at several blocks,
    none of them a probe; every cell stays >= 0 and non-decreasing in the share."""
    n, p, depth = 17, 1, 4
    blocks, shares = (0, 2), (0.125, 0.25, 0.5)
    truth = DropSurrogate(blocks, shares, ((0.0, 0.01, 0.05), (0.002, 0.004, 0.03)))
    rng = np.random.default_rng(0)
    observed = []
    for _ in range(40):
        removal = {b: int(rng.integers(1, 9 if b == 0 else 5)) for b in range(3) if rng.random() < 0.7}
        candidate = Candidate.of("pomt", removal or {0: 2})
        counts = token_counts(n, p, depth, "pomt", candidate.as_dict())
        observed.append((candidate, counts, truth.predict(counts, candidate, p)))
    fitted = fit_to_schedules(blocks, shares, observed, p)
    assert np.allclose(fitted.drops, truth.drops, atol=1e-9)
    noisy = [(c, counts, d + rng.normal(0, 0.01)) for c, counts, d in observed]
    rows = np.array(fit_to_schedules(blocks, shares, noisy, p).drops)
    assert (rows >= 0).all() and (np.diff(rows, axis=1) >= -1e-12).all()


def test_a_refitted_stand_in_adds_a_share_below_the_smallest_probed():
    assert refit_shares((0.25, 0.5)) == (0.125, 0.25, 0.5)


N, P, D = 13, 1, 3
CURVE = {n: 1.0 + 0.3 * n + (0.8 if n > 9 else 0.0) for n in range(2, N + 1)}  # a step at 10 -> 9
SURROGATE = DropSurrogate((0, 2), (0.25, 0.5), ((0.02, 0.06), (0.005, 0.01)))


def test_landing_counts_include_every_steps_fast_side():
    assert landing_counts(197, 1, steps=[150, 151], grid=5) == [197, 151, 150, 148, 100, 51, 2]


def test_a_rise_lands_on_its_high_side_and_a_drop_on_its_low_side():
    def step(kind: str) -> Step:
        return Step(tokens=15, upper_tokens=16, before_ms=4.0, after_ms=4.3, drop_ms=-0.3, drop_pct=-7.0,
                    significance=4.0, kind=kind)

    # at batch 1 on the 2-core CPU, 15 tokens ran 5-8% slower than 16: a schedule lands on 16, not on 15
    assert step("rise").fast_tokens == 16 and step("drop").fast_tokens == 15
    assert 16 in landing_counts(50, 1, steps=[step("rise").fast_tokens], grid=24)
    assert 16 not in landing_counts(50, 1, steps=[step("drop").fast_tokens], grid=24)


def every_schedule() -> list[tuple[Candidate, list[int]]]:
    """Every pomt schedule of the D blocks (its removals, the counts entering each block and leaving the last)."""
    every = []
    for removal in itertools.product(range(N - P), repeat=D):
        counts = [N]
        for r in removal:
            counts.append(counts[-1] - r)
        if counts[-1] >= P + 1:
            every.append((Candidate.of("pomt", dict(enumerate(removal))), counts))
    return every


def spent(counts: list[int], step: float) -> float:
    """The stand-in drop a schedule entering the blocks with `counts` spends, in whole buckets of `step`."""
    return sum(-(-SURROGATE.at(b, (counts[b] - counts[b + 1]) / (counts[b] - P)) // step)
               for b in range(D) if counts[b] > counts[b + 1]) * step


def fastest_within(latency: LatencyModel, proposals: list[Candidate], step: float, allowance: float,
                   last_cuts: bool = True) -> tuple:
    """The fastest schedule within `allowance` by `latency.predict`, of every schedule (without `last_cuts`,
    of those that do not cut at the last block) and of the proposals."""
    within = [c for c, counts in every_schedule() if spent(counts, step) <= allowance + 1e-12
              and (last_cuts or D - 1 not in c.as_dict())]
    return (min(latency.predict(c) for c in within),
            min(latency.predict(c) for c in proposals if c in within))


def test_every_allowance_gets_the_fastest_schedule_within_it():
    latency = LatencyModel(CURVE, N, P, D)
    programme = BlockProgramme(latency, "pomt", SURROGATE, range(2, N + 1), max_share=1.0)
    step = 0.002
    proposals = programme.schedules(step, 40)
    for allowance in (0.0, 0.01, 0.03, 0.08):
        best, chosen = fastest_within(latency, proposals, step, allowance)
        assert chosen == pytest.approx(best)
    fastest = programme.schedules(float("inf"), 0)[0]
    assert latency.predict(fastest) == pytest.approx(min(latency.predict(c) for c, _ in every_schedule()))


def test_the_programme_charges_mixed_counts_as_predict_does():
    flat = LatencyModel(CURVE, N, P, D)
    layout = (N, 10, 7)  # two count changes: 10% x sqrt(2) over the sum of its blocks
    excess = 1 + 0.1 * 2 ** 0.5
    mixed = MixedCounts(layout, excess, (excess - 0.01, excess + 0.01), flat.predict_counts(layout) * excess)
    latency = LatencyModel(CURVE, N, P, D, mixed=mixed)
    assert latency.kappa == pytest.approx(0.1)
    programme, step = BlockProgramme(latency, "pomt", SURROGATE, range(2, N + 1), max_share=1.0), 0.002
    for buckets in range(41):  # blind to the term, allowances of 24-29 buckets got schedules 1.3-3.8% slower
        best, chosen = fastest_within(latency, programme.schedules(step, buckets), step, buckets * step)
        assert chosen == pytest.approx(best)
    fastest = programme.schedules(float("inf"), 0)[0]
    assert latency.predict(fastest) == pytest.approx(min(latency.predict(c) for c, _ in every_schedule()))


@pytest.mark.parametrize("later", [-0.4, 0.4])
def test_the_programme_charges_a_cut_right_after_a_cut_as_predict_does(later):
    """`later` (ToMe's calibrated saving, or a cost) on cuts that follow a cut: a programme blind to which block
    cut before prices schedules that cut in a row off by it, and picks the wrong one where it decides."""
    cost = ReducerCost("pomt", P, {(N, 1): 0.1, (N, 6): 0.1, (5, 1): 0.1, (5, 3): 0.1}, later=later)
    latency = LatencyModel(CURVE, N, P, D, {"pomt": cost})
    assert latency.predict(Candidate.of("pomt", {0: 2, 1: 2})) == pytest.approx(
        latency.predict(Candidate.of("pomt", {0: 2})) - latency.block_ms(11) + latency.block_ms(9) + 0.1 + later)
    programme, step = BlockProgramme(latency, "pomt", SURROGATE, range(2, N + 1), max_share=1.0), 0.002
    for buckets in range(41):  # no cut at the last block, where a saving of `later` would pay for one
        best, chosen = fastest_within(latency, programme.schedules(step, buckets), step, buckets * step, False)
        assert chosen == pytest.approx(best)
    blind = BlockProgramme(LatencyModel(CURVE, N, P, D, {"pomt": replace(cost, later=0.0)}), "pomt", SURROGATE,
                           range(2, N + 1), max_share=1.0)  # the programme blind to which block cut before
    missed = [buckets for buckets in range(41)
              if abs(operator.sub(*fastest_within(latency, blind.schedules(step, buckets), step, buckets * step,
                                                  False))) > 1e-9]
    assert missed  # the case decides: without the state, some allowances get a slower schedule


def test_tome_moves_stay_within_half_the_tokens():
    latency = LatencyModel(CURVE, N, P, D)
    programme = BlockProgramme(latency, "tome", SURROGATE, range(2, N + 1))
    fastest = programme.schedules(float("inf"), 0)[0]
    counts = latency.counts(fastest)
    assert all(counts[b] - counts[b + 1] <= (counts[b] - P) // 2 for b in range(D))
    assert counts[1] == 7  # 12 patch tokens: at most 6 merged at block 0


def test_no_schedule_cuts_at_the_last_block_even_where_a_noisy_cost_says_it_pays():
    negative = ReducerCost("pomt", P, {(N, 1): -0.5, (N, 6): -0.5, (7, 1): -0.5, (7, 3): -0.5})
    latency = LatencyModel(CURVE, N, P, D, {"pomt": negative})
    assert latency.predict(Candidate.of("pomt", {D - 1: 6})) < latency.baseline  # what the noise promises
    programme = BlockProgramme(latency, "pomt", SURROGATE, range(2, N + 1), max_share=1.0)
    proposals = programme.schedules(0.002, 40) + programme.schedules(float("inf"), 0)
    assert proposals and all(D - 1 not in c.as_dict() for c in proposals)
