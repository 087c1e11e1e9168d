"""Checks shared by entry points: schedules across blocks and calibration sizes."""

import pytest

from pomt.checks import check_calibration_size, check_removal, check_removals
from pomt.errors import CalibrationError, PatchError
from pomt.patching.tome import max_merge


def test_tome_r_above_half_the_patch_tokens_is_refused_at_its_cap():
    for patches in range(1, 60):
        cap = max_merge(patches)  # the published cap the check states
        assert check_removal("tome", 0, cap, patches) == cap
        if cap + 1 < patches:
            with pytest.raises(PatchError, match=f"r <= {cap}"):
                check_removal("tome", 0, cap + 1, patches)


def test_removals_are_checked_against_the_tokens_left_at_each_block():
    assert check_removals("pomt", {4: 0, 2: 10, 0: 20}, 50, 1, 12) == {0: 20, 2: 10}
    with pytest.raises(PatchError, match="block 2 cannot remove 19 tokens: only 19 patch tokens are left"):
        check_removals("pomt", {0: 30, 2: 19}, 50, 1, 12)
    with pytest.raises(PatchError, match="outside the model's blocks 0..11"):
        check_removals("pomt", {12: 3}, 50, 1, 12)
    with pytest.raises(PatchError, match="ToMe merges at most half the 37 patch tokens entering block 1"):
        check_removals("tome", {0: 12, 1: 19}, 50, 1, 12)
    with pytest.raises(PatchError, match="integer >= 0"):
        check_removals("topk", {0: -1}, 50, 1, 12)


def test_too_few_calibration_images_for_the_drop_asked_is_one_clear_error():
    assert check_calibration_size(5000, 0.9, 1.0) == 5000
    with pytest.raises(CalibrationError, match=r"225 calibration images .* \+-3\.9 points .* at least 3461 images"):
        check_calibration_size(225, 0.9, 1.0)
    with pytest.raises(CalibrationError, match="must be positive"):
        check_calibration_size(225, 0.9, 0.0)
