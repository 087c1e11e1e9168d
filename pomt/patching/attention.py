"""Self-attention on per-head tensors (B, H, N, d), so a pruning block can see what a fused path hides: explicit
probabilities in chunks of query rows that fit a memory budget, the fused path with an additive bias, and the token
scores read from them. Scores cover patch tokens only, (B, N - prefix); kept tokens stay in their original order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

PROBS_BYTES = 16 * 2**20  # explicit attention probabilities a patched block holds at once on the CPU
MLP_RATIO = 4  # a ViT block's MLP hidden width over its channels: the activation a GPU chunk may match
_CHUNKED_FOR: ContextVar[str | None] = ContextVar("chunked_for", default=None)  # `chunked_for`


def call_layer(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)`, skipping the module call where the layer returns x itself (`nn.Identity`, inactive dropout)."""
    if type(layer) is nn.Identity or (type(layer) is nn.Dropout and (layer.p == 0 or not layer.training)):
        return x
    return layer(x)


def probabilities(q: torch.Tensor, k: torch.Tensor, scale: float, bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·kᵀ · scale + bias) over keys, computed explicitly (B, H, Nq, N); `bias` (B, H or 1, Nq or 1, N)."""
    batch, heads, queries, dim = q.shape
    q3, k3 = q.reshape(batch * heads, queries, dim), k.reshape(batch * heads, -1, dim)
    logits = torch.baddbmm(q3.new_empty(()), q3, k3.transpose(1, 2), beta=0, alpha=scale)
    logits = logits.view(batch, heads, queries, -1)
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    return logits.softmax(dim=-1)


def bias_rows(bias: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    """The rows of an attention bias for the queries start..stop (a bias of one row serves every query)."""
    return bias if bias is None or bias.shape[-2] == 1 else bias[..., start:stop, :]


def probs_budget(q: torch.Tensor) -> int:
    """Bytes of explicit probabilities a patched block holds at once for queries q (B, H, N, d): PROBS_BYTES on the
    CPU, the MLP's (B, N, MLP_RATIO x C) activation on a GPU (or on the device `chunked_for` names)."""
    if (_CHUNKED_FOR.get() or q.device.type) == "cpu":
        return PROBS_BYTES
    batch, heads, tokens, dim = q.shape
    return max(PROBS_BYTES, batch * tokens * MLP_RATIO * heads * dim * q.element_size())


@contextlib.contextmanager
def chunked_for(device_type: str) -> Iterator[None]:
    """Chunk explicit attention for `device_type` whatever device the tensors are on (an export for a GPU)."""
    token = _CHUNKED_FOR.set(device_type)
    try:
        yield
    finally:
        _CHUNKED_FOR.reset(token)


def query_chunks(q: torch.Tensor, keys: int, budget: int | None = None) -> list[tuple[int, int]]:
    """Ranges of query rows whose probabilities take at most `budget` bytes each (default `probs_budget(q)`)."""
    batch, heads, queries, _ = q.shape
    per_row = max(1, batch * heads * keys * q.element_size())
    rows = max(1, (probs_budget(q) if budget is None else budget) // per_row)
    return [(start, min(start + rows, queries)) for start in range(0, queries, rows)]


def apply_probabilities(probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """probs @ v per head (B, H, N, d)."""
    batch, heads, tokens, dim = v.shape
    out = torch.bmm(probs.reshape(batch * heads, -1, tokens), v.reshape(batch * heads, tokens, dim))
    return out.view(batch, heads, -1, dim)


def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
          bias: torch.Tensor | None = None) -> torch.Tensor:
    """Attention output per head via `F.scaled_dot_product_attention`; `bias` is added to the logits."""
    if bias is not None and bias.dtype != q.dtype:
        bias = bias.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)

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
