"""Candidates: one reducer and a removal per block, with a stable key."""

import pytest

from pomt.choice.candidates import Candidate
from pomt.errors import PatchError, ScheduleError


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
        Candidate.of("random", {1: 2})


def test_a_candidate_is_read_back_from_its_key():
    for candidate in (Candidate.of("tome", {0: 10, 7: 15}), Candidate.of("l2norm", {3: 1}), Candidate.of("pomt", {})):
        assert Candidate.parse(candidate.key) == candidate
    assert Candidate.parse(" topk:5=2,1=3 ") == Candidate.of("topk", {1: 3, 5: 2})


@pytest.mark.parametrize("text", ["tome", "tome:", "tome:0", "tome:0=1,0=2", "tome:a=1", "tome:0=-1", "tome:0=1=2"])
def test_an_unreadable_key_is_one_clear_error(text):
    with pytest.raises(ScheduleError, match="cannot read schedule"):
        Candidate.parse(text)
