"""The uniform families a search always evaluates."""

from pomt.frontier.candidates import decreasing_r, pomt_single, rate_blocks, tome_values, topk_rate, uniform_families
from pomt.patching.plan import token_counts


def test_tomes_decreasing_schedule_is_the_authors_parse_r():
    # ToMe's utils.parse_r(12, (8, -1.0)): from 2r down to 0 in equal steps, truncated
    assert decreasing_r(12, 8) == [16, 14, 13, 11, 10, 8, 7, 5, 4, 2, 1, 0]
    assert sum(decreasing_r(12, 8)) == 91 and decreasing_r(1, 3) == [3]


def test_tome_values_reach_about_every_patch_token_over_the_depth():
    assert tome_values(197, 1, 12, 5) == [1, 5, 9, 13, 17]
    assert tome_values(50, 1, 12, 5) == [1, 2, 3, 4, 5]


def test_topk_keeps_the_same_share_at_evits_blocks():
    assert rate_blocks(12) == [3, 6, 9] and rate_blocks(4) == [1, 2, 3]
    candidate = topk_rate(197, 1, 12, rates=(0.7,))[0]
    counts = token_counts(197, 1, 12, "topk", candidate.as_dict())
    assert [counts[b] - 1 for b in (3, 4, 7, 10)] == [196, 137, 96, 67]


def test_single_block_pomt_includes_every_removal_landing_below_a_step():
    removals = [c.as_dict() for c in pomt_single(197, 1, 12, steps=[150, 197, 1])]
    assert {3: 47} in removals and all(list(r) == [3] for r in removals)
    assert [c.first_block for c in pomt_single(17, 1, 2)] == [1] * 6  # a shallow model prunes its last block


def test_every_family_is_a_list_of_valid_candidates():
    families = uniform_families(50, 1, 12, steps=[40])
    assert set(families) == {"tome-constant", "tome-decreasing", "topk-rate", "pomt-block3"}
    for name, candidates in families.items():
        assert candidates and all(c.method == name.split("-")[0] for c in candidates)
        for c in candidates:
            token_counts(50, 1, 12, c.method, c.as_dict())
