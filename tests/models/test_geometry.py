import pytest

from pomt.errors import GridError
from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.models.registry import create_model, geometry_of


@pytest.mark.parametrize(
    ("name", "size", "tokens", "prefix", "dim", "heads"),
    [
        ("deit_tiny", 224, 197, 1, 192, 3),
        ("deit_small", 224, 197, 1, 384, 6),
        ("deit_base", 224, 197, 1, 768, 12),
        ("deit_tiny", 448, 785, 1, 192, 3),
        ("deit_small", 448, 785, 1, 384, 6),
        ("deit_base", 448, 785, 1, 768, 12),
        ("deit_small_distilled", 224, 198, 2, 384, 6),
        ("vit_small_patch14_dinov2", 224, 257, 1, 384, 6),
        ("vit_small_patch14_reg4_dinov2", 224, 261, 5, 384, 6),
    ],
)
def test_timm_geometry(name, size, tokens, prefix, dim, heads):
    geometry = model_geometry(create_model(name, input_size=size))
    assert geometry.num_tokens == tokens
    assert geometry.prefix_tokens == prefix
    assert geometry.patch_tokens == tokens - prefix
    assert geometry.depth == 12
    assert geometry.embed_dim == dim
    assert geometry.num_heads == heads
    assert geometry.input_size == (size, size)
    assert geometry.grid[0] * geometry.grid[1] == tokens - prefix


def test_dinov2_default_size_comes_from_timm_config():
    geometry = model_geometry(create_model("dinov2_small"))
    assert geometry.input_size == (518, 518)
    assert geometry.num_tokens == 1 + 37 * 37


def test_authors_dinov2_geometry_flattens_block_chunks():
    vision_transformer = pytest.importorskip("dinov2.models.vision_transformer")
    model = vision_transformer.vit_small(patch_size=14, img_size=224, block_chunks=4)
    geometry = model_geometry(model)
    assert (geometry.num_tokens, geometry.prefix_tokens, geometry.depth) == (257, 1, 12)
    assert len(transformer_blocks(model)) == 12


def test_rectangular_input():
    geometry = model_geometry(create_model("deit_tiny", input_size=(224, 320)))
    assert geometry.grid == (14, 20)
    assert geometry.num_tokens == 1 + 14 * 20


def test_check_tokens_range():
    geometry = model_geometry(create_model("deit_tiny_distilled", input_size=64))
    assert geometry.num_tokens == 18
    assert geometry.check_tokens(3) == 3
    with pytest.raises(GridError, match=r"\[3, 18\]"):
        geometry.check_tokens(2)
    with pytest.raises(GridError):
        geometry.check_tokens(19)


@pytest.mark.parametrize(("name", "size"), [("deit_tiny", 112), ("test_vit", 64), ("deit_small", (224, 160))])
def test_the_geometry_by_name_is_the_built_models_and_needs_no_weights(name, size):
    assert geometry_of(name, size) == model_geometry(create_model(name, size))
