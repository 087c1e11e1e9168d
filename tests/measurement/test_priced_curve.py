"""The curve every choice prices from: a count's level believed as far as its noise allows, confirmed steps kept."""

import numpy as np
import pytest

from pomt.formats.curve import CurvePoint
from pomt.frontier.latency import LatencyModel
from pomt.frontier.surrogate import BlockProgramme, DropSurrogate
from pomt.measurement.priced_curve import priced_curve, priced_levels, step_spans
from pomt.measurement.steps import Step

N, P, D = 50, 1, 12


def level(n: int) -> float:
    return 10.0 + 1.4 * n + 0.004 * n * n


def points(latency: dict[int, float], visits: int = 1, noise: float = float("nan")) -> list[CurvePoint]:
    """A curve's points, each visited `visits` times at `noise` a visit (nan: its standard error unknown)."""
    return [CurvePoint(n, ms, ms, ms / latency[N], 0.0, ms, visits, visits, noise * ms / visits**0.5)
            for n, ms in sorted(latency.items())]


def wiggled(dips: dict[int, float] | None = None, seed: int = 0) -> dict[int, float]:
    """The smooth level with 2% noise at every count, and `dips` (count: factor) on top."""
    noise, dips = np.random.default_rng(seed).normal(0.0, 0.02, N + 1), dips or {}
    return {n: level(n) * (1 + noise[n]) * dips.get(n, 1.0) for n in range(2, N + 1)}


def drop(low: int, high: int, pct: float) -> Step:
    return Step(tokens=low, upper_tokens=high, before_ms=0.0, after_ms=0.0, drop_ms=0.0, drop_pct=pct,
                significance=10.0, kind="drop")


def test_a_count_that_noise_put_low_is_priced_at_its_level():
    raw = wiggled({37: 0.7})
    smooth = priced_curve(points(raw))
    assert raw[37] / level(37) < 0.72
    assert smooth[37] / level(37) == pytest.approx(1.0, abs=0.03)
    assert all(smooth[n] / level(n) == pytest.approx(1.0, abs=0.03) for n in (35, 36, 38, 39))  # not bent by it


def test_a_confirmed_step_is_kept_and_an_unconfirmed_one_smoothed_over():
    raw = {n: ms * (0.85 if n <= 30 else 1.0) for n, ms in wiggled().items()}  # a 15% drop from 31 to 30 tokens
    kept = priced_curve(points(raw), [drop(30, 31, 15.0)])
    assert kept[30] / kept[31] == pytest.approx(0.85 * level(30) / level(31), abs=0.03)
    blurred = priced_curve(points(raw))
    assert blurred[30] / blurred[31] > 0.93


def test_counts_inside_a_spread_step_keep_their_own_level():
    raw = wiggled()
    smooth = priced_curve(points(raw), [drop(30, 33, 10.0)])
    assert smooth[31] == raw[31] and smooth[32] == raw[32]
    assert smooth[30] != raw[30] and smooth[33] != raw[33]


def test_counts_with_more_visits_weigh_more():
    raw = wiggled({40: 1.1})
    visits = {n: 1 for n in raw} | {40: 40}
    weighted = [CurvePoint(p.tokens, p.latency_ms, p.median_ms, p.relative, 0.0, p.min_ms, visits[p.tokens], 1)
                for p in points(raw)]
    assert priced_curve(weighted)[40] > priced_curve(points(raw))[40] + 0.03 * level(40)


def test_too_few_counts_are_returned_as_measured():
    assert priced_curve(points({2: 5.0, N: 80.0})) == {2: 5.0, N: 80.0}


def test_the_programme_lands_on_a_noise_dip_only_on_the_raw_curve():
    raw = wiggled({37: 0.7}, seed=1)
    surrogate = DropSurrogate((0, 5, 10), (0.25, 0.5), ((0.0, 0.0),) * 3)
    counts = list(range(2, N + 1))

    def lands_on_the_dip(curve: dict[int, float]) -> bool:
        latency = LatencyModel(curve, N, P, D)
        fastest = BlockProgramme(latency, "pomt", surrogate, counts, max_share=0.3).schedules(float("inf"), 0)[0]
        return 37 in latency.counts(fastest)[:D]

    assert lands_on_the_dip(raw)
    assert not lands_on_the_dip(priced_curve(points(raw)))


def test_a_schedule_files_steps_give_their_spans_and_nothing_else():
    recorded = [drop(30, 31, 15.0).to_dict(), {"tokens": 40}, "191 -> 190", {"tokens": 44, "upper_tokens": 46}]
    assert step_spans(recorded) == [(30, 31), (44, 46)]


def test_a_dip_within_a_noisy_visit_is_priced_at_the_trend():
    raw = wiggled({37: 0.7})
    priced = priced_curve(points(raw, noise=0.08))  # one visit at 8% noise: the 2% the counts spread is noise
    assert priced[37] / level(37) == pytest.approx(1.0, abs=0.03)


def test_structure_the_noise_cannot_explain_is_kept():
    # the AMD VM's batch-1 curves step by 2-3% at most counts: here every even count 4% under its neighbours,
    # at 0.5% noise a visit
    rng = np.random.default_rng(2)
    raw = {n: level(n) * (0.96 if n % 2 == 0 else 1.0) * (1 + rng.normal(0, 0.005)) for n in range(2, N + 1)}
    priced = priced_curve(points(raw, noise=0.005))
    trend = priced_curve(points(raw))
    for n in range(10, N - 1, 2):
        assert priced[n] / priced[n + 1] < 0.98 * level(n) / level(n + 1)  # at least half the dip kept
        assert trend[n] / trend[n + 1] > 0.99 * level(n) / level(n + 1)  # the trend alone smooths it away


def test_a_count_visited_many_times_keeps_its_measured_level():
    raw = wiggled({N: 0.92})
    many = [p if p.tokens != N else CurvePoint(N, p.latency_ms, p.median_ms, 1.0, 0.0, p.min_ms, 64, 64,
                                                0.02 * p.latency_ms / 8) for p in points(raw, noise=0.02)]
    assert priced_levels(many)[N] == pytest.approx(raw[N], rel=0.01)
