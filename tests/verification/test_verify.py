"""Verification of a schedule against the unpruned model, the method's cost at its block, and a verified
schedule's GPU work against its verified latency.

Decisions are tested on replayed variants with known latencies (a trace whose "kept tokens" are the
candidates); the live path runs for real on a tiny ViT and is checked for what it measured, not speed.
"""

import math

import pytest
import torch

import pomt
from pomt.formats.schedule import BlockRemoval, Schedule
from pomt.frontier.latency import ReducerCost
from pomt.frontier.reducer_costs import cost_function, method_cost, one_block_cost
from pomt.measurement.sources import LiveSource, MeasurementRun, ReplaySource
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.verification.verify import (
    BUSY_FLOOR,
    CandidateResult,
    Criterion,
    GpuWork,
    Rounds,
    TimedModel,
    choose,
    measure_gpu_work,
    schedule_forward_at,
    verify,
    verify_rounds,
)

from support.trace_data import N, synthetic_trace


def variants(latency: dict[int, float], noise: float = 0.01, passes: int = 14):
    """A replayable device whose 'count' k is the model keeping k tokens, at the given latencies."""
    return MeasurementRun(ReplaySource(synthetic_trace(lambda k: latency[k], counts=list(latency), passes=passes,
                                                noise=noise, drift=lambda t: 1.0 + 0.3 * math.sin(t / 5))))


def test_the_fewest_removed_within_a_step_of_the_fastest_ships():
    # 20 removed is 10% faster, 26 removed 11%: within the minimum step, the smaller removal ships
    found = verify(variants({N: 20.0, N - 20: 18.0, N - 26: 17.8}), N, {20: 0.9, 26: 0.85}, Rounds(10, 3),
                   progress=False)
    assert found.chosen is not None and found.chosen.remove == 20
    assert found.chosen.speedup == pytest.approx(20 / 18, rel=0.02)
    assert found.chosen.speedup_ci[0] > 1.0
    assert found.chosen.predicted_ms == pytest.approx(0.9 * found.unpruned_ms)
    record = found.record("abc")
    assert record.speedup == pytest.approx(found.chosen.speedup, abs=1e-4)
    assert record.prediction_error == pytest.approx(found.chosen.pruned_ms / (0.9 * found.unpruned_ms) - 1, abs=1e-3)
    assert [c["remove"] for c in record.candidates] == [20, 26]
    assert record.device_fingerprint_hash == "abc" and record.samples == 10 * 3


def test_a_removal_that_costs_more_than_it_saves_is_never_shipped():
    found = verify(variants({N: 20.0, N - 10: 20.6, N - 30: 20.1}), N, dict.fromkeys([10, 30]), Rounds(10, 3),
                   progress=False)
    assert found.chosen is None
    assert "no candidate is measurably faster" in found.reason
    record = found.record("abc")
    assert record.speedup == 1.0 and record.pruned_ms == record.unpruned_ms
    slower = next(c for c in found.candidates if c.remove == 10)
    assert slower.speedup < 1 and not slower.qualifies


def test_a_gain_below_the_minimum_does_not_qualify():
    found = verify(variants({N: 20.0, N - 10: 19.6}, noise=0.002), N, {10: None}, Rounds(10, 3),
                   Criterion(min_gain=0.03), progress=False)
    assert found.chosen is None and found.candidates[0].speedup_ci[0] > 1.0  # real, but only 2%


def test_choose_orders():
    def result(remove, speedup, qualifies=True):
        return CandidateResult(remove, 10 / speedup, speedup, (speedup - 0.01, speedup + 0.01), 1e-4, qualifies)
    assert choose([], 0.03, 0.03)[0] is None
    assert choose([result(10, 1.2), result(20, 1.3)], 0.03, 0.03)[0].remove == 20
    assert choose([result(10, 1.28), result(20, 1.3)], 0.03, 0.03)[0].remove == 10
    assert choose([result(10, 1.5, qualifies=False), result(20, 1.1)], 0.03, 0.03)[0].remove == 20


def test_cost_function_interpolates_and_is_zero_without_removal():
    cost = cost_function({10: 0.2, 30: 0.4})
    assert cost(0) == 0.0 and cost(10) == 0.2 and cost(20) == pytest.approx(0.3) and cost(50) == 0.4
    assert cost_function({})(20) == 0.0


def _schedule(model, remove):
    g = model_geometry(model)
    return Schedule(model=g.model, input_size=g.input_size, batch_size=2, num_tokens=g.num_tokens,
                    prefix_tokens=g.prefix_tokens, depth=g.depth, method="pomt", prune=(BlockRemoval(2, remove),))


def test_live_verification_patches_through_apply_schedule_and_leaves_the_model_clean():
    model = create_model("test_vit", input_size=96)
    x = torch.randn(2, 3, 96, 96)
    with torch.inference_mode():
        before = model(x)
    schedules = {37 - r: _schedule(model, r) for r in (8, 20)}
    seen: list[int] = []
    model.blocks[5].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
    measuring = MeasurementRun(LiveSource(schedule_forward_at(TimedModel(model, x), schedules), threads=1))
    found = verify(measuring, 37, dict.fromkeys([8, 20]), Rounds(3, 2), progress=False)
    assert set(seen) == {37, 29, 17}  # the unpruned model and both schedules ran
    assert len(found.candidates) == 2 and found.rounds == 3
    assert all(c.pruned_ms > 0 and c.speedup_ci[0] <= c.speedup <= c.speedup_ci[1] for c in found.candidates)
    assert pomt.patching.patch_state(model) is None
    with torch.inference_mode():
        assert torch.equal(model(x), before)


def test_method_cost_is_measured_on_the_cut_model_and_leaves_it_clean():
    """The step policy's charge is measured as the frontier search measures every reducer: at the N tokens the
    pruning block receives, on the model cut to its last blocks, the reducer removing what the schedule removes."""
    model = create_model("test_vit", input_size=96)  # 37 tokens
    x = torch.randn(2, 3, 96, 96)
    seen: list[int] = []
    model.blocks[-1].register_forward_hook(lambda _m, _args, out: seen.append(out.shape[1]))
    with torch.inference_mode():
        before = model(x)
        costs = method_cost(TimedModel(model, x, threads=1), 2, "pomt", [5, 12, 0], Rounds(2, 1))
        assert torch.equal(model(x), before)
    assert sorted(costs) == [5, 12] and all(math.isfinite(c) for c in costs.values())
    assert set(seen) == {37, 32, 25}  # unpruned, then each removal at the last block of the cut model
    assert pomt.patching.patch_state(model) is None and len(model.blocks) == len(create_model("test_vit").blocks)


def test_tomes_cost_at_one_block_carries_its_proportional_attention_into_every_later_block():
    """ToMe merged at block 2 of 12 pays proportional attention in the 9 blocks after; merged at the last, in
    none; a reducer without proportional attention pays at its block only."""
    tome = ReducerCost("tome", 1, {(50, 4): 0.2, (50, 12): 0.3}, {46: 0.05, 38: 0.03})
    assert one_block_cost(tome, 50, 12, 2, [4]) == {4: pytest.approx(0.2 + 9 * 0.05)}
    assert one_block_cost(tome, 50, 12, 11, [4, 12]) == {4: pytest.approx(0.2), 12: pytest.approx(0.3)}
    pomt_cost = ReducerCost("pomt", 1, {(50, 4): 0.2, (50, 12): -0.1})
    assert one_block_cost(pomt_cost, 50, 12, 2, [12]) == {12: pytest.approx(-0.1)}


def test_short_rounds_are_measured_more_often_up_to_a_limit():
    assert verify_rounds(10, 15.0, 750.0, 1, 4) == 10  # deit_base at batch 4: ten rounds take 30 s already
    assert verify_rounds(10, 15.0, 7.0, 8, 6) == 40  # deit_tiny at batch 1: 0.34 s a round, capped at 4 x 10
    assert verify_rounds(10, 15.0, 7.0, 8, 2) == 40
    assert verify_rounds(10, 6.0, 50.0, 1, 6) == 20  # 0.3 s a round: 6 s hold 20
    assert verify_rounds(10, 3.0, 50.0, 1, 6) == 10
    assert verify_rounds(3, 15.0, 1.0, 8, 3) == 12
    assert verify_rounds(10, 0.0, 7.0, 8, 6) == 10  # no seconds asked: the rounds asked
    assert verify_rounds(10, 15.0, float("nan"), 8, 6) == 10


def test_a_schedule_the_gpu_works_two_thirds_of_is_launch_bound_and_says_so():
    # an H100's figures for tome:0=93,1=51 at batch 64, float16
    work = GpuWork(unpruned_ms=6.38, pruned_ms=3.31, unpruned_kernels=167, pruned_kernels=217, wall_ms=4.96)
    assert work.launch_bound and work.busy == pytest.approx(0.667, abs=1e-3)
    assert work.gpu_speedup == pytest.approx(1.927, abs=1e-3)
    note = work.note(1.32)
    assert note.startswith("launch-bound on this host") and "(67%; 217 kernels against 167 unpruned)" in note
    assert "its 1.32x follows how fast the host issues kernels" in note and "up to 1.93x" in note
    assert work.to_dict() == {"unpruned_ms": 6.38, "pruned_ms": 3.31, "unpruned_kernels": 167.0,
                              "pruned_kernels": 217.0, "wall_ms": 4.96, "busy": 0.667, "gpu_speedup": 1.9275,
                              "launch_bound": True}


@pytest.mark.parametrize(("busy", "bound"), [(BUSY_FLOOR - 0.01, True), (BUSY_FLOOR, False), (0.98, False)])
def test_only_a_gpu_idle_beyond_the_floor_makes_a_note(busy, bound):
    work = GpuWork(unpruned_ms=6.4, pruned_ms=4.0 * busy, unpruned_kernels=167, pruned_kernels=180, wall_ms=4.0)
    assert work.launch_bound is bound and (work.note(1.5) is not None) is bound


def test_a_cpu_is_its_own_host_so_nothing_is_profiled_there():
    model = create_model("test_vit", input_size=96)
    g = model_geometry(model)
    schedule = Schedule(model=g.model, input_size=g.input_size, batch_size=2, num_tokens=g.num_tokens,
                        prefix_tokens=g.prefix_tokens, depth=g.depth, method="tome", prune=(BlockRemoval(0, 8),))
    assert measure_gpu_work(model, torch.randn(2, 3, 96, 96), schedule, "cpu", 5.0) is None
