"""ToMe (pomt/patching/tome.py and its patches) against a re-derivation written from the paper.

The reference below follows Bolya et al., "Token Merging: Your ViT but Faster" (ICLR 2023) with plain
loops over samples, heads, tokens and candidate pairs: sets alternate over all tokens (A even, B odd),
prefix tokens are protected, r is capped at (tokens - protected) // 2, merged tokens are size-weighted
averages, attention adds log(size) to its logits once tokens have merged, and models that average their
tokens pool by size. The output order is the authors' code's: prefix tokens, unmerged A tokens (sorted
when there is a prefix token, else by decreasing similarity), then B tokens.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import timm
import torch

from pomt.bench.costs import count_flops
from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.patching import patch, patch_state, token_counts, unpatch
from pomt.patching.tome import bipartite_matching, merge_weighted

from support.flops_oracle import vit_flops

ATOL = 1e-5


def _reference_merge(
    tokens: list[torch.Tensor], sizes: list[float], similarity: list[list[float]], r: int, prefix: int
) -> tuple[list[torch.Tensor], list[float]]:
    """One ToMe step on one sample: tokens (T vectors), sizes, cosine similarities (T x T) of the keys."""
    count = len(tokens)
    set_a = [i for i in range(0, count, 2) if i >= prefix]
    set_b = [j for j in range(1, count, 2) if j >= prefix]
    proposals = []  # (similarity, a, its most similar b)
    for i in set_a:
        best_j, best = -1, -math.inf
        for j in set_b:
            if similarity[i][j] > best:
                best_j, best = j, similarity[i][j]
        proposals.append((best, i, best_j))
    proposals.sort(key=lambda p: -p[0])
    merged, kept = proposals[:r], proposals[r:]
    groups = {j: [j] for j in set_b}
    for _, i, j in merged:
        groups[j].append(i)
    unmerged = [i for _, i, _ in kept]
    if prefix:
        unmerged.sort()
    out_tokens, out_sizes = [], []
    for index in [*range(prefix), *unmerged, *set_b]:
        members = groups.get(index, [index])
        total = sum(sizes[m] for m in members)
        out_tokens.append(sum(tokens[m] * sizes[m] for m in members) / total)
        out_sizes.append(total)
    return out_tokens, out_sizes


def _reference_attention(attn, y: torch.Tensor, sizes: list[float] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scale + log size) v per head, explicitly; also the keys averaged over heads."""
    count, channels = y.shape
    heads = attn.num_heads
    qkv = attn.qkv(y).view(count, 3, heads, channels // heads)
    outs, keys = [], []
    for h in range(heads):
        q, k, v = qkv[:, 0, h], qkv[:, 1, h], qkv[:, 2, h]
        logits = (q @ k.T) * attn.scale
        if sizes is not None:
            logits = logits + torch.tensor(sizes).log()[None, :]
        outs.append(logits.softmax(dim=-1) @ v)
        keys.append(k)
    return attn.proj(torch.cat(outs, dim=-1)), torch.stack(keys).mean(dim=0)


def _reference_head(model, tokens: list[torch.Tensor], sizes: list[float], prefix: int) -> torch.Tensor:
    x = model.norm(torch.stack(tokens))
    if hasattr(model, "head_dist"):
        return (model.head(x[0]) + model.head_dist(x[1])) / 2
    if model.global_pool == "token":
        return model.head(model.fc_norm(x[0]))
    assert model.global_pool == "avg"
    weights = torch.tensor(sizes[prefix:])[:, None]
    pooled = (x[prefix:] * weights).sum(dim=0) / weights.sum()
    return model.head(model.fc_norm(pooled))


def reference_tome(model, images: torch.Tensor, r: int) -> tuple[torch.Tensor, list[int]]:
    """Logits of `model` with ToMe merging r tokens per block, one sample at a time; and the token
    count entering each block (the same for every sample)."""
    prefix = model.num_prefix_tokens
    logits, counts = [], []
    with torch.no_grad():
        for image in images:
            x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(image[None]))))[0]
            tokens, sizes, merged_yet = list(x), [1.0] * x.shape[0], False
            counts = []
            for block in model.blocks:
                counts.append(len(tokens))
                x = torch.stack(tokens)
                out, keys = _reference_attention(block.attn, block.norm1(x), sizes if merged_yet else None)
                x = x + block.ls1(out)
                step = min(r, (len(tokens) - prefix) // 2)
                tokens = list(x)
                if step > 0:
                    unit = keys / keys.norm(dim=-1, keepdim=True)
                    tokens, sizes = _reference_merge(tokens, sizes, (unit @ unit.T).tolist(), step, prefix)
                    merged_yet = True
                x = torch.stack(tokens)
                tokens = list(x + block.ls2(block.mlp(block.norm2(x))))
            counts.append(len(tokens))
            logits.append(_reference_head(model, tokens, sizes, prefix))
    return torch.stack(logits), counts


def _timm(name: str, **kwargs) -> torch.nn.Module:
    return timm.create_model(name, pretrained=False, **kwargs).eval()


MODELS = {
    "deit_small": lambda: _timm("deit_small_patch16_224"),
    "deit_small_distilled": lambda: _timm("deit_small_distilled_patch16_224"),
    "dinov2_reg4": lambda: _timm("vit_small_patch14_reg4_dinov2", img_size=224, init_values=1.0),
    "vit_avg": lambda: _timm("vit_small_patch16_224", class_token=False, global_pool="avg"),
    "vit_avg_cls": lambda: _timm("vit_small_patch16_224", global_pool="avg"),
}


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {name: make() for name, make in MODELS.items()}


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))


def _patched_run(model, images: torch.Tensor, r: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """pomt's ToMe logits, the token count entering each block, and the final token sizes."""
    counts = []
    patch(model, "tome", r)
    handles = [b.register_forward_pre_hook(lambda _m, a: counts.append(a[0].shape[1])) for b in model.blocks]
    try:
        with torch.no_grad():
            logits = model(images)
        size = patch_state(model).size
    finally:
        for handle in handles:
            handle.remove()
        unpatch(model)
    return logits, counts, size


@pytest.mark.parametrize("r", [1, 4, 10])
@pytest.mark.parametrize("name", list(MODELS))
def test_tome_matches_the_reference(models, images, name, r):
    model = models[name]
    geometry = model_geometry(model)
    want, want_counts = reference_tome(model, images, r)
    got, counts, size = _patched_run(model, images, r)
    with torch.no_grad():
        assert (model(images) - want).abs().max().item() > 100 * ATOL  # merging changes the logits
    assert (got - want).abs().max().item() <= ATOL
    removal = dict.fromkeys(range(geometry.depth), r)
    expected = token_counts(geometry.num_tokens, geometry.prefix_tokens, geometry.depth, "tome", removal)
    assert counts + [size.shape[1]] == want_counts == expected
    assert torch.equal(size[:, : geometry.prefix_tokens], torch.ones_like(size[:, : geometry.prefix_tokens]))
    assert torch.equal(size.sum(dim=1), torch.full_like(size.sum(dim=1), geometry.num_tokens))


def test_the_published_cap_and_the_last_blocks(models, images):
    """r above the cap: (tokens - prefix) // 2 per block, down to one patch token; reference agrees."""
    model = models["deit_small_distilled"]
    want, want_counts = reference_tome(model, images[:1], 150)
    got, counts, _ = _patched_run(model, images[:1], 150)
    assert counts == want_counts[:-1] == [198, 100, 51, 27, 15, 9, 6, 4, 3, 3, 3, 3]
    assert (got - want).abs().max().item() <= ATOL


def test_size_weighted_pooling_is_what_makes_avg_models_match(models, images):
    """The avg-pooled model's logits differ from the reference without the size weighting."""
    model = models["vit_avg"]
    want, _ = reference_tome(model, images, 10)
    patch(model, "tome", 10)
    try:
        with torch.no_grad():
            features = model.forward_features(images)
            weighted = model.forward_head(features)
            unweighted = model.head(model.fc_norm(features.mean(dim=1)))
            mean, top = model.pool(features), features.amax(dim=1)
            assert torch.equal(model.pool(features, "avgmax"), 0.5 * (top + mean))
            assert torch.equal(model.pool(features, "max"), top)
    finally:
        unpatch(model)
    assert (weighted - want).abs().max().item() <= ATOL
    assert (unweighted - want).abs().max().item() > 100 * ATOL


@pytest.mark.parametrize("prefix", [0, 1, 2, 5])
def test_matching_on_plain_tensors_matches_the_reference(prefix):
    generator = torch.Generator().manual_seed(prefix)
    for count in (prefix + 2, prefix + 3, 9, 16):
        x = torch.randn(3, count, 4, generator=generator)
        metric = torch.randn(3, count, 5, generator=generator)
        size = torch.randint(1, 4, (3, count, 1), generator=generator).float()
        size[:, :prefix] = 1
        for r in range((count - prefix) // 2 + 1):
            merged, new_size = merge_weighted(x, size, bipartite_matching(metric, r, prefix))
            for b in range(3):
                unit = metric[b] / metric[b].norm(dim=-1, keepdim=True)
                tokens, sizes = _reference_merge(
                    list(x[b]), size[b, :, 0].tolist(), (unit @ unit.T).tolist(), r, prefix
                )
                torch.testing.assert_close(merged[b], torch.stack(tokens))
                assert new_size[b, :, 0].tolist() == sizes


def _on_circle(degrees: list[float]) -> torch.Tensor:
    """A (1, T, 2) metric whose cosine similarities are the cosines of the angle differences."""
    angles = torch.tensor(degrees) * math.pi / 180
    return torch.stack([angles.cos(), angles.sin()], dim=-1)[None]


def _merged(metric: torch.Tensor, r: int, prefix: int) -> tuple[list[float], list[float]]:
    """Merge tokens valued 0..T-1 (size 1 each); returns values and sizes in output order."""
    x = torch.arange(float(metric.shape[1])).view(1, -1, 1)
    merged, size = merge_weighted(x, torch.ones_like(x), bipartite_matching(metric, r, prefix))
    return merged[0, :, 0].tolist(), size[0, :, 0].tolist()


def test_prefix_tokens_are_never_merged_and_stay_in_front():
    """Class token 0 and distillation token 1 point the same way as token 2, the most similar pairs."""
    metric = _on_circle([0, 0, 1, 90, 92, 180, 183])
    assert _merged(metric, 3, 0) == ([6, 1, 3.5, 5], [1, 3, 2, 1])  # unprotected: 0 and 2 merge into 1
    assert _merged(metric, 3, 1) == ([0, 1.5, 3.5, 5.5], [1, 2, 2, 2])  # the class token stays
    assert _merged(metric, 2, 2) == ([0, 1, 2, 3.5, 5.5], [1, 1, 1, 2, 2])  # and the distillation token


def test_unmerged_order_follows_the_authors():
    """Sorted by position with a prefix; by decreasing best similarity without one (as the authors leave it)."""
    metric = _on_circle([0, 10, 100, 130, 240, 260])  # best matches: 0->1 (10°), 4->5 (20°), 2->3 (30°)
    assert _merged(metric, 1, 0) == ([4, 2, 0.5, 3, 5], [1, 1, 2, 1, 1])
    assert _merged(metric, 1, 1) == ([0, 2, 1, 3, 4.5], [1, 1, 1, 1, 2])


@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_protection_builds_no_mask(prefix):
    """Every op of a merge block is a kernel launch on a GPU: prefix tokens are protected by filling slices of
    the similarities in place, not by a mask built (arange, compare, or, masked_fill) in every block."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        bipartite_matching(torch.randn(2, 17, 8), 3, prefix)
    names = {event.name for event in profiled.events() if event.cpu_parent is None}  # what the code calls
    assert "aten::max" in names and not names & {"aten::arange", "aten::lt", "aten::__or__", "aten::masked_fill"}


def test_matching_refuses_more_than_the_cap():
    with pytest.raises(ValueError):
        bipartite_matching(torch.randn(1, 7, 3), 3, prefix=2)
    bipartite_matching(torch.randn(1, 7, 3), 2, prefix=2)


@pytest.mark.parametrize("name", ["deit_small_distilled", "vit_avg"])
def test_unpatch_restores_exactly_and_r0_changes_nothing(models, images, name):
    model = models[name]
    model_class, block_classes = type(model), [type(b) for b in transformer_blocks(model)]
    with torch.no_grad():
        reference = model(images)
        patch(model, "tome", 0)
        assert type(model) is model_class and patch_state(model) is not None
        assert torch.equal(model(images), reference)
        patch(model, "tome", {2: 4, 5: 0})
        assert (type(model) is not model_class) == (name == "vit_avg")
        twin = copy.deepcopy(model)
        assert torch.equal(twin(images), model(images))
        assert not torch.equal(model(images), reference)
        unpatch(model)
        assert torch.equal(model(images), reference)
    assert type(model) is model_class
    assert [type(b) for b in transformer_blocks(model)] == block_classes
    assert not any(key.startswith("_pomt") for key in model.__dict__)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("deit_tiny_patch16_224", {}),
        ("deit_tiny_distilled_patch16_224", {}),
        ("vit_tiny_patch16_224", {"class_token": False, "global_pool": "avg"}),
    ],
)
def test_the_flop_oracle_counts_the_matching_where_a_block_merges(name, kwargs):
    """ToMe's similarity over all tokens, skipped where the cap leaves nothing to merge (17 tokens: r=8
    reaches 2 tokens by block 4), equals the FLOP counter on the patched model."""
    model = _timm(name, img_size=64, **kwargs)
    x = torch.randn(2, 3, 64, 64)
    for prune in (2, 8, {3: 5, 7: 1}):
        patched = patch(copy.deepcopy(model), "tome", prune)
        removal = dict.fromkeys(range(12), prune) if isinstance(prune, int) else prune
        assert count_flops(patched, x) == 2 * vit_flops(model, "tome", removal), prune


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True])
def test_a_tome_model_exports_to_onnx(tmp_path, dynamo):
    """Static-shape ops only: both torch exporters give a graph that onnxruntime runs to the same logits."""
    ort = pytest.importorskip("onnxruntime")
    model = patch(_timm("deit_tiny_distilled_patch16_224", img_size=64), "tome", 4)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    path = tmp_path / "tome.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), opset_version=17, dynamo=dynamo)
    session = ort.InferenceSession(str(path))
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(x), atol=1e-5, rtol=1e-5)
