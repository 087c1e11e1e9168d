"""A verified schedule's GPU work against its verified latency: when it waits on its host, and what it says."""

import pytest
import torch

from pomt.formats.schedule import BlockRemoval, Schedule
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.verification.launch_bound import BUSY_FLOOR, GpuWork, measure_gpu_work


def test_a_schedule_the_gpu_works_two_thirds_of_is_launch_bound_and_says_so():
    # the H100's figures for tome:0=93,1=51 at batch 64, float16 (2026-11-28)
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
