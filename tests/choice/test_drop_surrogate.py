"""The additive stand-in for accuracy drop, fitted on single-block probes."""

import pytest

from pomt.choice.candidates import Candidate
from pomt.choice.drop_surrogate import fit_surrogate, probe_candidates


def test_probes_are_single_block_removals_at_spread_blocks():
    probes = probe_candidates("pomt", 50, 1, 12, blocks=4, shares=(0.25, 0.5))
    assert sorted({b for b, _ in probes.values()}) == [0, 4, 7, 11]
    assert probes[Candidate.of("pomt", {4: 12})] == (4, 12 / 49)
    assert max(c.as_dict()[b] for c, (b, _) in probe_candidates("tome", 50, 1, 12, shares=(0.9,)).items()) == 24


def test_the_fit_interpolates_in_share_and_block_and_never_makes_a_cut_free():
    surrogate = fit_surrogate({(0, 0.25): 0.88, (0, 0.5): 0.80, (8, 0.25): 0.90, (8, 0.5): 0.92}, baseline=0.9)
    assert surrogate.at(0, 0.25) == pytest.approx(0.02) and surrogate.at(0, 0.125) == pytest.approx(0.01)
    assert surrogate.at(0, 0.75) == pytest.approx(0.18)  # along the last slope
    assert surrogate.at(8, 0.5) == 0.0  # a gain is no drop
    assert surrogate.at(4, 0.5) == pytest.approx(0.05) and surrogate.at(11, 0.5) == 0.0
    assert surrogate.at(3, 0.0) == 0.0


def test_the_stand_in_adds_the_blocks_cuts():
    surrogate = fit_surrogate({(0, 0.5): 0.8, (3, 0.5): 0.9}, baseline=0.9)
    candidate = Candidate.of("pomt", {0: 8, 3: 4})
    counts = [17, 9, 9, 9, 5]  # 16 patch tokens, half removed at block 0, then half of the 8 left at block 3
    assert surrogate.predict(counts, candidate, 1) == pytest.approx(0.1 + 0.0)
