import pytest
import torch

from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.models.registry import create_model
from pomt.models.shortened import last_blocks


def _run_blocks(model, x):
    """The reference: embedding, then the model's last two blocks by hand, then its norm and head."""
    tokens = model.patch_drop(model._pos_embed(model.patch_embed(x)))
    for block in transformer_blocks(model)[-2:]:
        tokens = block(tokens)
    return model.forward_head(model.norm(tokens))


def test_the_cut_model_runs_its_own_last_blocks_and_is_whole_again_after():
    model = create_model("deit_tiny", 64).eval()
    blocks = transformer_blocks(model)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        whole = model(x)
        with last_blocks(model, 2) as cut:
            assert transformer_blocks(cut) == blocks[-2:]
            assert model_geometry(cut).depth == 2
            assert torch.allclose(cut(x), _run_blocks(model, x), atol=1e-5)
        assert transformer_blocks(model) == blocks
        assert torch.equal(model(x), whole)


def test_the_model_is_whole_again_after_an_error_inside():
    model = create_model("deit_tiny", 64)
    with pytest.raises(RuntimeError), last_blocks(model, 1):
        raise RuntimeError("inside")
    assert len(transformer_blocks(model)) == 12


@pytest.mark.parametrize("count", [0, 13])
def test_a_count_outside_the_depth_is_refused(count):
    with pytest.raises(ValueError, match="count must lie in"), last_blocks(create_model("deit_tiny", 64), count):
        pass


def test_authors_dinov2_block_chunks_are_cut_too():
    vision_transformer = pytest.importorskip("dinov2.models.vision_transformer")
    model = vision_transformer.vit_small(patch_size=14, img_size=56, block_chunks=4).eval()
    flat = transformer_blocks(model)
    with torch.inference_mode(), last_blocks(model, 2):
        assert transformer_blocks(model) == flat[-2:]
        assert model(torch.randn(1, 3, 56, 56)).shape[-1] == 384
    assert transformer_blocks(model) == flat
