"""Accuracy measured in a worker process: the same answers and journal as here, and no forward run here."""

import pytest
import torch
from torch.utils.data import TensorDataset

from pomt.accuracy import TOP1
from pomt.errors import PatchError
from pomt.frontier.calibration import HELD_OUT, SEARCH, Calibration, hosted
from pomt.frontier.candidates import NONE, Candidate
from pomt.frontier.journal import AccuracyJournal, model_identity
from pomt.models.registry import create_model

CANDIDATES = [NONE, Candidate.of("tome", {0: 2, 1: 2}), Candidate.of("topk", {2: 6})]


def calibration(path):
    model = create_model("test_vit", 64, num_classes=4)
    generator = torch.Generator().manual_seed(0)
    images = TensorDataset(torch.randn(30, 3, 64, 64, generator=generator),
                           torch.randint(0, 4, (30,), generator=generator))
    return Calibration(model, images, TOP1, AccuracyJournal(path, model_identity(model)), batch_size=4)


def refuse_forward(*_, **__):
    raise AssertionError("the accuracy forwards ran in the timing process")


def test_a_hosted_calibration_answers_as_here_journals_the_same_and_runs_no_forward_here(tmp_path):
    here = calibration(tmp_path / "here.jsonl")
    expected = {split: here.measure(CANDIDATES, split) for split in (SEARCH, HELD_OUT)}
    away = calibration(tmp_path / "away.jsonl")
    with hosted(away) as hosted_away:
        away.model.forward = refuse_forward  # the worker holds its own model object, given before this
        # its own copy: weights a worker maps in shared memory slowed the parent's forwards by 40%
        assert not any(p.is_shared() for p in away.model.parameters())
        assert hosted_away.kind == TOP1 and hosted_away.size(SEARCH) == here.size(SEARCH)
        assert {split: hosted_away.measure(CANDIDATES, split) for split in (SEARCH, HELD_OUT)} == expected
        assert hosted_away.evaluated == 2 * len(CANDIDATES) and hosted_away.seconds > 0
        assert hosted_away.measure(CANDIDATES[1:], SEARCH) == {c: expected[SEARCH][c] for c in CANDIDATES[1:]}
        assert hosted_away.evaluated == 2 * len(CANDIDATES)  # read back from its journal, not measured again
    journalled = AccuracyJournal(tmp_path / "away.jsonl", model_identity(here.model))
    assert journalled.entries == AccuracyJournal(tmp_path / "here.jsonl", model_identity(here.model)).entries


def test_an_error_in_the_worker_arrives_here_as_itself(tmp_path):
    with hosted(calibration(tmp_path / "j.jsonl")) as away, pytest.raises(PatchError, match="remove at most 15"):
        away.measure([Candidate.of("pomt", {0: 40})], SEARCH)  # test_vit at 64 px has 16 patch tokens
