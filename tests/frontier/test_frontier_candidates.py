"""Candidates: one reducer and a removal per block, with a stable key."""

import pytest

from pomt.errors import PatchError, PomtError, ScheduleError
from pomt.frontier.candidates import Candidate, given_schedules
from pomt.models.registry import geometry_of


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
