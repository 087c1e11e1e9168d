"""The removal plan: `token_counts` as ToMe's cap and the patch-token floor give it, and every reducer the
frontier searches pruning at several blocks, each removing its own count, so that the model's blocks see
exactly the counts the latency model prices."""

from __future__ import annotations

import pytest
import torch

from pomt.errors import PatchError
from pomt.frontier.candidates import REDUCERS
from pomt.models.geometry import transformer_blocks
from pomt.models.registry import create_model
from pomt.patching import patch, patch_state, token_counts, unpatch

from support.tiny_data import MODEL, SIZE

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


def test_token_counts_clamp_tome_to_half_and_refuse_empty_patch_sets():
    assert token_counts(11, 1, 3, "tome", {0: 8, 1: 8, 2: 8}) == [11, 6, 4, 3]
    assert token_counts(11, 1, 3, "pomt", {1: 9}) == [11, 11, 2, 2]
    with pytest.raises(PatchError, match="at least one must stay"):
        token_counts(11, 1, 3, "topk", {1: 10})
