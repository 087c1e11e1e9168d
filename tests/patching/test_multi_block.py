"""Every reducer the frontier searches prunes at several blocks, each removing its own count (ToMe: its r at
each block, the published cap applied), and the model's blocks see exactly the counts the latency model
prices (`pomt.patching.plan.token_counts`)."""

from __future__ import annotations

import pytest
import torch

from pomt.frontier.candidates import REDUCERS
from pomt.models.geometry import transformer_blocks
from pomt.models.registry import create_model
from pomt.patching import patch, patch_state, token_counts, unpatch

from tiny_data import MODEL, SIZE

PLANS = [{0: 5, 2: 3, 4: 2}, {1: 10, 3: 10, 5: 1}, {0: 18, 1: 9, 2: 4}]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model(MODEL, input_size=SIZE).eval()


def _counts(model, x) -> tuple[list[int], int]:
    counts, handles = [], []
    for block in transformer_blocks(model):
        handles.append(block.register_forward_pre_hook(lambda _m, args: counts.append(args[0].shape[1])))
    last = transformer_blocks(model)[-1]
    out = []
    handles.append(last.register_forward_hook(lambda _m, _a, output: out.append(output.shape[1])))
    try:
        with torch.inference_mode():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return counts, out[0]


@pytest.mark.parametrize("method", REDUCERS)
@pytest.mark.parametrize("plan", PLANS)
def test_each_block_removes_its_own_count(model, method, plan):
    x = torch.randn(2, 3, SIZE, SIZE)
    expected = token_counts(37, 1, 6, method, plan)
    patch(model, method, plan)
    try:
        counts, leaving = _counts(model, x)
        patched = sorted(patch_state(model).originals)
    finally:
        unpatch(model)
    assert counts + [leaving] == expected
    if method == "tome":  # the merging blocks and every block after the first merge (proportional attention)
        assert patched == list(range(min(plan), 6))
    else:
        assert patched == sorted(plan)
