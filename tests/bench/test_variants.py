"""pomt.bench.variants: the reductions planned from the amounts given, and ToMe's fine-grained merge counts."""

from __future__ import annotations

import pytest

from pomt.bench.config import BenchConfig, variant_methods
from pomt.bench.variants import plan_reductions, tome_removal
from pomt.errors import PatchError
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model

from support.bench_files import DEPTH


@pytest.fixture(scope="module")
def tiny64():
    return create_model("deit_tiny", input_size=64)


def test_tome_removal_spreads_the_merge_count_over_the_last_blocks():
    totals = [sum(tome_removal(merges, 4).values()) for merges in range(10)]
    assert totals == list(range(10))
    assert tome_removal(6, 4) == {0: 1, 1: 1, 2: 2, 3: 2}


def test_plan_reductions_puts_the_baseline_and_schedule_first(tiny64):
    geometry = model_geometry(tiny64)
    plans = plan_reductions(variant_methods(["topk", "tome"]), geometry, BenchConfig(remove=4, r=2, prune_block=3))
    assert [(p.name, p.removal, p.amount) for p in plans] == [
        ("none", {}, ""),
        ("topk", {3: 4}, "-4@3"),
        ("tome", dict.fromkeys(range(DEPTH), 2), "r=2"),
    ]
    with pytest.raises(PatchError, match="--r"):
        plan_reductions(["none", "tome"], geometry, BenchConfig())
    with pytest.raises(PatchError, match="cannot remove 16"):
        plan_reductions(["none", "topk"], geometry, BenchConfig(remove=16))


def test_the_prune_block_is_checked_against_the_model_where_the_reductions_are_planned(tiny64):
    geometry = model_geometry(tiny64)
    with pytest.raises(PatchError, match="--prune-block"):
        plan_reductions(["none", "l2norm"], geometry, BenchConfig(prune_block=12), amounts_later=True)
    assert len(plan_reductions(["none", "tome"], geometry, BenchConfig(r=1, prune_block=12))) == 2
