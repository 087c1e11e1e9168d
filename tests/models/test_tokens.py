import pytest
import torch

from pomt.errors import GridError
from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.models.registry import create_model
from pomt.models.tokens import dropped_to, forward_at_tokens, gather_tokens, last_blocks, truncate_tokens

from conftest import entering_counts


@pytest.fixture(scope="module")
def tiny():
    return create_model("deit_tiny", input_size=224)


def test_full_token_count_is_exactly_the_model(tiny):
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(forward_at_tokens(tiny, x, 197), tiny(x))


@pytest.mark.parametrize("selection", ["first", "random"])
def test_shapes_and_block_token_counts(tiny, selection):
    x = torch.randn(2, 3, 224, 224)
    geometry = model_geometry(tiny)
    for n in (geometry.prefix_tokens + 1, geometry.num_tokens // 2, geometry.num_tokens):
        with torch.no_grad():
            counts = entering_counts(tiny, lambda n=n: forward_at_tokens(tiny, x, n, selection=selection))
        assert counts == [n] * geometry.depth
    with torch.no_grad():
        assert forward_at_tokens(tiny, x, 50, selection=selection).shape == (2, 1000)


def test_out_of_range_raises(tiny):
    with pytest.raises(GridError):
        forward_at_tokens(tiny, torch.randn(1, 3, 224, 224), 1)
    with pytest.raises(GridError):
        forward_at_tokens(tiny, torch.randn(1, 3, 224, 224), 198)


def test_hook_is_removed(tiny):
    with truncate_tokens(tiny, 10):
        pass
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert entering_counts(tiny, lambda: tiny(x)) == [197] * 12


def test_random_selection_is_seeded_and_keeps_prefix():
    x = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(2, 6, 3)
    picked = gather_tokens(x, 1, torch.tensor([[0, 3], [1, 4]]))
    assert torch.equal(picked[:, 0], x[:, 0])
    assert torch.equal(picked[0, 1:], x[0, [1, 4]])
    assert torch.equal(picked[1, 1:], x[1, [2, 5]])
    model = create_model("deit_tiny", input_size=64)
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        a = forward_at_tokens(model, x, 6, selection="random", seed=1)
        b = forward_at_tokens(model, x, 6, selection="random", seed=1)
        c = forward_at_tokens(model, x, 6, selection="random", seed=2)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_explicit_indices_equal_first_n():
    model = create_model("deit_tiny", input_size=64)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        first = forward_at_tokens(model, x, 9)
        explicit = forward_at_tokens(model, x, 9, indices=torch.arange(8))
    assert torch.equal(first, explicit)


def test_authors_dinov2_runs_at_n_tokens():
    vision_transformer = pytest.importorskip("dinov2.models.vision_transformer")
    model = vision_transformer.vit_small(patch_size=14, img_size=224).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        counts = entering_counts(model, lambda: forward_at_tokens(model, x, 100))
        assert torch.equal(forward_at_tokens(model, x, 257), model(x))
    assert counts == [100] * 12


def test_dropped_to_runs_each_block_at_its_count_and_leaves_the_model_as_it_was(tiny):
    x = torch.randn(1, 3, 224, 224)
    counts = [197, 150, 150, 120, 90, 90, 60, 60, 60, 30, 30, 30]
    with dropped_to(tiny, counts):
        assert entering_counts(tiny, lambda: tiny(x)) == counts
    assert entering_counts(tiny, lambda: tiny(x)) == [197] * 12



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
