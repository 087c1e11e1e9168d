"""Certification of the finalists on the held-out images: the sequential test's looks and error spending, when it
certifies or fails, the promise it keeps (Monte Carlo), the held-out size it asks for, which finalists it picks,
and the certification of a frontier over fixed per-image outcomes."""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

import numpy as np
import pytest

from pomt.errors import CalibrationError
from pomt.frontier.calibration import HELD_OUT
from pomt.frontier.candidates import FAMILIES, NONE, Candidate
from pomt.frontier.certify import (
    CERTIFIED,
    FAIL_CONFIDENCE,
    FAILED,
    FINALISTS,
    INTERIM_SPEND,
    LOOKS,
    MIN_GAIN,
    Certification,
    Certifier,
    certification_notes,
    certification_promise,
    certified,
    certified_uniform,
    certify_chance,
    check_certifiable,
    expected_speedup,
    finalists,
    held_out_size,
    images_to_certify_unchanged,
)
from pomt.frontier.choice import Evaluated, FrontierResult, Goal, pareto_front
from pomt.stats import Proportion, chance_bound_within

DROP = 0.01  # one point
CERTIFIER = Certifier(1, 1000, 50, DROP, 0.95)  # looks at 250, 500, 750 and 1000 images


def z(confidence: float) -> float:
    """The one-sided standard normal quantile at `confidence`."""
    return NormalDist().inv_cdf(confidence)


def unchanged_bound(images: int, confidence: float) -> float:
    """The paired drop bound of a schedule that changed nothing against a reference right on every image: one minus
    the Wilson lower bound of n of n, z² / (n + z²)."""
    return z(confidence) ** 2 / (images + z(confidence) ** 2)


def fewest_unchanged(max_drop: float, confidence: float) -> int:
    """Fewest n with z² / (n + z²) <= max_drop: n >= z² (1 - d) / d."""
    n = math.ceil(z(confidence) ** 2 * (1 - max_drop) / max_drop)
    return n if unchanged_bound(n, confidence) <= max_drop else n + 1


def counts(images: int, lost: int, gained: int, reference_right: int | None = None) -> Proportion:
    """A paired count on `images` whose reference got `reference_right` right (default: all)."""
    base = images if reference_right is None else reference_right
    return Proportion(base - lost + gained, images, lost, gained)


# the sequential test


def test_each_finalist_spends_an_equal_share_of_the_family_wise_error():
    assert Certifier(4, 1000, 50, DROP, 0.95).error == pytest.approx(0.05 / 4)
    assert Certifier(1, 1000, 50, DROP, 0.9).error == pytest.approx(0.1)
    assert Certifier(0, 1000, 50, DROP, 0.9).error == pytest.approx(0.1)  # no finalist: the whole error, no division


@pytest.mark.parametrize(("images", "batch", "looks"), [
    (1000, 50, (250, 500, 750, 1000)),
    (1000, 32, (256, 512, 768, 1000)),  # whole batches at or past each share; the last is every image
    (1001, 1, (251, 501, 751, 1001)),
    (100, 50, (50, 100)),  # a quarter and a half both take the first batch; three quarters the last
    (10, 32, (10,)),  # one batch holds every image: a single look
    (1, 1, (1,)),
])
def test_the_looks_are_whole_batches_at_each_quarter_and_the_last_all_images(images, batch, looks):
    certifier = Certifier(1, images, batch, DROP, 0.95)
    assert certifier.looks == looks
    assert all(look % batch == 0 for look in looks[:-1]) and looks[-1] == images
    assert len(looks) <= len(LOOKS)


@pytest.mark.parametrize("certifier", [CERTIFIER, Certifier(4, 1000, 32, 0.005, 0.99), Certifier(3, 100, 50, DROP, 0.9),
                                       Certifier(2, 10, 32, DROP, 0.95)])
def test_the_looks_spend_the_interim_share_each_and_the_rest_at_the_last_summing_to_the_error(certifier):
    looks = certifier.looks
    spent = [1 - certifier.look_confidence(look) for look in looks]
    assert spent[:-1] == pytest.approx([certifier.error * INTERIM_SPEND] * (len(looks) - 1))
    assert spent[-1] == pytest.approx(certifier.error * (1 - INTERIM_SPEND * (len(looks) - 1)))
    assert sum(spent) == pytest.approx(certifier.error)  # a union bound over the looks keeps the finalist's error
    assert certifier.final_confidence() == certifier.look_confidence(certifier.images)


def test_a_count_off_the_looks_has_no_look_confidence():
    assert [CERTIFIER.look_confidence(n) for n in (0, 50, 249, 251, 800, 999, 1001)] == [None] * 7
    assert CERTIFIER.look_confidence(250) == pytest.approx(1 - 0.05 * INTERIM_SPEND)
    assert CERTIFIER.look_confidence(1000) == pytest.approx(1 - 0.05 * (1 - 3 * INTERIM_SPEND))


def test_an_unchanged_schedule_certifies_at_the_first_look_its_wilson_bound_reaches_the_goal():
    interim, last = 1 - 0.05 * INTERIM_SPEND, 1 - 0.05 * (1 - 3 * INTERIM_SPEND)
    assert unchanged_bound(750, interim) > DROP >= unchanged_bound(1000, last)  # z² / (n + z²) on each side
    assert CERTIFIER.verdict(counts(1000, 0, 0)) == CERTIFIED
    assert counts(1000, 0, 0).drop_bound(last) == pytest.approx(unchanged_bound(1000, last))
    assert not CERTIFIER.certified(counts(750, 0, 0))
    assert unchanged_bound(800, interim) <= DROP  # within the goal at the interim confidence, but 800 is no look
    assert not CERTIFIER.certified(counts(800, 0, 0)) and not CERTIFIER(counts(800, 0, 0))


def test_certified_only_at_a_look_and_only_with_the_drop_bound_at_its_confidence_within_the_goal():
    rates = ((0, 0), (0.002, 0), (0.006, 0.002), (0.01, 0), (0.012, 0.004), (0.024, 0.024), (0.08, 0.02))
    for trials in (100, 250, 300, 500, 750, 1000):
        for lost_rate, gained_rate in rates:
            lost, gained = round(lost_rate * trials), round(gained_rate * trials)
            for reference in (trials - trials // 5, None) if not gained else (trials - trials // 5,):
                measured = counts(trials, lost, gained, reference)
                confidence = CERTIFIER.look_confidence(trials)
                expected = confidence is not None and measured.drop_bound(confidence) <= DROP
                assert CERTIFIER.certified(measured) is expected, (trials, lost, gained, reference)
    assert not CERTIFIER.certified(Proportion(1000, 1000))  # not measured paired: nothing to certify


def test_a_drop_surely_beyond_the_goal_fails_after_any_batch():
    for measured in (counts(250, 20, 0), counts(300, 24, 0), counts(1000, 70, 20, 800)):  # drops of 8 and 5 points
        assert measured.drop_floor(FAIL_CONFIDENCE) > DROP
        assert CERTIFIER.failed(measured) and CERTIFIER(measured) and CERTIFIER.verdict(measured) == FAILED
    for measured in (counts(250, 3, 0), counts(1000, 10, 0), counts(300, 0, 0)):  # beyond it, but not surely
        assert measured.drop_floor(FAIL_CONFIDENCE) <= DROP and not CERTIFIER.failed(measured)
    assert not CERTIFIER.failed(Proportion(200, 250))
    for trials in (50, 250, 400, 1000):
        for lost_rate, gained_rate in ((0, 0), (0.005, 0), (0.015, 0.003), (0.03, 0), (0.09, 0.01)):
            lost, gained = round(lost_rate * trials), round(gained_rate * trials)
            measured = counts(trials, lost, gained, trials - trials // 4)
            assert CERTIFIER.failed(measured) is (measured.drop_floor(FAIL_CONFIDENCE) > DROP)


def test_the_test_stops_on_a_certified_or_a_failed_count_and_runs_on_otherwise():
    assert CERTIFIER(counts(1000, 0, 0))  # certified
    assert CERTIFIER(counts(250, 20, 0))  # failed
    assert not CERTIFIER(counts(250, 0, 0)) and not CERTIFIER(counts(500, 5, 0))
    assert CERTIFIER.verdict(counts(1000, 10, 0)) == FAILED  # every image seen, drop at the goal: not certified


def test_images_to_certify_is_none_beyond_the_goal_and_otherwise_at_least_the_trials():
    last = CERTIFIER.final_confidence()
    assert CERTIFIER.images_to_certify(counts(500, 20, 5, 400)) is None  # a drop of 3 points
    assert CERTIFIER.images_to_certify(counts(1000, 0, 0)) == 1000  # already within on these images
    assert CERTIFIER.images_to_certify(counts(100, 0, 0)) == fewest_unchanged(DROP, last) > 100
    needed = CERTIFIER.images_to_certify(counts(1000, 6, 0))  # 0.6 points: certifies on more images at these rates
    assert needed > 1000
    lost = round(6 * needed / 1000)
    assert counts(needed, lost, 0).drop_bound(last) <= DROP
    assert CERTIFIER.images_to_certify(Proportion(900, 1000)) is None  # not measured paired


def test_the_key_names_the_finalists_confidence_drop_and_batch_size():
    changed = [replace(CERTIFIER, finalists=2), replace(CERTIFIER, confidence=0.99),
               replace(CERTIFIER, max_drop=0.005), replace(CERTIFIER, batch_size=64)]
    keys = [c.key() for c in (CERTIFIER, *changed)]
    assert len(set(keys)) == len(keys)
    assert replace(CERTIFIER).key() == CERTIFIER.key()


# the promise, by Monte Carlo


def sequential(certifier: Certifier, probs: list[float], reps: int, seed: int) -> tuple[float, np.ndarray]:
    """Share certified and the images seen, over `reps` held-out samples whose images each fall in (both right,
    lost, gained, both wrong) with `probs`, measured batch by batch as `image_outcomes` does: stopped at the first
    batch the certifier accepts."""
    batches = math.ceil(certifier.images / certifier.batch_size)
    sizes = np.minimum(certifier.batch_size, certifier.images - certifier.batch_size * np.arange(batches))
    rng = np.random.default_rng(seed)
    running = np.stack([rng.multinomial(size, probs, size=reps) for size in sizes], axis=1).cumsum(axis=1)
    seen = sizes.cumsum()
    verdicts, stops = [], []
    for sample in running.tolist():
        for trials, (right, lost, gained, _) in zip(seen.tolist(), sample, strict=True):
            measured = Proportion(right + gained, trials, lost, gained)
            if certifier(measured):
                break
        verdicts.append(certifier.verdict(measured) == CERTIFIED)
        stops.append(measured.trials)
    return float(np.mean(verdicts)), np.array(stops)


@pytest.mark.parametrize(("certifier", "probs", "reps"), [
    (Certifier(4, 1000, 125, DROP, 0.95), [0.75, 0.03, 0.02, 0.20], 4000),  # lost 3 %, gained 2 %
    (Certifier(1, 1000, 125, DROP, 0.95), [0.99, 0.01, 0.0, 0.0], 2000),  # agreement: the reference is always right
    (Certifier(1, 600, 50, DROP, 0.95), [0.50, 0.06, 0.05, 0.39], 2000),  # much churn on few images
])
def test_a_schedule_whose_true_drop_is_the_goal_is_certified_at_most_at_the_finalists_error(certifier, probs, reps):
    assert probs[1] - probs[2] == pytest.approx(certifier.max_drop)
    share, stops = sequential(certifier, probs, reps, seed=0)
    standard_error = math.sqrt(certifier.error * (1 - certifier.error) / reps)
    assert share <= certifier.error + 3 * standard_error
    assert set(stops.tolist()) <= set(range(certifier.batch_size, certifier.images + 1, certifier.batch_size))


def test_a_schedule_that_changes_few_predictions_is_certified_mostly_and_mostly_before_the_last_look():
    certifier = Certifier(FINALISTS, 2000, 100, DROP, 0.95)  # looks at 500, 1000, 1500 and 2000
    share, stops = sequential(certifier, [0.797, 0.003, 0.003, 0.197], 300, seed=1)  # true drop 0
    assert share >= 0.95  # about 12 lost and 12 gained of 2000 at the last look: a bound near 2.3 sqrt(24) / 2000
    assert set(stops.tolist()) <= set(certifier.looks)
    assert np.mean(stops < certifier.images) >= 0.5


# how many images to hold out


def test_an_unchanged_schedule_needs_the_images_its_wilson_bound_takes_at_the_last_look():
    for max_drop, confidence, finalists_ in ((DROP, 0.95, 4), (0.005, 0.9, 1), (0.02, 0.99, 3)):
        last = 1 - (1 - confidence) / finalists_ * (1 - 3 * INTERIM_SPEND)
        assert images_to_certify_unchanged(max_drop, confidence, finalists_) == fewest_unchanged(max_drop, last)


def test_the_images_needed_grow_as_the_drop_shrinks_and_the_confidence_or_finalists_grow():
    drops = [0.05, 0.02, 0.01, 0.005, 0.002]
    by_drop = [images_to_certify_unchanged(d, 0.95) for d in drops]
    assert by_drop == sorted(by_drop) and len(set(by_drop)) == len(by_drop)
    by_confidence = [images_to_certify_unchanged(DROP, c) for c in (0.8, 0.9, 0.95, 0.99, 0.999)]
    assert by_confidence == sorted(by_confidence) and len(set(by_confidence)) == len(by_confidence)
    by_finalists = [images_to_certify_unchanged(DROP, 0.95, f) for f in (1, 2, 4, 8)]
    assert by_finalists == sorted(by_finalists) and len(set(by_finalists)) == len(by_finalists)


@pytest.mark.parametrize("images", [*range(2, 40), 808, 1000, 1001, 1002, 2400, 50_000])
def test_two_thirds_are_held_out_and_never_none_nor_every_image(images):
    held = held_out_size(images)
    assert 1 <= held <= images - 1
    assert abs(held - 2 * images / 3) < 1 or images < 3
    assert images - held >= images / 3 or images < 3


def test_too_few_held_out_images_are_refused_in_one_line_naming_the_images_needed():
    for max_drop, confidence, finalists_ in ((DROP, 0.95, 4), (0.005, 0.99, 2)):
        needed = images_to_certify_unchanged(max_drop, confidence, finalists_)
        check_certifiable(needed, max_drop, confidence, finalists_)
        check_certifiable(10 * needed, max_drop, confidence, finalists_)
        with pytest.raises(CalibrationError) as caught:
            check_certifiable(needed - 1, max_drop, confidence, finalists_)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"{needed - 1} held-out images cannot certify")
        assert f"that takes {needed} " in message and f"for {finalists_} finalists" in message
    for max_drop in (0.0, -0.01):
        with pytest.raises(CalibrationError, match="--max-accuracy-drop must be positive"):
            check_certifiable(10**6, max_drop, 0.95)


# the finalists


BASE = Evaluated(NONE, "unpruned", 10.0, counts(1000, 0, 0, 800))
GOAL = Goal(max_drop_points=1.0, confidence=0.95)


def point(removal: dict, family: str, ms: float, lost: int, gained: int, method: str = "tome") -> Evaluated:
    return Evaluated(Candidate.of(method, removal), family, ms, counts(1000, lost, gained, 800))


PLANNED = 1000  # held-out images the finalists are planned on
FAST_RISKY = point({0: 9}, "search", 5.0, 20, 11)  # 0.9 points measured on the search split: little chance
UNIFORM_RISKY = point({0: 8}, "tome-constant", 6.0, 15, 7)  # 0.8 points measured
NEXT_RISKY = point({0: 7}, "search", 6.5, 12, 4)  # 0.8 points measured
FAST_SAFE = point({0: 6}, "search", 7.0, 2, 2)  # 0 measured, few changed: likely to certify
BOLD = point({0: 10}, "search", 5.5, 25, 20)  # 0.5 measured over many changes: certifies on many images only
UNIFORM_SAFE = point({3: 60}, "topk-rate", 8.0, 1, 0, method="topk")  # 0.1 measured, very likely
LOSSY = point({0: 12}, "search", 4.0, 30, 5)  # 2.5 points measured: passes nothing
SLOWER = point({5: 1}, "search", 12.0, 0, 0)  # passes everything, predicted slower than unpruned
AS_SLOW = point({6: 1}, "tome-decreasing", 10.0, 0, 0)  # predicted as slow as unpruned
UNPRUNED_AGAIN = Evaluated(NONE, "tome-constant", 9.0, counts(1000, 0, 0, 800))  # r = 0 is the unpruned model
POINTS = (FAST_RISKY, UNIFORM_RISKY, NEXT_RISKY, FAST_SAFE, UNIFORM_SAFE, LOSSY, SLOWER, AS_SLOW, UNPRUNED_AGAIN)


def frontier(points=POINTS, baseline=BASE) -> FrontierResult:
    evaluated = (baseline, *points)
    return FrontierResult(baseline, evaluated, tuple(pareto_front(evaluated)), len(evaluated))


def plan(finalists_: int = FINALISTS, images: int = PLANNED) -> Certifier:
    return Certifier(finalists_, images, 1, DROP, GOAL.confidence)


def odds(point_: Evaluated, plan_: Certifier) -> tuple[float, float]:
    return BASE.predicted_ms / point_.predicted_ms, certify_chance(point_, BASE.search, plan_)


def test_the_search_split_figures_sit_where_the_finalists_test_needs_them():
    chances = {p: certify_chance(p, BASE.search, plan()) for p in POINTS if not p.candidate.unpruned}
    assert max(chances[p] for p in (FAST_RISKY, UNIFORM_RISKY, NEXT_RISKY)) < 0.2
    assert min(chances[p] for p in (FAST_SAFE, UNIFORM_SAFE)) > 0.7
    assert chances[UNIFORM_SAFE] > chances[FAST_SAFE]
    assert LOSSY.search.drop > 0.01
    assert {p.family for p in (UNIFORM_RISKY, UNIFORM_SAFE, AS_SLOW, UNPRUNED_AGAIN)} <= set(FAMILIES)
    assert "search" not in FAMILIES


def test_the_chance_to_certify_is_planned_on_a_loss_rate_above_the_measured_one():
    planned = certify_chance(FAST_SAFE, BASE.search, plan())
    search = FAST_SAFE.search
    at_measured = chance_bound_within(0.8, search.lost / 1000, search.gained / 1000, PLANNED, DROP,
                                      plan().final_confidence())
    assert 0 < planned < at_measured


def test_the_search_aims_at_the_chance_its_finalists_have_on_the_held_out_images():
    promise = certification_promise(GOAL, PLANNED, FINALISTS)
    for p in (FAST_RISKY, FAST_SAFE, UNIFORM_SAFE):
        assert promise(p, BASE) == certify_chance(p, BASE.search, plan())
    assert promise(FAST_SAFE, BASE) > 0.5 > promise(FAST_RISKY, BASE)
    assert certification_promise(GOAL, 4 * PLANNED)(FAST_SAFE, BASE) > promise(FAST_SAFE, BASE)


def test_a_count_stopped_early_or_not_paired_has_no_chance_to_certify():
    stopped = replace(FAST_SAFE, search=counts(300, 0, 0, 240))
    unpaired = replace(FAST_SAFE, search=Proportion(800, 1000))
    assert certify_chance(stopped, BASE.search, plan()) == 0.0
    assert certify_chance(unpaired, BASE.search, plan()) == 0.0


def test_the_chance_to_certify_grows_with_the_held_out_images_and_falls_with_the_finalists():
    by_images = [certify_chance(FAST_SAFE, BASE.search, plan(images=n)) for n in (400, 800, 1600, 3200)]
    by_finalists = [certify_chance(FAST_SAFE, BASE.search, plan(finalists_=k)) for k in (1, 2, 4, 8)]
    assert by_images == sorted(by_images) and by_images[0] < by_images[-1]
    assert by_finalists == sorted(by_finalists, reverse=True) and by_finalists[0] > by_finalists[-1]


@pytest.mark.parametrize(("picked", "expected"), [
    ([], 1.0), ([(2.0, 0.0)], 1.0), ([(2.0, 1.0)], 2.0), ([(2.0, 0.5)], 1.5),
    ([(2.0, 0.5), (1.5, 1.0)], 0.5 * 2.0 + 0.5 * 1.5), ([(1.5, 1.0), (2.0, 0.5)], 0.5 * 2.0 + 0.5 * 1.5),
    ([(3.0, 0.2), (2.0, 0.5), (1.2, 0.9)], 0.2 * 3 + 0.8 * 0.5 * 2 + 0.8 * 0.5 * (0.9 * 1.2 + 0.1)),
])
def test_the_expected_speedup_is_the_fastest_certified_ones_or_the_unpruned_models(picked, expected):
    assert expected_speedup(picked) == pytest.approx(expected)


def test_a_uniform_schedule_leads_the_finalists_and_each_further_one_raises_the_expected_speedup():
    for images in (600, PLANNED, 3000):
        chosen = finalists(frontier(), GOAL, images)
        assert 1 < len(chosen) <= FINALISTS and len(set(chosen)) == len(chosen)
        assert chosen[0] == UNIFORM_SAFE and FAST_SAFE in chosen
        for size in range(1, len(chosen)):
            before = expected_speedup([odds(p, plan(len(chosen), images)) for p in chosen[:size]])
            after = expected_speedup([odds(p, plan(len(chosen), images)) for p in chosen[:size + 1]])
            assert after > before


def test_the_finalists_beat_every_pair_led_by_a_uniform_schedule_in_expected_speedup():
    chosen = finalists(frontier(), GOAL, PLANNED)
    mine = expected_speedup([odds(p, plan(len(chosen))) for p in chosen])
    pool = [FAST_RISKY, UNIFORM_RISKY, NEXT_RISKY, FAST_SAFE, UNIFORM_SAFE]
    for uniform in (UNIFORM_RISKY, UNIFORM_SAFE):
        for other in pool:
            assert mine >= expected_speedup([odds(uniform, plan(2)), odds(other, plan(2))]) - 1e-9


def test_more_held_out_images_make_the_finalists_bolder():
    points = (*POINTS, BOLD)
    few, many = finalists(frontier(points), GOAL, 600), finalists(frontier(points), GOAL, 20_000)
    assert BOLD not in few and BOLD in many
    assert min(p.predicted_ms for p in many) < min(p.predicted_ms for p in few)


def test_one_finalist_is_the_single_best_bet_and_none_is_none():
    (one,) = finalists(frontier(), GOAL, PLANNED, count=1)
    pool = [FAST_RISKY, UNIFORM_RISKY, NEXT_RISKY, FAST_SAFE, UNIFORM_SAFE]
    assert one == max(pool, key=lambda p: expected_speedup([odds(p, plan(1))]))
    assert finalists(frontier(), GOAL, PLANNED, count=0) == []


def test_a_schedule_that_adds_less_than_the_least_gain_is_no_finalist():
    hopeless = replace(FAST_RISKY, predicted_ms=8.0, search=counts(1000, 30, 20, 800))  # 1 point measured
    assert (BASE.predicted_ms / hopeless.predicted_ms - 1) * certify_chance(hopeless, BASE.search, plan(1)) < MIN_GAIN
    assert finalists(frontier((hopeless,)), GOAL, PLANNED) == []
    assert finalists(frontier((hopeless, FAST_SAFE)), GOAL, PLANNED) == [FAST_SAFE]


def test_nothing_slower_than_unpruned_nor_the_unpruned_model_is_a_finalist():
    picked = finalists(frontier(), GOAL, PLANNED, count=100)
    assert not {SLOWER, AS_SLOW, UNPRUNED_AGAIN, LOSSY, BASE} & set(picked)
    assert finalists(frontier((SLOWER, AS_SLOW, UNPRUNED_AGAIN, LOSSY)), GOAL, PLANNED, count=100) == []


# the certification's record


FAILED_EARLY = counts(250, 20, 0)  # stopped failed at the first look
FAILED_OFF_LOOK = counts(300, 24, 0)  # stopped failed between looks
AT_THE_GOAL = counts(1000, 10, 0)  # every image, a drop of 1 point: never certifies
CLOSE = counts(1000, 6, 0)  # every image, 0.6 points: certifies on more
PASSED = counts(1000, 0, 0)


def record(*helds: Proportion | None, certifier: Certifier = CERTIFIER) -> Certification:
    families = ["tome-constant", "search", "topk-rate", "search", "tome-decreasing", "search"]
    points = tuple(Evaluated(Candidate.of("tome", {0: i + 1}), families[i], 9.0 - i, counts(1000, 0, 0), held)
                   for i, held in enumerate(helds))
    return Certification(certifier, points)


def test_the_verdicts_and_the_certified_finalists():
    cert = record(PASSED, FAILED_EARLY, AT_THE_GOAL, None, FAILED_OFF_LOOK)
    assert [cert.verdict(p) for p in cert.finalists] == [CERTIFIED, FAILED, FAILED, FAILED, FAILED]
    assert cert.certified == cert.finalists[:1]


def test_the_bound_is_judged_at_the_look_it_stopped_at_else_at_the_last():
    cert = record(PASSED, FAILED_EARLY, FAILED_OFF_LOOK)
    passed, early, off = cert.finalists
    assert cert.bound(passed) == pytest.approx(unchanged_bound(1000, CERTIFIER.final_confidence()))
    assert cert.bound(early) == pytest.approx(FAILED_EARLY.drop_bound(1 - 0.05 * INTERIM_SPEND))
    assert cert.bound(off) == pytest.approx(FAILED_OFF_LOOK.drop_bound(CERTIFIER.final_confidence()))
    assert cert.bound(early) > cert.bound(off) > 0.08  # the same 8-point drop, more images, a laxer confidence


def test_a_row_states_the_drop_and_bound_in_points_and_what_more_images_would_certify():
    cert = record(PASSED, FAILED_EARLY, CLOSE, AT_THE_GOAL)
    passed, early, close, at_goal = (cert.row(p) for p in cert.finalists)
    bound_points = passed.pop("bound_points")
    assert bound_points == pytest.approx(100 * unchanged_bound(1000, CERTIFIER.final_confidence()), abs=1e-3)
    assert passed == {"key": "tome:0=1", "family": "tome-constant", "verdict": CERTIFIED, "images": 1000, "lost": 0,
                      "gained": 0, "drop_points": 0.0, "images_to_certify": None}
    assert (early["verdict"], early["images"], early["lost"], early["drop_points"]) == (FAILED, 250, 20, 8.0)
    assert early["images_to_certify"] is None and early["bound_points"] > 8.0
    assert (close["verdict"], close["drop_points"]) == (FAILED, 0.6) and close["bound_points"] > 1.0
    assert close["images_to_certify"] == CERTIFIER.images_to_certify(CLOSE) > 1000
    assert at_goal["images_to_certify"] is None  # at these rates the bound stays above the drop, the goal itself


def test_the_record_states_the_test_and_every_finalist():
    cert = record(PASSED, CLOSE)
    assert cert.to_dict() == {"confidence": 0.95, "finalists": 1, "held_out_images": 1000,
                              "looks": [250, 500, 750, 1000], "max_drop_points": 1.0,
                              "schedules": [cert.row(p) for p in cert.finalists]}


def test_the_notes_name_each_finalist_not_certified_and_the_images_that_would_certify_it():
    cert = record(PASSED, CLOSE, FAILED_EARLY, certifier=replace(CERTIFIER, finalists=3))
    lines = certification_notes(cert, held_out_share=0.5)
    assert len(lines) == 3 and lines[0].startswith("certified 1 of 3 finalists on up to 1000 held-out images")
    more = cert.certifier.images_to_certify(CLOSE)
    assert lines[1].startswith("not certified: tome:0=2 (search)")
    assert f"about {more} held-out images would certify it (--accuracy-samples {math.ceil(more / 0.5)}" in lines[1]
    assert lines[2].startswith("not certified: tome:0=3 (topk-rate)") and "would certify" not in lines[2]


def test_the_uniform_schedule_to_beat_is_the_fastest_certified_of_a_uniform_family():
    cert = record(PASSED, PASSED, PASSED, PASSED, FAILED_EARLY)  # 9, 8 (search), 7, 6 (search), 5 ms (failed)
    assert certified_uniform(cert) == cert.finalists[2]  # topk-rate at 7 ms
    assert certified_uniform(record(FAILED_EARLY, PASSED)) is None  # only a non-uniform one certified


# certifying a frontier


class HeldOutOutcomes:
    """Fixed per-image outcomes of the held-out images behind the calibration's `size` and `measure`, each finalist
    run through the certifier batch by batch as `image_outcomes` runs it. A stand-in for `Calibration`, which needs
    a model to produce the outcomes; the certifier and the rest of the certification are the real ones."""

    def __init__(self, outcomes: dict[Candidate, np.ndarray], images: int) -> None:
        self.outcomes, self.images, self.asked = outcomes, images, []

    def size(self, split: str) -> int:
        return self.images if split == HELD_OUT else 10 * self.images

    def measure(self, candidates, split, stop_above=None, certifier=None) -> dict[Candidate, Proportion]:
        assert split == HELD_OUT and stop_above is None and certifier is not None
        self.asked.append((list(candidates), certifier))
        reference = np.ones(self.images, dtype=bool)  # agreement: the unpruned model is right on every image
        found = {}
        for candidate in candidates:
            right = self.outcomes.get(candidate, reference)
            for end in range(certifier.batch_size, self.images + certifier.batch_size, certifier.batch_size):
                seen = min(end, self.images)
                measured = Proportion(int(right[:seen].sum()), seen, int((reference[:seen] & ~right[:seen]).sum()),
                                      int((right[:seen] & ~reference[:seen]).sum()))
                if not candidate.unpruned and certifier(measured):
                    break
            found[candidate] = measured
        return found


def losing_every(step: int, images: int = 4000) -> np.ndarray:
    right = np.ones(images, dtype=bool)
    right[step - 1::step] = False
    return right


LOSES_3 = Evaluated(Candidate.of("pomt", {3: 40}), "search", 5.0, counts(1000, 6, 0))  # held out: 3 points lost
LOSES_08 = Evaluated(Candidate.of("tome", dict.fromkeys(range(12), 2)), "tome-decreasing", 6.0, counts(1000, 4, 0))
KEEPS = Evaluated(Candidate.of("tome", dict.fromkeys(range(12), 1)), "tome-constant", 7.0, counts(1000, 0, 0))
MISSES = Evaluated(Candidate.of("topk", {3: 50}), "topk-rate", 4.0, counts(1000, 30, 0))  # 3 points on the search
HELD = {LOSES_3.candidate: losing_every(33), LOSES_08.candidate: losing_every(125),
        KEEPS.candidate: np.ones(4000, dtype=bool)}


def test_the_finalists_are_certified_on_the_held_out_images_at_the_goal_shared_among_them():
    baseline = Evaluated(NONE, "unpruned", 10.0, counts(1000, 0, 0))
    measures = HeldOutOutcomes(HELD, 4000)
    found, cert = certified(frontier((MISSES, LOSES_3, LOSES_08, KEEPS), baseline), GOAL, measures, 4, 100)
    assert cert.certifier == Certifier(3, 4000, 100, 0.01, 0.95)  # looks at 1000, 2000, 3000 and 4000 images
    assert [p.candidate for p in cert.finalists] == [KEEPS.candidate, LOSES_08.candidate, LOSES_3.candidate]
    [(asked, certifier)] = measures.asked
    assert asked == [NONE, KEEPS.candidate, LOSES_08.candidate, LOSES_3.candidate] and certifier is cert.certifier
    assert [cert.verdict(p) for p in cert.finalists] == [CERTIFIED, FAILED, FAILED]
    kept, close, lossy = (p.held_out for p in cert.finalists)
    assert lossy.trials < 4000 and lossy.trials % 100 == 0 and lossy.drop > 0.02  # stopped once surely beyond
    assert (close.trials, close.lost, close.gained) == (4000, 32, 0)  # 0.8 points: not certified on 4000 images
    assert cert.row(cert.finalists[1])["images_to_certify"] > 4000
    interim = 1 - (0.05 / 3) * INTERIM_SPEND
    first = next(look for look in cert.certifier.looks if unchanged_bound(look, interim) <= DROP)
    assert (kept.trials, kept.lost) == (first, 0) and first < 4000  # certified at its first look within the goal
    assert found.baseline.held_out == Proportion(4000, 4000, 0, 0)
    assert {e.candidate for e in found.evaluated if e.held_out is not None} == {NONE, *HELD}
    assert certified_uniform(cert).candidate == KEEPS.candidate


def test_fewer_finalists_share_the_error_among_fewer():
    baseline = Evaluated(NONE, "unpruned", 10.0, counts(1000, 0, 0))
    found, cert = certified(frontier((LOSES_3, LOSES_08, KEEPS), baseline), GOAL, HeldOutOutcomes(HELD, 4000), 1, 100)
    assert cert.certifier == Certifier(1, 4000, 100, 0.01, 0.95)
    assert [p.candidate for p in cert.finalists] == [LOSES_08.candidate] and cert.certified == ()
    assert certified_uniform(cert) is None
    assert next(e for e in found.evaluated if e.candidate == KEEPS.candidate).held_out is None
