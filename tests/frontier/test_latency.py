"""Latency of any schedule from one curve plus each reducer's own cost: synthetic curves, no timing."""

import contextlib

import numpy as np
import pytest
import torch

from pomt.frontier.candidates import Candidate, uniform_families
from pomt.frontier.latency import LatencyModel, MixedCounts, ReducerCost, count_changes, has_trend
from pomt.frontier.reducer_costs import (
    UNPRUNED,
    _differences,
    _paired_rounds,
    _variant,
    at_unit_speed,
    cost_function,
    cost_points,
    measure_mixed_counts,
    measure_reducer_costs,
    mixed_layout,
    paired_variants,
    repeat_schedule,
)
from pomt.models.registry import create_model
from pomt.models.tokens import truncate_tokens
from pomt.offline.choose import mixed_note
from pomt.policies import predict_latency
from pomt.verification.verify import Rounds, TimedModel

from conftest import entering_counts

N, P, D = 50, 1, 12
CURVE = {n: 5.0 + 0.2 * n - (1.5 if n <= 40 else 0.0) for n in range(P + 1, N + 1)}  # a step at 41 -> 40


def block(n: int) -> float:
    return CURVE[n] / D


def test_the_unpruned_model_costs_the_curve_at_n():
    assert LatencyModel(CURVE, N, P, D).baseline == pytest.approx(CURVE[N])


def test_a_single_pomt_block_is_priced_as_the_policy_prices_it():
    costs = {8: 0.03, 20: -0.01}
    model = LatencyModel(CURVE, N, P, D, {"pomt": ReducerCost("pomt", P, {(N, r): ms for r, ms in costs.items()})})
    for remove in (8, 20):
        expected = predict_latency(CURVE, N, D, [(3, remove)], cost_function(costs))
        assert model.predict(Candidate.of("pomt", {3: remove})) == pytest.approx(expected)


def test_blocks_are_charged_at_the_counts_entering_them_with_tomes_clamping():
    model = LatencyModel(CURVE, N, P, D)
    candidate = Candidate.of("tome", {0: 30, 1: 5})  # 49 patch tokens: ToMe merges at most 24, then 5
    assert model.counts(candidate)[:3] == [50, 26, 21]
    assert model.predict(candidate) == pytest.approx(block(50) + block(26) + (D - 2) * block(21))


def test_reducer_costs_interpolate_in_share_then_count_and_hold_outside():
    cost = ReducerCost("topk", 0, {(48, 12): 1.0, (48, 24): 2.0, (24, 6): 0.2, (24, 12): 0.4})
    assert cost.prune(48, 0) == 0.0
    assert cost.prune(48, 18) == pytest.approx(1.5)  # share 0.375: halfway between the measured shares
    assert cost.prune(36, 9) == pytest.approx((1.0 + 0.2) / 2)  # share 0.25 at both counts, halfway
    assert cost.prune(36, 18) == pytest.approx((2.0 + 0.4) / 2)
    assert cost.prune(48, 40) == pytest.approx(2.0) and cost.prune(10, 1) == pytest.approx(0.2)  # held
    assert ReducerCost.from_dict(cost.to_dict()) == cost


def test_three_or_more_shares_are_fitted_by_a_line_that_averages_their_noise():
    # a fixed 0.6 ms less 2 ms per share removed, read with +-0.1 ms of noise at the middle point
    cost = ReducerCost("pomt", 0, {(48, 1): 0.6 - 2 / 48, (48, 12): 0.6 - 0.5 + 0.1, (48, 24): 0.6 - 1.0})
    exact = [0.6 - 2 * share for share in (1 / 48, 0.25, 0.5)]
    fitted = [cost.prune(48, r) for r in (1, 12, 24)]
    assert fitted[1] == pytest.approx(exact[1] + 0.1 / 3, abs=1e-3)  # a third of the noise stays
    assert fitted[0] > exact[0] and fitted[2] > exact[2]  # and the rest is shared by the others
    assert cost.prune(48, 36) == pytest.approx(fitted[2])  # held beyond the largest share


def test_the_carry_is_the_counts_median_unless_they_show_a_trend_so_one_noisy_count_does_not_price_every_block():
    noisy = {13: 0.3, 19: 0.3, 26: -0.3, 38: 0.3, 49: 0.3}  # one count read 0.6 ms low
    cost = ReducerCost("tome", 1, {(50, 4): 0.0}, noisy)
    assert cost.carry(26) == pytest.approx(0.3)  # interpolation charged -0.3 there, a line 0.18
    # the batch-16 digits case (2026-11-28): a line through these (slope p = 0.10) charged -0.49 ms at 48 tokens
    read = {13: 0.071, 19: 0.052, 24: 0.244, 26: -0.355, 38: -0.017, 49: -0.695}
    assert not has_trend(list(read), list(read.values()))
    assert ReducerCost("tome", 1, {}, read).carry(48) == pytest.approx(0.0175)
    rising = {13: 0.10, 19: 0.16, 26: 0.21, 38: 0.37, 49: 0.45}  # a trend the points show is charged as a line
    assert has_trend(list(rising), list(rising.values()))
    line = ReducerCost("tome", 1, {}, rising)
    assert line.carry(13) < line.carry(30) < line.carry(49)
    assert line.carry(5) == pytest.approx(line.carry(13)) and line.carry(60) == pytest.approx(line.carry(49))
    assert ReducerCost("tome", 1, {}, {20: 0.1, 40: 0.3}).carry(30) == pytest.approx(0.2)  # two: interpolated
    assert ReducerCost("tome", 1, {}, dict.fromkeys((13, 26, 49), 0.2)).carry(40) == pytest.approx(0.2)


def test_tomes_proportional_attention_is_charged_after_its_first_merge_only():
    carry = {50: 0.1, 20: 0.1}
    model = LatencyModel(CURVE, N, P, D, {"tome": ReducerCost("tome", P, {(N, 4): 0.05}, carry)})
    plain = LatencyModel(CURVE, N, P, D)
    candidate = Candidate.of("tome", {2: 4, 5: 4})
    # merges at blocks 2 and 5 (0.05 each: held beyond the measured count), proportional attention in 3..11
    assert model.predict(candidate) == pytest.approx(plain.predict(candidate) + 2 * 0.05 + 9 * 0.1)


def test_merges_right_after_a_merge_are_charged_what_the_whole_model_calibration_says_they_save():
    cost = ReducerCost("tome", P, {(N, 4): 0.3}, {50: 0.1, 20: 0.1}, later=-0.2)
    model = LatencyModel(CURVE, N, P, D, {"tome": cost})
    without = LatencyModel(CURVE, N, P, D, {"tome": ReducerCost("tome", P, {(N, 4): 0.3}, {50: 0.1, 20: 0.1})})
    once, spaced = Candidate.of("tome", {2: 4}), Candidate.of("tome", {2: 4, 5: 4, 7: 4})
    in_a_row = Candidate.of("tome", {2: 4, 3: 4, 4: 4, 8: 4})
    assert model.predict(once) == pytest.approx(without.predict(once))  # one merge: nothing to save
    # spaced merges run as a merge measured alone (on the digits case, charging them `later` put ToMe at
    # spaced blocks 0.9-2.1% under what it ran); blocks 3 and 4 follow a merge, block 8 does not
    assert model.predict(spaced) == pytest.approx(without.predict(spaced))
    assert model.predict(in_a_row) == pytest.approx(without.predict(in_a_row) - 2 * 0.2)
    assert ReducerCost.from_dict(cost.to_dict()) == cost
    old = {k: v for k, v in cost.to_dict().items() if k != "later"}  # a costs file written before `later`
    assert ReducerCost.from_dict(old).later == 0.0


def test_costs_are_charged_at_the_curves_speed_not_the_speed_they_were_measured_at():
    """Costs measured while the unpruned model ran in 10 ms, charged beside a curve whose L(N) is 15 ms (the
    machine a half slower): every cost, carry and later saving half as large again."""
    cost = ReducerCost("tome", P, {(N, 4): 0.3, (N, 12): 0.5}, {50: 0.1, 20: 0.1}, later=-0.2, unit_ms=10.0)
    slow = cost.at_speed(15.0)
    assert slow.prune(N, 8) == pytest.approx(1.5 * cost.prune(N, 8))
    assert slow.carry(30) == pytest.approx(0.15) and slow.later == pytest.approx(-0.3) and slow.unit_ms == 15.0
    assert ReducerCost("tome", P, {(N, 4): 0.3}).at_speed(15.0).prune(N, 4) == 0.3  # unit unknown: as measured
    schedule = Candidate.of("tome", {2: 4, 5: 4, 7: 4})
    plain = LatencyModel(CURVE, N, P, D)
    at_unit = LatencyModel({n: ms * 10.0 / CURVE[N] for n, ms in CURVE.items()}, N, P, D, {"tome": cost})
    at_slow = LatencyModel({n: ms * 15.0 / CURVE[N] for n, ms in CURVE.items()}, N, P, D, {"tome": cost})
    reducer_share = [m.predict(schedule) / m.baseline - plain.predict(schedule) / plain.baseline
                     for m in (at_unit, at_slow)]
    assert reducer_share[0] > 0.01 and reducer_share[1] == pytest.approx(reducer_share[0])  # drift cancels
    assert ReducerCost.from_dict(cost.to_dict()) == cost
    old = {k: v for k, v in cost.to_dict().items() if k != "unit_ms"}  # a costs file written before the unit
    assert ReducerCost.from_dict(old).unit_ms is None


def test_mixed_counts_are_charged_by_the_square_root_of_the_changes_as_the_run_calibrated_them():
    """The calibration layout (11 count changes) ran 3.3% over its blocks' sum timed beside it: a schedule that
    changes its count once pays 3.3% / sqrt(11) of its blocks' sum, twice sqrt(2) times that; the unpruned model
    and a removal at the last block (no block sees another count) pay nothing. The curve the schedules are priced
    from does not enter the calibration: its shape at the layout's counts moves from minute to minute."""
    layout = mixed_layout(N, P, D)
    assert count_changes(layout, D) == 11
    plain = LatencyModel(CURVE, N, P, D)
    assert plain.predict_counts(layout) == pytest.approx(sum(block(n) for n in layout) / CURVE[N])
    mixed = MixedCounts(layout, 1.033, (1.01, 1.06), 0.8)
    model = LatencyModel(CURVE, N, P, D, mixed=mixed)
    kappa = 0.033 / np.sqrt(11)
    assert model.kappa == pytest.approx(kappa)
    assert LatencyModel({n: 2 * ms for n, ms in CURVE.items()}, N, P, D, mixed=mixed).kappa == pytest.approx(kappa)
    once, twice = Candidate.of("pomt", {3: 8}), Candidate.of("pomt", {3: 8, 7: 8})
    for candidate, changes in ((once, 1), (twice, 2)):
        blocks = plain.predict(candidate)
        assert model.predict(candidate) == pytest.approx(blocks * (1 + kappa * np.sqrt(changes)))
    assert model.baseline == plain.baseline
    last = Candidate.of("pomt", {D - 1: 8})
    assert count_changes(model.counts(last), D) == 0 and model.predict(last) == plain.predict(last)
    assert MixedCounts.from_dict(mixed.to_dict()) == mixed
    with pytest.raises(KeyError):  # saved before 2026-12-01, against the curve: measured again, never misread
        MixedCounts.from_dict({"layout": list(layout), "ratio": 0.8, "ci": [0.79, 0.81]})
    held = MixedCounts(layout, 1.033, (0.99, 1.06), 0.8)  # its interval holds no excess
    assert LatencyModel(CURVE, N, P, D, mixed=held).kappa == 0.0
    faster = MixedCounts(layout, 0.98, (0.97, 0.99), 0.8)  # a machine that gains
    assert LatencyModel(CURVE, N, P, D, mixed=faster).predict(once) < plain.predict(once)
    assert mixed_note(model) == ("mixed counts: a layout that changes its count at every block ran +3.3% "
                                 "[+1.0, +6.0] over its blocks' sum timed beside it; a schedule whose counts change "
                                 "c times is charged +0.99% x sqrt(c) of its blocks",)
    assert mixed_note(LatencyModel(CURVE, N, P, D, mixed=held)) == mixed_note(plain) == ()  # nothing charged


def test_the_mixed_counts_calibration_times_its_layout_beside_its_blocks():
    """The layout, the whole model at each of its counts and the unpruned model in the same rounds; the layout
    over its blocks' sum, each round's visits against each other."""
    model = create_model("test_vit", 64).eval()  # 17 tokens, 6 blocks
    x = torch.randn(1, 3, 64, 64)
    visited = []
    model.blocks[1].register_forward_pre_hook(lambda _m, args: visited.append(args[0].shape[1]))
    mixed = measure_mixed_counts(TimedModel(model, x), Rounds(2, 1))
    assert mixed.layout == mixed_layout(17, 1, 6) and count_changes(mixed.layout, 6) == 5
    assert mixed.ci[0] <= mixed.over_blocks <= mixed.ci[1] and mixed.of_unpruned > 0
    variants = len(set(mixed.layout)) + 1  # the whole model at each count (the unpruned one among them), the layout
    assert set(visited) == set(mixed.layout)  # block 1 sees each count whole, and the layout's second count
    assert len(visited) == 2 * variants + variants  # two rounds, and one untimed forward at each first visit


def test_each_rounds_times_are_divided_by_that_rounds_speed():
    """The machine slows by 40% over the rounds: every variant's time rises with it. Divided by each round's
    speed (the unpruned model's time over the median), the reducer's difference reads the same in every round,
    the cost at the median speed, where undivided it spread over 0.5-0.7 ms."""
    speed = np.linspace(1.0, 1.4, 15)
    reducer, reference = paired_variants("pomt", 1, 17, 4)
    times = {UNPRUNED: list(10.0 * speed), reducer: list(2.5 * speed), reference: list(2.0 * speed)}
    steady = at_unit_speed(times, unit_ms=float(np.median(times[UNPRUNED])))
    assert steady[UNPRUNED] == pytest.approx([12.0] * 15)
    assert np.subtract(steady[reducer], steady[reference]) == pytest.approx([0.6] * 15)
    assert np.ptp(np.subtract(times[reducer], times[reference])) == pytest.approx(0.2)
    assert _differences(steady) == {reducer: pytest.approx(0.6)}


def test_the_calibration_schedule_merges_at_every_block_at_the_families_middle_r():
    candidate = repeat_schedule(50, 1, 12)
    assert candidate.method == "tome" and candidate in uniform_families(50, 1, 12)["tome-constant"]
    assert candidate.as_dict() == dict.fromkeys(range(12), 3)  # r in 1..5: the middle one


def test_cost_points_stay_within_what_each_reducer_can_remove():
    assert cost_points(50, 1, "pomt", [50, 25], (0.25, 0.5)) == [(25, 6), (25, 12), (50, 12), (50, 24)]
    assert cost_points(50, 1, "tome", [50], (0.25, 0.75)) == [(50, 12), (50, 24)]


def test_measured_reducer_costs_have_the_structure_the_prediction_reads():
    model = create_model("test_vit", 64)  # 17 tokens, 6 blocks
    costs = measure_reducer_costs(TimedModel(model, torch.randn(2, 3, 64, 64)), ["pomt", "tome"], Rounds(2))
    assert set(costs) == {"pomt", "tome"}
    assert sorted(costs["pomt"].pruning) == cost_points(17, 1, "pomt", [17, 9])
    assert costs["pomt"].carrying == {}
    assert sorted(costs["tome"].carrying) == sorted({n - r for n, r in cost_points(17, 1, "tome", [17, 9])})
    assert costs["tome"].later != 0.0 and costs["pomt"].later == 0.0  # calibrated on the whole model: ToMe only
    assert costs["pomt"].unit_ms == costs["tome"].unit_ms > 0  # the unpruned model's time in the same rounds
    timed = TimedModel(model, torch.randn(2, 3, 64, 64))
    single = measure_reducer_costs(timed, ["tome"], Rounds(2), later=False)["tome"]
    assert single.later == 0.0 and single.carrying  # one pruning block (the step policy): no calibration asked
    assert all(isinstance(ms, float) for ms in costs["tome"].pruning.values())
    latency = LatencyModel({n: float(n) for n in range(2, 18)}, 17, 1, 6, costs)
    assert isinstance(latency.predict(Candidate.of("tome", {0: 2, 3: 2})), float)


@pytest.mark.parametrize("backend", ["compile", "onnxruntime"])
def test_reducer_costs_are_measured_only_where_the_live_model_runs(backend):
    """A static program exported per count is not the model patched and cut in place: refused in one line
    (the offline computation notes it and leaves costs out there); eager and cudagraph are measured."""
    model = create_model("test_vit", 64)
    with pytest.raises(ValueError, match=f"live model runs \\(eager, cudagraph\\), not on {backend}"):
        measure_reducer_costs(TimedModel(model, torch.randn(1, 3, 64, 64), backend=backend), ["pomt"], Rounds(2))
    with pytest.raises(ValueError, match="live model runs"):
        measure_mixed_counts(TimedModel(model, torch.randn(1, 3, 64, 64), backend=backend), Rounds(2))


def test_on_the_cpu_eager_each_variant_is_set_up_once_then_timed_at_once():
    """The untimed forward of a visit (`settles_every_visit`): on the CPU, eager, at a variant's first visit only."""
    model = create_model("test_vit", 64)
    x = torch.randn(1, 3, 64, 64)
    forwards = []
    model.blocks[0].register_forward_pre_hook(lambda _m, args: forwards.append(args[0].shape[1]))
    contexts = {17: contextlib.nullcontext, 9: lambda: truncate_tokens(model, 9)}
    times = _paired_rounds(TimedModel(model, x, threads=1), contexts, rounds=3, reps=2, seed=0)
    assert {k: len(v) for k, v in times.items()} == {17: 3, 9: 3}
    assert sorted(forwards) == [9] * 7 + [17] * 7  # one untimed, then two timed a round, for each variant


def tokens_entering_blocks(model, x, variant, depth: int) -> list[int]:
    def run():
        with _variant(model, variant, 17, depth), torch.inference_mode():
            model(x)

    return entering_counts(model, run)


@pytest.mark.parametrize("tokens", [17, 9])
def test_a_cost_is_timed_against_the_same_counts_at_every_block(tokens):
    """The reference of a reducer's cost (here ToMe merging at block 0 of the whole model, where its carry is
    measured) runs every block at the count the reducer leaves: only the reducer's own work differs."""
    model = create_model("test_vit", 64).eval()  # 17 tokens, 6 blocks
    x = torch.randn(1, 3, 64, 64)
    merged, reference = paired_variants("tome", 0, tokens, 4)
    counts = tokens_entering_blocks(model, x, merged, 6)
    assert counts == [tokens] + [tokens - 4] * 5
    assert tokens_entering_blocks(model, x, reference, 6) == counts
