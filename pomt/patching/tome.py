"""Bipartite soft matching (Bolya et al., "Token Merging: Your ViT but Faster", ICLR 2023).

Pure functions on patch tokens only (the caller keeps prefix tokens out). Tokens alternate between
set A (even positions) and set B (odd positions); each A token proposes its most similar B token
(cosine similarity of the metric) and the r most similar pairs merge into their B token.
Output order: the unmerged A tokens in their original order, then all B tokens in their original order.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Matching(NamedTuple):
    """Which A tokens stay (unmerged) and which merge (src) into which B token (dst); (B, k, 1) each."""

    unmerged: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor


def max_merge(tokens: int) -> int:
    """At most half the tokens merge in one step (the size of set B)."""
    return tokens // 2


def bipartite_matching(metric: torch.Tensor, r: int) -> Matching:
    """Match r pairs between alternating sets of `metric` (B, T, C); requires 0 <= r <= T // 2."""
    if not 0 <= r <= max_merge(metric.shape[1]):
        raise ValueError(f"cannot merge {r} pairs among {metric.shape[1]} tokens")
    metric = metric / torch.linalg.vector_norm(metric, dim=-1, keepdim=True)
    a, b = metric[:, ::2], metric[:, 1::2]
    similarity = a @ b.transpose(-1, -2)
    best, best_dst = similarity.max(dim=-1)
    order = best.argsort(dim=-1, descending=True)
    src = order[:, :r]
    unmerged = order[:, r:].sort(dim=-1).values
    dst = best_dst.gather(1, src)
    return Matching(unmerged.unsqueeze(-1), src.unsqueeze(-1), dst.unsqueeze(-1))


def merge_sum(x: torch.Tensor, matching: Matching) -> torch.Tensor:
    """Apply the matching to x (B, T, C) by summing merged tokens: (B, T - r, C)."""
    channels = x.shape[-1]
    a, b = x[:, ::2], x[:, 1::2]
    kept = a.gather(1, matching.unmerged.expand(-1, -1, channels))
    moved = a.gather(1, matching.src.expand(-1, -1, channels))
    b = b.scatter_add(1, matching.dst.expand(-1, -1, channels), moved)
    return torch.cat([kept, b], dim=1)


def merge_weighted(
    x: torch.Tensor, size: torch.Tensor, matching: Matching
) -> tuple[torch.Tensor, torch.Tensor]:
    """Size-weighted average merge of x (B, T, C) with token sizes (B, T, 1); returns (x, size)."""
    total = merge_sum(x * size, matching)
    size = merge_sum(size, matching)
    return total / size, size
