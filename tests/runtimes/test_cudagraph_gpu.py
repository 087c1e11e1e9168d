"""The CUDA graph runtime on a GPU: a replayed graph computes what the eager model computes, on new batches,
truncated or patched with every reducer, and a schedule measured as a graph is served as one without a warning.
They run where an NVIDIA GPU is and POMT_TESTS_GPU=1 leaves it visible to the suite (`benchmarks/gpu_check.sh
graphs`); elsewhere they skip, and what can be checked on the CPU (the one-line refusal) is in test_backend.py."""

from __future__ import annotations

import warnings

import pytest
import torch

import pomt
from pomt.deploy.apply import eager_fingerprint
from pomt.device import Fingerprint, fingerprint_hash
from pomt.formats.schedule import BlockRemoval, Schedule
from pomt.formats.schedule_parts import Verified
from pomt.frontier.reducer_costs import (
    cost_points,
    default_counts,
    measure_mixed_counts,
    measure_reducer_costs,
    method_cost,
)
from pomt.models.registry import create_model
from pomt.models.tokens import truncate_tokens
from pomt.patching import METHODS, patch, unpatch
from pomt.runtimes import build_forward
from pomt.runtimes.cudagraph import cudagraph_run
from pomt.verification.verify import Rounds, TimedModel

from conftest import verified_record

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need an NVIDIA GPU (visible to the suite with POMT_TESTS_GPU=1)")

SIZE = 96  # test_vit at 96 px: 36 patches and a class token
PRUNE = {1: 8, 3: 6}
# Every reducer a schedule ships; random draws new tokens each forward eager, so its graph cannot match it.
SERVED = sorted(set(METHODS) - {"random"})


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("test_vit", input_size=SIZE).cuda().eval()


def _batch(seed: int) -> torch.Tensor:
    return torch.randn(4, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed)).cuda()


def _eager(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x).clone()


def test_a_truncated_forward_replays_what_eager_computes_on_new_batches(model):
    graphed = cudagraph_run(model, _batch(0), tokens=20)
    try:
        for seed in (1, 2):
            x = _batch(seed)
            with truncate_tokens(model, 20):
                expected = _eager(model, x)
            torch.testing.assert_close(graphed(x).clone(), expected, rtol=1e-4, atol=1e-4)
    finally:
        graphed.reset()
    assert model(_batch(3)).shape == expected.shape  # the token hook left with the capture


@pytest.mark.parametrize("method", SERVED)
def test_a_patched_model_served_as_a_graph_matches_it_eager(model, method):
    prune = {b: 2 for b in range(4)} if method == "tome" else PRUNE
    patch(model, method, prune)
    try:
        forward = pomt.cuda_graph(model, _batch(0))
        for seed in (1, 2):
            x = _batch(seed)
            torch.testing.assert_close(forward(x).clone(), _eager(model, x), rtol=1e-4, atol=1e-4)
        forward.reset()
    finally:
        unpatch(model)


def test_a_graph_refuses_a_batch_of_another_shape(model):
    forward = pomt.cuda_graph(model, _batch(0))
    with pytest.raises(ValueError, match=r"captured for \(4, 3, 96, 96\)"):
        forward(torch.randn(2, 3, SIZE, SIZE, device="cuda"))
    forward.reset()


def test_the_backend_forward_is_one_replay(model):
    with build_forward(model, _batch(0), backend="cudagraph", tokens=12) as forward:
        out = forward()
        torch.cuda.synchronize()
    assert out.shape == (4, model.num_classes)


def test_a_schedule_measured_as_a_graph_is_served_as_one_without_a_warning(model):
    """apply_schedule hashes the model's own device (cuda:0) with the cudagraph runtime; a schedule the offline
    computation verified here as a graph matches it, and the graph of the patched model is what it promised."""
    here = fingerprint_hash(eager_fingerprint(str(next(model.parameters()).device), "cudagraph"))
    schedule = Schedule(model="test_vit", input_size=(SIZE, SIZE), batch_size=4, num_tokens=37, prefix_tokens=1,
                        depth=6, method="pomt", prune=(BlockRemoval(1, 8),), device=Fingerprint(kind="cuda"),
                        backend={"name": "cudagraph"}, verified=Verified.from_dict(verified_record(here)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pomt.apply_schedule(model, schedule)
    try:
        forward = pomt.cuda_graph(model, _batch(0))
        torch.testing.assert_close(forward(_batch(1)).clone(), _eager(model, _batch(1)), rtol=1e-4, atol=1e-4)
        forward.reset()
    finally:
        unpatch(model)


def test_reducer_costs_are_measured_as_graphs(model):
    """Every visit of the paired rounds captures its variant (patched, cut, truncated) and replays it: the costs
    have the structure the latency model reads, and the model is left as it was."""
    x = _batch(0)
    costs = measure_reducer_costs(TimedModel(model, x, "cuda", backend="cudagraph"), ["pomt", "tome"], Rounds(3))
    assert sorted(costs["pomt"].pruning) == cost_points(37, 1, "pomt", default_counts(37, 1))
    assert costs["tome"].carrying and costs["tome"].later != 0.0
    assert all(abs(ms) < 1e3 for c in costs.values() for ms in c.pruning.values())
    mixed = measure_mixed_counts(TimedModel(model, x, "cuda", backend="cudagraph"), Rounds(3))
    assert mixed.ci[0] <= mixed.over_blocks <= mixed.ci[1]
    cost = method_cost(TimedModel(model, x, "cuda", backend="cudagraph"), 3, "pomt", [4, 8], Rounds(3))
    assert sorted(cost) == [4, 8]
    assert model(x).shape == (4, model.num_classes)  # no patch, hook or cut left behind
