"""Self-attention on per-head tensors (B, H, N, d), so a pruning block can see what a fused path hides: explicit
probabilities in chunks of query rows that fit a memory budget, and the fused path with an additive bias."""

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
