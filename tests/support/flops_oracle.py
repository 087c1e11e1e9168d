"""FLOPs of a ViT by hand: the oracle the FLOP counter (and what pomt builds on it) is checked against."""

from __future__ import annotations

import torch

from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.patching import token_counts


def vit_flops(model, method: str | None = None, removal: dict[int, int] | None = None) -> int:
    """FLOPs per image by hand (2·M·N·K per matmul): the patch-embedding conv; per block qkv, q·kᵀ, probs·v
    and proj at the tokens entering it, the MLP at the tokens it keeps (every method prunes between
    attention and MLP), and what the method's scoring multiplies (top-k: the class token's attention row;
    ToMe: the bipartite similarity of the keys over all tokens, in every block that merges); the classifier(s) on the
    class token."""
    g, removal = model_geometry(model), removal or {}
    d, hidden = g.embed_dim, transformer_blocks(model)[0].mlp.fc1.out_features
    counts = [g.num_tokens] * (g.depth + 1)
    if method:
        counts = token_counts(g.num_tokens, g.prefix_tokens, g.depth, method, removal)
    total = 2 * g.patch_tokens * g.patch_size[0] * g.patch_size[1] * 3 * d
    for block in range(g.depth):
        n, kept = counts[block], counts[block + 1]
        total += 2 * n * d * 3 * d + 2 * 2 * n * n * d + 2 * n * d * d + 2 * 2 * kept * d * hidden
        if method == "topk" and removal.get(block):
            total += 2 * n * d
        if method == "tome" and n > kept:  # the similarity of alternating sets of all tokens, where it merges
            total += 2 * ((n + 1) // 2) * (n // 2) * (d // g.num_heads)
    heads = [getattr(model, name, None) for name in ("head", "head_dist")]
    return total + sum(2 * d * head.out_features for head in heads if isinstance(head, torch.nn.Linear))
