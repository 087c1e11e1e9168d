"""The architectures pomt registers with timm build by name, without a class token, at any input size."""

import pytest
import torch

from pomt.models.geometry import model_geometry
from pomt.models.registry import PomtWarning, create_model


def test_the_tiny_siglip_tower_has_no_class_token_and_a_map_head():
    model = create_model("pomt_siglip_tiny_patch16_224", input_size=64, num_classes=10)
    geometry = model_geometry(model)
    assert (geometry.prefix_tokens, geometry.num_tokens, geometry.embed_dim, geometry.depth) == (0, 16, 192, 12)
    assert model.attn_pool is not None and geometry.model == "pomt_siglip_tiny_patch16_224"
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 10)


def test_asking_for_its_pretrained_weights_falls_back_to_random_ones_with_a_warning():
    with pytest.warns(PomtWarning, match="using random init"):
        create_model("pomt_siglip_tiny_patch16_224", input_size=32, pretrained=True)
