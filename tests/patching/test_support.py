"""Reducer support found by trying: every cell None or one line, the probed model left as it was."""

from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import ResPostBlock, VisionTransformer
from torch import nn

from pomt.errors import PatchError
from pomt.models.geometry import transformer_blocks
from pomt.models.registry import create_model
from pomt.patching import METHODS, patch, patch_state, unpatch
from pomt.patching.api import (
    FAMILIES,
    PROBE_SIZE,
    Family,
    model_support,
    one_line,
    probe_model,
    probe_removal,
    reducer_support,
    support_table,
)


def _one_line_refusals(support: dict[str, str | None]) -> None:
    assert list(support) == list(METHODS)
    for method, reason in support.items():
        assert reason is None or (isinstance(reason, str) and reason.strip()), (method, reason)
        assert reason is None or ("\n" not in reason and "Traceback" not in reason), (method, reason)


def test_deit3_small_runs_every_reducer():
    assert model_support("deit3_small_patch16_224") == dict.fromkeys(METHODS)


def test_probe_model_is_small_random_and_in_eval_mode():
    model = probe_model("deit_tiny")
    assert tuple(model.patch_embed.img_size) == (PROBE_SIZE, PROBE_SIZE)
    assert not model.training


def test_probe_leaves_the_model_unpatched_and_unchanged():
    model = create_model("deit_tiny", input_size=64)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        before = model(x)
    weights = {name: t.clone() for name, t in model.state_dict().items()}
    classes = [type(m) for m in model.modules()]
    assert reducer_support(model) == dict.fromkeys(METHODS)
    assert patch_state(model) is None
    assert [type(m) for m in model.modules()] == classes
    assert not any(key.startswith("_pomt") for m in model.modules() for key in vars(m))
    assert all(torch.equal(t, weights[name]) for name, t in model.state_dict().items())
    with torch.inference_mode():
        assert torch.equal(model(x), before)


def test_a_patched_model_is_refused_and_keeps_its_patch():
    model = patch(create_model("deit_tiny", input_size=64), "topk", {2: 3})
    with pytest.raises(PatchError, match="unpatched"):
        reducer_support(model)
    assert patch_state(model).removal == {2: 3}
    unpatch(model)


def test_a_module_without_patches_is_refused_by_every_method_in_one_line():
    support = reducer_support(nn.Linear(4, 4))
    _one_line_refusals(support)
    assert len(set(support.values())) == 1
    assert "patch embedding" in support["pomt"]


def test_blocks_of_another_class_are_refused_in_one_line_or_run():
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, block_fn=ResPostBlock)
    support = reducer_support(model.eval())
    _one_line_refusals(support)
    assert all(reason is None or "ResPostBlock" in reason for reason in support.values())
    assert all(type(b) is ResPostBlock for b in transformer_blocks(model))


def test_a_crash_is_a_cell_led_by_its_type():
    model = create_model("deit_tiny", input_size=64)
    model.patch_embed.img_size = (96, 96)  # geometry and input now disagree with the position embedding
    support = reducer_support(model)
    _one_line_refusals(support)
    assert all(reason.startswith(("RuntimeError", "AssertionError")) for reason in support.values())


def test_a_model_that_cannot_be_built_has_its_reason_in_every_cell():
    support = model_support("no_such_vit_patch16_224")
    _one_line_refusals(support)
    assert all(reason.startswith("unknown model 'no_such_vit_patch16_224'") for reason in support.values())


def test_a_missing_package_reads_not_installed():
    assert model_support("vit_small", package="pomt_absent_package") == dict.fromkeys(
        METHODS, "pomt_absent_package is not installed")


def test_table_rows_follow_the_families_given():
    families = [Family("tiny", ("deit_tiny", "no_such_vit"), "timm VisionTransformer")]
    rows = support_table(families, methods=("pomt", "tome"))
    assert [(row.family, row.model, row.description) for row in rows] == [
        ("tiny", "deit_tiny", "timm VisionTransformer"), ("tiny", "no_such_vit", "timm VisionTransformer")]
    assert rows[0].reducers == {"pomt": None, "tome": None}
    assert set(rows[1].to_dict()) == {"family", "model", "class", "reducers"}
    assert all("unknown model" in reason for reason in rows[1].reducers.values())


def test_probe_removal_is_small():
    assert probe_removal("tome", 12) == 1
    assert probe_removal("pomt", 12) == {0: 1, 6: 1}
    assert probe_removal("topk", 1) == {0: 1}


def test_one_line_marks_what_is_not_a_refusal():
    assert one_line(PatchError("cannot patch\nsecond line")) == "cannot patch"
    assert one_line(RuntimeError("\n  shape mismatch\nmore")) == "RuntimeError: shape mismatch"
    assert one_line(KeyError()) == "KeyError"


def test_every_family_has_a_label_models_and_a_class():
    labels = [family.label for family in FAMILIES]
    assert len(set(labels)) == len(labels)
    assert all(family.models and family.description for family in FAMILIES)


@pytest.mark.slow
def test_the_whole_table_is_ok_or_one_line():
    rows = support_table()
    assert len(rows) == sum(len(family.models) for family in FAMILIES)
    for row in rows:
        _one_line_refusals(row.reducers)
    assert next(row for row in rows if row.model == "deit3_small_patch16_224").reducers == dict.fromkeys(METHODS)
