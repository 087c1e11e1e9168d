"""What the offline computation is asked: its checks, the policy it defaults to, how much it may remove."""

from pathlib import Path

import pytest

from pomt.errors import DatasetError, GridError, PatchError, PolicyError, SettingError
from pomt.measurement.search import SearchSettings
from pomt.offline.config import (
    OfflineConfig,
    check_pruning,
    max_remove,
    needs_accuracy_model,
    policy_name,
    validate,
)

from support.offline_data import GEOMETRY


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"search": "magic"}, GridError, "unknown search"),
        ({"latency_only": True, "accuracy_only": True}, PolicyError, "exclude each other"),
        ({"replay": Path("t.csv"), "accuracy_only": True}, PolicyError, "--replay analyses latency"),
        ({"policy": "greedy"}, PolicyError, "unknown policy"),
        ({"policy": "budget"}, PolicyError, "needs --latency-budget-ms"),
        ({"alpha": 1.5}, SettingError, r"--alpha must be in \[0, 1\], got 1.5"),
        ({"accuracy_samples": 0}, SettingError, "--accuracy-samples must be >= 1"),
        ({"dataset_root": Path("/nonexistent/folder")}, DatasetError, "dataset folder not found"),
        ({"method": "magic"}, PatchError, "unknown method .magic."),
    ],
)
def test_bad_settings_are_refused_before_anything_is_built(changes, error, message):
    with pytest.raises(error, match=message):
        validate(OfflineConfig(**changes), SearchSettings())


def test_the_pruning_block_and_the_limit_are_checked_against_the_model():
    check_pruning(OfflineConfig(prune_block=11, max_remove=195), GEOMETRY)
    with pytest.raises(PatchError, match="--prune-block 12"):
        check_pruning(OfflineConfig(prune_block=12), GEOMETRY)
    with pytest.raises(GridError, match=r"--max-remove 196 is outside \[0, 195\]"):
        check_pruning(OfflineConfig(max_remove=196), GEOMETRY)


def test_the_limit_is_a_quarter_of_the_patch_tokens_when_accuracy_is_unknown():
    assert max_remove(OfflineConfig(), GEOMETRY, accuracy_known=False) == 49
    assert max_remove(OfflineConfig(), GEOMETRY, accuracy_known=True) == 195
    assert max_remove(OfflineConfig(max_remove=10), GEOMETRY, accuracy_known=True) == 10


def test_the_default_policy_follows_what_is_known():
    assert policy_name(OfflineConfig(), accuracy_known=False) == "step"
    assert policy_name(OfflineConfig(), accuracy_known=True) == "utility"
    assert policy_name(OfflineConfig(latency_budget_ms=5.0), accuracy_known=True) == "budget"
    assert policy_name(OfflineConfig(policy="step"), accuracy_known=True) == "step"


def test_accuracy_is_measured_only_with_a_dataset_latency_and_no_curve(tmp_path):
    assert not needs_accuracy_model(OfflineConfig())
    assert needs_accuracy_model(OfflineConfig(dataset_root=tmp_path))
    assert not needs_accuracy_model(OfflineConfig(dataset_root=tmp_path, latency_only=True))
    assert not needs_accuracy_model(OfflineConfig(dataset_root=tmp_path, accuracy_curve=tmp_path / "a.csv"))
