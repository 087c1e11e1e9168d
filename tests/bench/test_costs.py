"""pomt.bench.costs: FLOP counts against a hand count, counted on a weightless copy, and amount matching."""

from __future__ import annotations

import copy

import pytest
import torch

from pomt.bench.costs import count_flops, flops_function, match_amount
from pomt.checks import METHODS
from pomt.models.registry import create_model
from pomt.patching import patch

from support.bench_files import DEPTH
from support.flops_oracle import vit_flops


@pytest.fixture(scope="module")
def tiny64():
    return create_model("deit_tiny", input_size=64)


def test_counted_flops_equal_the_hand_count(tiny64):
    x = torch.randn(2, 3, 64, 64)
    assert count_flops(tiny64, x) == 2 * vit_flops(tiny64)
    for method, prune in [("pomt", {3: 5}), ("topk", {3: 5}), ("l2norm", {2: 3, 6: 4}), ("tome", 2)]:
        pruned = patch(copy.deepcopy(tiny64), method, prune)
        removal = prune if isinstance(prune, dict) else dict.fromkeys(range(DEPTH), prune)
        assert count_flops(pruned, x) == 2 * vit_flops(tiny64, method, removal), method


@pytest.mark.parametrize("name", ["deit_tiny", "deit_tiny_distilled", "dinov2_small_reg"])
def test_flops_function_counts_on_a_weightless_copy_exactly(name):
    base = create_model(name, input_size=112)
    x = torch.randn(1, 3, 112, 112)
    flops_at = flops_function(base, x)
    assert flops_at(None, {}) == count_flops(base, x) == vit_flops(base)
    for method in METHODS:  # random needs a real generator: counted on a real copy
        removal = {1: 4, 5: 3}
        assert flops_at(method, removal) == count_flops(patch(copy.deepcopy(base), method, removal), x), method
    assert next(base.parameters()).device.type == "cpu"


def test_match_amount_finds_the_closest_amount():
    flops = {amount: 100.0 - 7 * amount for amount in range(11)}
    assert match_amount(flops.__getitem__, 60.0, 0, 10) == 6  # 58 is closer than 65
    assert match_amount(flops.__getitem__, 1000.0, 0, 10) == 0
    assert match_amount(flops.__getitem__, -5.0, 0, 10) == 10


def test_flops_count_through_an_attention_pool_and_leave_the_parameters_learning():
    """SigLIP's MAP head views a parameter inside its forward, which the counter's module tracker would hook."""
    model = create_model("vit_base_patch16_siglip_224", input_size=32)
    counted = count_flops(model, torch.randn(1, 3, 32, 32))
    assert counted > count_flops(model.attn_pool, torch.randn(1, 4, model.embed_dim)) > 0
    assert all(p.requires_grad for p in model.parameters())
