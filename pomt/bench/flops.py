"""FLOPs of a forward: counted by `torch.utils.flop_counter`, and an analytic ViT count to check it against.

Both count a matmul of (M, K) by (K, N) as 2·M·N·K and ignore element-wise work (norms, softmax,
GELU, gathers), as `FlopCounterMode` does. CPU attention (`_scaled_dot_product_flash_attention_for_cpu`)
is not in torch's FLOP registry, so it is registered here with torch's own SDPA formula.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils import flop_counter

from pomt.geometry import model_geometry, transformer_blocks
from pomt.patching.plan import removed_at, token_counts

_ATEN = torch.ops.aten


def _extra_formulas() -> dict:
    """FLOP formulas for attention ops that torch's registry lacks (CPU flash attention)."""
    extra = {}
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_fused_attention_overrideable",
    ):
        op = getattr(_ATEN, name, None)
        if op is not None and op not in flop_counter.flop_registry:
            extra[op] = _sdpa_flops
    return extra


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's SDPA count (q·kᵀ and probs·v); FlopCounterMode passes shapes, not tensors."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of `model(x)` as counted by `FlopCounterMode` (with CPU attention included)."""
    with (
        torch.inference_mode(),
        flop_counter.FlopCounterMode(display=False, custom_mapping=_extra_formulas()) as mode,
    ):
        model(x)
    return int(mode.get_total_flops())


@dataclass(frozen=True)
class VitSpec:
    """The sizes a ViT's FLOPs depend on."""

    embed_dim: int
    mlp_hidden: int
    num_heads: int
    patch_area: int
    in_chans: int
    patch_tokens: int
    prefix_tokens: int
    num_classes: int
    heads: int = 1  # classifier heads on the class token (2 for distilled DeiT)


def vit_spec(model: nn.Module) -> VitSpec:
    """Read a timm ViT/DeiT's sizes from the model."""
    geometry = model_geometry(model)
    block = transformer_blocks(model)[0]
    proj = model.patch_embed.proj
    classifier = getattr(model, "head", None)
    classes = int(classifier.out_features) if isinstance(classifier, nn.Linear) else 0
    heads = 2 if isinstance(getattr(model, "head_dist", None), nn.Linear) else 1
    return VitSpec(
        embed_dim=geometry.embed_dim,
        mlp_hidden=int(block.mlp.fc1.out_features),
        num_heads=geometry.num_heads,
        patch_area=geometry.patch_size[0] * geometry.patch_size[1],
        in_chans=int(proj.in_channels),
        patch_tokens=geometry.patch_tokens,
        prefix_tokens=geometry.prefix_tokens,
        num_classes=classes,
        heads=heads,
    )


def block_tokens(
    spec: VitSpec, depth: int, method: str | None, removal: Mapping[int, int]
) -> list[tuple[int, int]]:
    """(tokens into attention, tokens into MLP) per block; every method prunes between the two."""
    num_tokens = spec.patch_tokens + spec.prefix_tokens
    if method is None or not removal:
        return [(num_tokens, num_tokens)] * depth
    counts = token_counts(num_tokens, spec.prefix_tokens, depth, method, removal)
    return [(counts[b], counts[b + 1]) for b in range(depth)]


def vit_flops(
    spec: VitSpec,
    batch: int,
    tokens: Sequence[tuple[int, int]],
    method: str | None = None,
    removal: Mapping[int, int] | None = None,
) -> int:
    """Analytic FLOPs: patch-embed conv, per block qkv/attention/proj at its attention tokens and the
    MLP at its kept tokens, the classifier on the class token; plus what the method's scoring multiplies.
    """
    d, h = spec.embed_dim, spec.mlp_hidden
    total = 2 * spec.patch_tokens * spec.patch_area * spec.in_chans * d
    removal = removal or {}
    for block, (n_attn, n_mlp) in enumerate(tokens):
        total += 2 * n_attn * d * 3 * d  # qkv
        total += 2 * 2 * n_attn * n_attn * d  # q·kᵀ and probs·v over all heads
        total += 2 * n_attn * d * d  # proj
        total += 2 * 2 * n_mlp * d * h  # fc1 + fc2
        total += _scoring_flops(spec, method, n_attn, block, removal)
    total += 2 * d * spec.num_classes * spec.heads
    return batch * total


def _scoring_flops(
    spec: VitSpec, method: str | None, n_attn: int, block: int, removal: Mapping[int, int]
) -> int:
    """Matmuls a reducer adds: top-k's explicit class-token row; ToMe's similarity between its
    alternating sets of all tokens (A: even positions, B: odd) on head-sized keys, where a block merges."""
    if method == "topk" and removal.get(block):
        return 2 * n_attn * spec.embed_dim
    if method == "tome" and removed_at(method, n_attn - spec.prefix_tokens, removal.get(block, 0)):
        return 2 * ((n_attn + 1) // 2) * (n_attn // 2) * (spec.embed_dim // spec.num_heads)
    return 0


def analytic_flops(
    model: nn.Module, batch: int, method: str | None = None, removal: Mapping[int, int] | None = None
) -> int:
    """`vit_flops` for a model read from the model itself, with `removal` applied by `method`."""
    spec = vit_spec(model)
    depth = len(transformer_blocks(model))
    removal = dict(removal or {})
    return vit_flops(spec, batch, block_tokens(spec, depth, method, removal), method, removal)


def match_amount(flops_at: Callable[[int], float], target: float, low: int, high: int) -> int:
    """The amount in [low, high] whose FLOPs are closest to `target`, for FLOPs non-increasing in amount.

    Bisection: about log2(high - low) calls of `flops_at`.
    """
    if low > high:
        raise ValueError(f"empty amount range [{low}, {high}]")
    lo, hi = low, high
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if flops_at(mid) > target:
            lo = mid
        else:
            hi = mid
    return min((lo, hi), key=lambda amount: abs(flops_at(amount) - target))
