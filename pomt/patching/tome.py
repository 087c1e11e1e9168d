"""Bipartite soft matching, as published (Bolya et al., "Token Merging: Your ViT but Faster", ICLR 2023).

Pure functions on all T tokens of a block, the P prefix tokens (class, distillation, registers) included.
Set A = even positions, set B = odd. Every A token proposes its most similar B token (cosine similarity of
the metric) and the r best proposals merge into their B token. Prefix tokens are protected (a prefix token
in A never proposes, one in B is never proposed to) and at most (T - P) // 2 pairs merge. Output order, as
the authors' code gives it: the prefix tokens, the unmerged A tokens (in their original order when there is
a prefix token, else by decreasing best similarity), then the B tokens. Few ops, each a kernel launch, and
only static-shape ones (gather, scatter_add, slice fills, argsort), so the merge exports to ONNX.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from pomt.models.tokens import identity_index


class Matching(NamedTuple):
    """Unmerged A tokens, and which A tokens (src) merge into which B tokens (dst); (B, k, 1) each.

    Indices count within set A (unmerged, src) or set B (dst); `prefix` is P.
    """

    unmerged: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    prefix: int


def max_merge(tokens: int, protected: int = 0) -> int:
    """The published cap on merges in one block: (tokens - protected) // 2."""
    return (tokens - protected) // 2


def bipartite_matching(metric: torch.Tensor, r: int, prefix: int = 0) -> Matching:
    """Match r pairs between the alternating sets of `metric` (B, T, C) whose first `prefix` tokens are
    protected; requires 0 <= r <= (T - prefix) // 2."""
    tokens = metric.shape[1]
    if not 0 <= prefix <= tokens or not 0 <= r <= max_merge(tokens, prefix):
        raise ValueError(f"cannot merge {r} pairs among {tokens} tokens with {prefix} protected")
    metric = metric / torch.linalg.vector_norm(metric, dim=-1, keepdim=True)
    a, b = metric[:, ::2], metric[:, 1::2]
    similarity = a @ b.transpose(-1, -2)
    if prefix // 2:  # prefix tokens in B are never proposed to
        similarity[..., : prefix // 2] = -torch.inf
    best, best_dst = similarity.max(dim=-1)
    if prefix:  # prefix tokens in A never propose: their best similarity is the lowest
        best[:, : (prefix + 1) // 2] = -torch.inf
    order = best.argsort(dim=-1, descending=True)
    src, unmerged = order[:, :r], order[:, r:]
    if prefix:
        unmerged = unmerged.sort(dim=-1).values
    dst = best_dst.gather(1, src)
    return Matching(unmerged.unsqueeze(-1), src.unsqueeze(-1), dst.unsqueeze(-1), prefix)


def merge_sum(x: torch.Tensor, matching: Matching) -> torch.Tensor:
    """Apply the matching to x (B, T, C) by summing merged tokens: (B, T - r, C) in the output order."""
    channels, prefix = x.shape[-1], matching.prefix
    a, b = x[:, ::2], x[:, 1::2]
    unmerged = a.gather(1, matching.unmerged.expand(-1, -1, channels))
    moved = a.gather(1, matching.src.expand(-1, -1, channels))
    b = b.scatter_add(1, matching.dst.expand(-1, -1, channels), moved)  # scatter_reduce trips an ONNX exporter
    return torch.cat([x[:, :prefix], unmerged[:, (prefix + 1) // 2 :], b[:, prefix // 2 :]], dim=1)


def merge_weighted(x: torch.Tensor, size: torch.Tensor, matching: Matching) -> tuple[torch.Tensor, torch.Tensor]:
    """Size-weighted average merge of x (B, T, C) with token sizes (B, T, 1); returns (x, size)."""
    total = merge_sum(x * size, matching)
    size = merge_sum(size, matching)
    return total / size, size


def merge_index(index: torch.Tensor | None, matching: Matching, batch: int, tokens: int) -> torch.Tensor:
    """The original places (B, T) of the tokens after the merge: a merged token keeps its destination's."""
    if index is None:
        index = identity_index(batch, tokens, matching.src.device)
    index, prefix = index.unsqueeze(-1), matching.prefix
    unmerged = index[:, ::2].gather(1, matching.unmerged)
    return torch.cat([index[:, :prefix], unmerged[:, (prefix + 1) // 2 :], index[:, 1::2][:, prefix // 2 :]],
                     dim=1).squeeze(-1)
