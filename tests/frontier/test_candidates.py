"""Candidates (one reducer and a removal per block, with a stable key) and the uniform families a search always
evaluates."""

import pytest

from pomt.errors import PatchError, PomtError, ScheduleError
from pomt.frontier.candidates import (
    Candidate,
    decreasing_r,
    given_schedules,
    pomt_single,
    rate_blocks,
    tome_values,
    topk_rate,
    uniform_families,
)
from pomt.models.registry import geometry_of
from pomt.patching.blocks import token_counts


def test_a_candidate_is_normalised_and_named_stably():
    c = Candidate.of("tome", {3: 2, 0: 2, 5: 0})
    assert c.removal == ((0, 2), (3, 2)) and c.first_block == 0 and c.as_dict() == {0: 2, 3: 2}
    assert c.key == "tome:0=2,3=2"
    assert Candidate.from_dict(c.to_dict()) == c


def test_every_candidate_that_removes_nothing_is_the_unpruned_model():
    assert Candidate.of("tome", {}) == Candidate.of("pomt", {2: 0})
    assert Candidate.of("topk", {}).unpruned and Candidate.of("topk", {}).key == "none"
    assert Candidate.of("topk", {}).first_block is None


def test_an_unknown_reducer_is_refused():
    with pytest.raises(PatchError, match="unknown method"):
        Candidate.parse("random:1=2")


def test_a_candidate_is_read_back_from_its_key():
    for candidate in (Candidate.of("tome", {0: 10, 7: 15}), Candidate.of("l2norm", {3: 1}), Candidate.of("pomt", {})):
        assert Candidate.parse(candidate.key) == candidate
    assert Candidate.parse(" topk:5=2,1=3 ") == Candidate.of("topk", {1: 3, 5: 2})


@pytest.mark.parametrize("text", ["tome", "tome:", "tome:0", "tome:0=1,0=2", "tome:a=1", "tome:0=-1", "tome:0=1=2"])
def test_an_unreadable_key_is_one_clear_error(text):
    with pytest.raises(ScheduleError, match="cannot read schedule"):
        Candidate.parse(text)


def test_schedules_given_to_a_benchmark_are_read_once_each_and_fit_every_model_named():
    tiny, small = geometry_of("deit_tiny", 112), geometry_of("test_vit", 64)  # 50 tokens, 12 blocks; 17, 6
    given = given_schedules(["tome:0=2,4=3", "tome:4=3,0=2", "topk:3=4"], [tiny, small])
    assert given == [Candidate.of("tome", {0: 2, 4: 3}), Candidate.of("topk", {3: 4})]
    assert given_schedules([], [tiny]) == []
    with pytest.raises(ScheduleError, match="--also takes pruned schedules"):
        given_schedules(["tome:0=2", "none"], [tiny])
    with pytest.raises(PomtError, match="prune block 7"):  # deit_tiny has block 7, test_vit does not
        given_schedules(["tome:7=2"], [tiny, small])
    given_schedules(["tome:7=2"], [tiny])


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
