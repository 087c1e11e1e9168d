"""The additive stand-in for accuracy drop, fitted on single-block probes and refitted on measured schedules."""

import numpy as np
import pytest

from pomt.frontier.candidates import Candidate
from pomt.frontier.surrogate import (
    DropSurrogate,
    fit_surrogate,
    fit_to_schedules,
    judged_drop,
    probe_candidates,
    refit_shares,
)
from pomt.patching.plan import token_counts
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
