"""Token scores and selection on plain tensors: scores -> indices -> gathered tokens.

Shapes: x (B, N, C) tokens with `prefix` leading prefix tokens; probs (B, H, rows, N) attention
probabilities (all N rows, or a chunk of them); v (B, H, N, d) value vectors. Scores cover patch tokens only,
shape (B, N - prefix); patch indices are 0-based among the patch tokens. Kept tokens stay in their original order."""

from __future__ import annotations

import torch


def attention_received(probs: torch.Tensor, prefix: int, first_row: int = 0) -> torch.Tensor:
    """The attention each patch token receives from the patch rows of `probs` (B, H, rows, N), whose rows start at
    query `first_row`: max over heads, summed over rows, (B, N - prefix); summed over row chunks it is the whole's."""
    skip = max(0, prefix - first_row)
    return probs.amax(dim=1)[:, skip:, prefix:].sum(dim=1)


def mean_attention_received(probs: torch.Tensor, prefix: int, first_row: int = 0) -> torch.Tensor:
    """Top-k importance without a class token: the attention each patch token receives from the patch rows of
    `probs` (B, H, rows, N), mean over heads, summed over rows (the ranking of the mean over all queries)."""
    skip = max(0, prefix - first_row)
    return probs.mean(dim=1)[:, skip:, prefix:].sum(dim=1)


def pomt_scores(received: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """POMT importance: attention received over the sample's largest, plus value magnitude (softmax over N)."""
    received = received / received.amax(dim=-1, keepdim=True)
    magnitude = v.amax(dim=1).sum(dim=-1).softmax(dim=-1)[:, prefix:]
    return received + magnitude


def class_attention_scores(cls_probs: torch.Tensor, prefix: int) -> torch.Tensor:
    """Top-k importance: the class token's attention (B, H, N) or (B, H, 1, N) to each patch token, mean over heads."""
    if cls_probs.ndim == 4:
        cls_probs = cls_probs[:, :, 0]
    return cls_probs[:, :, prefix:].mean(dim=1)


def l2norm_scores(x: torch.Tensor, prefix: int) -> torch.Tensor:
    """Feature L2 norm of each patch token."""
    return torch.linalg.vector_norm(x[:, prefix:], dim=-1)


def random_scores(batch: int, patch_tokens: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Uniform noise: keeping the best gives a uniform random subset per sample."""
    return torch.rand(batch, patch_tokens, generator=generator, device=device)


def best_indices(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices of the `keep` highest scores per row, ascending (B, keep)."""
    return scores.topk(keep, dim=-1, sorted=False).indices.sort(dim=-1).values


def split_best(scores: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, dropped): the `keep` highest scores ascending by index, the others by descending score (stable)."""
    if torch.onnx.is_in_onnx_export():
        # ONNX has no stable sort; this exports as TopK, which breaks ties by the lower index too.
        order = scores.sort(dim=-1, descending=True).indices
    else:
        order = scores.sort(dim=-1, descending=True, stable=True).indices
    return order[:, :keep].sort(dim=-1).values, order[:, keep:]


def gather_patches(x: torch.Tensor, prefix: int, indices: torch.Tensor) -> torch.Tensor:
    """The patch tokens at `indices` (B, K) -> (B, K, C), one `index_select` on the flattened batch."""
    batch, tokens, channels = x.shape
    if batch == 1:
        return x[:, prefix:].index_select(1, indices.reshape(-1))
    offsets = torch.arange(prefix, batch * tokens, tokens, device=x.device).unsqueeze(1)
    rows = x.reshape(batch * tokens, channels).index_select(0, (indices + offsets).view(-1))
    return rows.view(batch, -1, channels)


def gather_kept(x: torch.Tensor, prefix: int, kept: torch.Tensor) -> torch.Tensor:
    """Prefix tokens followed by the patch tokens at `kept` (B, K) -> (B, prefix + K, C)."""
    return torch.cat([x[:, :prefix], gather_patches(x, prefix, kept)], dim=1)


def keep_and_fuse(x: torch.Tensor, prefix: int, kept: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """Prefix, the patch tokens at `kept`, then one token that is the mean of those at `dropped`; one gather."""
    rows = gather_patches(x, prefix, torch.cat([kept, dropped], dim=1))
    keep = kept.shape[1]
    return torch.cat([x[:, :prefix], rows[:, :keep], rows[:, keep:].mean(dim=1, keepdim=True)], dim=1)
