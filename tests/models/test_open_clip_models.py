"""open_clip image towers by name: `open_clip:NAME` builds the tower with seeded random weights, refuses what pomt
cannot prune with one line."""

import pytest
import torch

from pomt.errors import UnknownModelError, UnsupportedModelError, WeightsError
from pomt.models.geometry import model_geometry
from pomt.models.registry import architecture, create_model, default_input_size

pytest.importorskip("open_clip", reason="open_clip_torch is not installed")


def test_a_vit_tower_builds_by_name_at_any_size_the_same_every_time():
    model = create_model("open_clip:ViT-B-32", 64)
    geometry = model_geometry(model)
    assert (geometry.patch_size, geometry.num_tokens, geometry.prefix_tokens) == ((32, 32), 5, 1)
    assert geometry.model == architecture("open_clip:ViT-B-32") == "open_clip_ViT-B-32"
    assert default_input_size("open_clip:ViT-B-32") == (224, 224)
    x = torch.randn(1, 3, 64, 64)
    assert torch.equal(model(x), create_model("open_clip:ViT-B-32", 64)(x))


def test_what_it_cannot_build_or_prune_is_one_line():
    with pytest.raises(UnknownModelError, match="unknown model 'open_clip:ViT-B-99'"):
        create_model("open_clip:ViT-B-99")
    with pytest.raises(UnsupportedModelError, match="TimmModel"):
        create_model("open_clip:ViT-B-16-SigLIP", 64)
    with pytest.raises(WeightsError, match="neither --checkpoint"):
        create_model("open_clip:ViT-B-32", 64, checkpoint="weights.pth")
