"""Every reducer on every ViT family pomt patches, checked against the unpatched model: RoPE (timm Eva: EVA02 with
fused qkv and SwiGLU, separate q/k/v, grouped k/v heads, DINOv3 with registers, per-head mixed RoPE), relative
position bias (BEiT, own and shared), no class token (SigLIP's MAP head and an average-pooled one), open_clip's
image tower (`nn.MultiheadAttention`).

A permutation of the patch tokens whose positions follow them is invisible to a ViT; tokens pruned by given
indices equal the unpatched model run on the same gathered tokens; nothing removed is exact."""

from __future__ import annotations

import pytest
import timm
import torch

from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.models.hf import HFVision
from pomt.models.tokens import cut_tokens, gather_bias, gather_rope, position_kind, truncate_tokens
from pomt.patching import METHODS, patch, patch_state, patched, unpatch
from pomt.patching.blocks import BlockPlan, PatchState, install, run_follow, run_pomt, uninstall

SIZE = 64
SMALL = {"img_size": SIZE, "depth": 4}
FAMILIES = {
    "eva02": ("eva02_tiny_patch14_224", {"patch_size": 16}),
    "eva02_separate_qkv": ("eva02_tiny_patch14_224", {"patch_size": 16, "qkv_fused": False}),
    "rope_grouped_kv": ("vit_small_patch16_rope_224", {"qkv_fused": False, "num_kv_heads": 2}),
    "rope_mixed": ("vit_small_patch16_rope_mixed_224", {}),
    "dinov3": ("vit_small_patch16_dinov3", {}),
    "beit": ("beit_base_patch16_224", {"embed_dim": 192, "num_heads": 3}),
    "beit_shared_bias": ("beit_base_patch16_224", {"embed_dim": 192, "num_heads": 3, "use_rel_pos_bias": False,
                                                    "use_shared_rel_pos_bias": True}),
    "siglip_map": ("vit_base_patch16_siglip_224", {"embed_dim": 192, "num_heads": 3}),
    "siglip_avg": ("vit_base_patch16_siglip_gap_224", {"embed_dim": 192, "num_heads": 3}),
    "deit": ("deit_tiny_patch16_224", {}),
    "open_clip": ("open_clip", {"pool_type": "tok"}),
    "open_clip_avg": ("open_clip", {"pool_type": "avg"}),
    "hf_vit": ("transformers", {"config": "ViTConfig", "model": "ViTForImageClassification", "output": "logits"}),
    "hf_clip": ("transformers", {"config": "CLIPVisionConfig", "model": "CLIPVisionModelWithProjection",
                                 "output": "image_embeds"}),
    "hf_siglip": ("transformers", {"config": "SiglipVisionConfig", "model": "SiglipVisionModel"}),
    "hf_dinov2": ("transformers", {"config": "Dinov2Config", "model": "Dinov2Model"}),
    "hf_dinov2_registers": ("transformers", {"config": "Dinov2WithRegistersConfig", "model": "Dinov2WithRegistersModel",
                                             "num_register_tokens": 4}),
}
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def _open_clip(pool_type: str) -> torch.nn.Module:
    """open_clip's VisionTransformer (its image tower) at a small size."""
    transformer = pytest.importorskip("open_clip.transformer", reason="open_clip_torch is not installed")
    return transformer.VisionTransformer(image_size=SIZE, patch_size=16, width=192, layers=SMALL["depth"], heads=3,
                                         mlp_ratio=4.0, output_dim=64, pool_type=pool_type)


def _transformers(config: str, model: str, output: str = "pooler_output", **options) -> torch.nn.Module:
    """A transformers vision model as a user builds one, at a small size, its output tensor returned."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install 'pomt[hf]'")
    settings = {"image_size": SIZE, "patch_size": 16, "hidden_size": 96, "num_hidden_layers": SMALL["depth"],
                "num_attention_heads": 3, "intermediate_size": 192, **options}
    return HFVision(getattr(transformers, model)(getattr(transformers, config)(**settings)), model, output)


def _build(family: str) -> torch.nn.Module:
    name, options = FAMILIES[family]
    torch.manual_seed(0)
    if name == "open_clip":
        model = _open_clip(**options).eval()
    elif name == "transformers":
        model = _transformers(**options).eval()
    else:
        model = timm.create_model(name, pretrained=False, **{**SMALL, **options}).eval()
    for parameter in model.parameters():  # weights large enough that positions show in the output
        if parameter.ndim > 1:
            parameter.data.normal_(0, 0.1)
    return model


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    class Built(dict):
        def __missing__(self, family: str) -> torch.nn.Module:
            self[family] = _build(family)
            return self[family]

    return Built()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))


def test_each_family_has_what_its_name_says(models):
    assert position_kind(models["eva02"]) == position_kind(models["dinov3"]) == "rope"
    assert position_kind(models["beit"]) == position_kind(models["beit_shared_bias"]) == "relative"
    assert position_kind(models["siglip_map"]) is None
    assert model_geometry(models["dinov3"]).prefix_tokens == 5  # class + 4 registers
    assert model_geometry(models["siglip_map"]).prefix_tokens == 0
    assert transformer_blocks(models["rope_grouped_kv"])[0].attn.num_kv_groups == 3


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "deit"])
def test_a_permutation_whose_positions_follow_is_invisible(models, images, family):
    model, geometry = models[family], model_geometry(models[family])
    shuffled = torch.stack([torch.randperm(geometry.patch_tokens, generator=torch.Generator().manual_seed(s))
                            for s in range(images.shape[0])])
    with torch.no_grad():
        want = model(images)
        with truncate_tokens(model, geometry.num_tokens, indices=shuffled, at_block=1):
            got = model(images)
    torch.testing.assert_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("family", ["eva02", "beit", "beit_shared_bias"])
def test_the_same_permutation_without_its_positions_shows(models, images, family):
    model, geometry = models[family], model_geometry(models[family])
    shuffled = torch.randperm(geometry.patch_tokens, generator=torch.Generator().manual_seed(0)).expand(2, -1)
    with torch.no_grad():
        assert (_without_positions(model, images, shuffled) - model(images)).abs().max() > 1e-2


def _without_positions(model: torch.nn.Module, images: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The model with its patch tokens reordered before block 1 and nothing else changed."""
    prefix = model_geometry(model).prefix_tokens

    def shuffle(_module, args):
        x = args[0]
        patches = x[:, prefix:].gather(1, order.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        return (torch.cat([x[:, :prefix], patches], dim=1), *args[1:])

    handle = transformer_blocks(model)[1].register_forward_pre_hook(shuffle)
    try:
        with torch.no_grad():
            return model(images)
    finally:
        handle.remove()


def _forced(model: torch.nn.Module, run, block: int) -> PatchState:
    """Block `block` forced through `run` removing nothing, and every later block following (the public API leaves a
    block that removes nothing alone)."""
    geometry, blocks = model_geometry(model), transformer_blocks(model)
    state = PatchState("pomt", {block: 0}, geometry.prefix_tokens, positions=position_kind(model))
    state.originals[block] = install(blocks[block], BlockPlan(run, 0, state, first=True))
    for later in range(block + 1, geometry.depth):
        state.originals[later] = install(blocks[later], BlockPlan(run_follow, 0, state))
    return state


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_pruning_path_with_nothing_removed_equals_the_model(models, images, family):
    """pomt removing 0 still fuses one token (the least important, moved to the end): a permutation whose position
    follows, so the output is the model's; every later block runs pomt's own attention (heads, rope, biases,
    layer scales)."""
    model = models[family]
    with torch.no_grad():
        want = model(images)
        state = _forced(model, run_pomt, 1)
        try:
            got = model(images)
        finally:
            for index, original in state.originals.items():
                uninstall(transformer_blocks(model)[index], original)
        assert torch.equal(model(images), want)
    torch.testing.assert_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_removing_nothing_is_exact_and_removing_runs(models, images, family, method):
    model = models[family]
    with torch.no_grad():
        want = model(images)
        patch(model, method, {1: 0})
        assert torch.equal(model(images), want)
        patch(model, method, {1: 6, 2: 4})
        got = model(images)
        unpatch(model)
        assert torch.equal(model(images), want)
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert patch_state(model) is None


@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_pruning_equals_the_model_on_the_same_gathered_tokens(models, images, family):
    """`random` keeps a seeded subset after block 1's and block 2's attention; the MLP works token by token, so
    that equals the unpatched model with the same tokens (and their positions) cut before blocks 2 and 3."""
    model, geometry = models[family], model_geometry(models[family])
    removal, seed = {1: 6, 2: 4}, 7
    generator, patches, kept = torch.Generator().manual_seed(seed), geometry.patch_tokens, {}
    for block, remove in removal.items():
        noise = torch.rand(images.shape[0], patches, generator=generator)
        kept[block + 1] = noise.topk(patches - remove, dim=-1).indices.sort(dim=-1).values
        patches -= remove
    with torch.no_grad():
        with patched(model, "random", removal, seed=seed):
            got = model(images)
        with cut_tokens(model, {block: (lambda _x, k=k: k) for block, k in kept.items()}):
            want = model(images)
    torch.testing.assert_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("family", ["eva02", "dinov3", "rope_mixed"])
def test_rope_follows_the_tokens_as_timm_gathers_it_for_patch_dropout(models, images, family):
    """timm gathers an Eva's rotary embedding with the tokens its patch dropout keeps; cutting the same tokens
    before block 0 gives the same output."""
    model, geometry = models[family], model_geometry(models[family])
    keep = torch.stack([torch.randperm(geometry.patch_tokens, generator=torch.Generator().manual_seed(s))[:10]
                        for s in range(images.shape[0])]).sort(dim=-1).values

    class KeepGiven(torch.nn.Module):
        def forward(self, x):
            prefix = geometry.prefix_tokens
            patches = x[:, prefix:].gather(1, keep.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
            return torch.cat([x[:, :prefix], patches], dim=1), keep

    with torch.no_grad():
        with truncate_tokens(model, geometry.prefix_tokens + 10, indices=keep):
            got = model(images)
        dropout, model.patch_drop = model.patch_drop, KeepGiven()
        try:
            want = model(images)
        finally:
            model.patch_drop = dropout
    torch.testing.assert_close(got, want, **TOLERANCE)


def test_gathered_positions_match_loops():
    generator = torch.Generator().manual_seed(0)
    bias, index = torch.randn(1, 3, 7, 7, generator=generator), torch.tensor([[0, 4, 2], [0, 6, 1]])
    gathered = gather_bias(bias, index)
    batched = gather_bias(bias.expand(2, -1, -1, -1).clone(), index)
    for b in range(2):
        for i in range(3):
            for j in range(3):
                assert torch.equal(gathered[b, :, i, j], bias[0, :, index[b, i], index[b, j]])
    assert torch.equal(batched, gathered)
    rope, per_head = torch.randn(6, 4, generator=generator), torch.randn(3, 6, 4, generator=generator)
    assert torch.equal(gather_rope(rope, index, 1)[1, 0], rope[[5, 0]])
    assert torch.equal(gather_rope(per_head, index, 1)[0, 2], per_head[2, [3, 1]])


@pytest.mark.parametrize("family", ["siglip_map", "siglip_avg", "eva02", "beit", "open_clip_avg", "hf_siglip"])
def test_tome_pools_a_merged_token_as_the_tokens_it_stands_for(models, family):
    """A head that combines tokens (an average, SigLIP's attention pool) gives a token of size 2 the weight of two
    equal tokens."""
    model, geometry = models[family], model_geometry(models[family])
    prefix = geometry.prefix_tokens
    features = torch.randn(2, prefix + 5, geometry.embed_dim, generator=torch.Generator().manual_seed(2))
    doubled = torch.cat([features, features[:, -1:]], dim=1)
    patch(model, "tome", {0: 1})
    try:
        patch_state(model).size = torch.tensor([1.0] * (prefix + 4) + [2.0]).view(1, -1, 1).expand(2, -1, -1)
        with torch.no_grad():
            merged = _head(model, features)
    finally:
        unpatch(model)
    with torch.no_grad():
        torch.testing.assert_close(merged, _head(model, doubled), **TOLERANCE)
        assert not torch.allclose(_head(model, features), _head(model, doubled), atol=1e-4)


def _head(model: torch.nn.Module, features: torch.Tensor) -> torch.Tensor:
    """What the model's head makes of the blocks' output tokens."""
    if isinstance(model, HFVision):
        return model.hf.head(features)
    return model._pool(features)[0] if hasattr(model, "_pool") else model.forward_head(features)


@pytest.mark.parametrize("family", ["eva02", "beit", "rope_mixed", "deit"])
def test_nested_cuts_and_a_patch_after_a_cut_compose(models, images, family):
    """Cuts entered one inside the other equal one context with both (positions composed once), and a block patched
    after a cut sees the positions of the tokens the cut left (the reducer costs measure both ways)."""
    model, geometry = models[family], model_geometry(models[family])
    n = geometry.num_tokens
    with torch.no_grad():
        with truncate_tokens(model, n - 3, selection="random", seed=1, at_block=1), \
                truncate_tokens(model, n - 5, at_block=2):
            nested = model(images)
        with truncate_tokens(model, n - 3, selection="random", seed=1, at_block=1):
            again = model(images)
        with cut_tokens(model, {1: _seeded_random(geometry, n - 3, seed=1), 2: lambda _x: n - 5}):
            once = model(images)
        with truncate_tokens(model, n - 3, at_block=1), patched(model, "random", {1: 2, 2: 2}, seed=2):
            cut_then_patched = model(images)
        generator, patches, kept = torch.Generator().manual_seed(2), n - 3 - geometry.prefix_tokens, {}
        for block in (2, 3):
            noise = torch.rand(images.shape[0], patches, generator=generator)
            kept[block], patches = noise.topk(patches - 2, dim=-1).indices.sort(dim=-1).values, patches - 2
        cuts = {1: lambda _x: n - 3, 2: lambda _x: kept[2], 3: lambda _x: kept[3]}
        with cut_tokens(model, cuts):
            cut_alone = model(images)
    torch.testing.assert_close(nested, once, **TOLERANCE)
    assert not torch.allclose(nested, again, atol=1e-4)
    torch.testing.assert_close(cut_then_patched, cut_alone, **TOLERANCE)


def _seeded_random(geometry, n: int, seed: int):
    """The patch indices `truncate_tokens(selection="random", seed=seed)` keeps in its first forward."""
    from pomt.models.tokens import random_patch_indices

    generator = torch.Generator().manual_seed(seed)
    return lambda x: random_patch_indices(x.shape[0], x.shape[1] - geometry.prefix_tokens,
                                          n - geometry.prefix_tokens, generator, x.device)
