"""Positions that follow the tokens. A rotary embedding (timm Eva: EVA02, DINOv3, RoPE ViTs) and a relative position
bias (timm BEiT) belong to a token's place in the patch grid, so when tokens go, they are gathered with the tokens.

`index` (B or 1, T): the original place, among the model's N tokens (prefix tokens first), of each current token.
A merged token keeps its destination's place (ToMe); pomt's fused token takes the place of the best-scored token
it fuses."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Kind = Literal["rope", "relative"]


def position_kind(model: nn.Module) -> Kind | None:
    """"rope" for a model whose blocks take a rotary embedding, "relative" for one with relative position biases."""
    if getattr(model, "rope", None) is not None:
        return "rope"
    if getattr(model, "rel_pos_bias", None) is not None:
        return "relative"
    blocks = getattr(model, "blocks", None) or []
    first = next(iter(blocks), None)
    if getattr(getattr(first, "attn", None), "relative_position_bias_table", None) is not None:
        return "relative"
    return None


def identity_index(batch: int, tokens: int, device: torch.device) -> torch.Tensor:
    """Every token at its own place (B, T)."""
    return torch.arange(tokens, device=device).expand(batch, tokens)


def select(index: torch.Tensor | None, prefix: int, patches: torch.Tensor, tokens: int) -> torch.Tensor:
    """The index after keeping the patch tokens at `patches` ((K,) shared or (B, K)) out of `tokens` tokens."""
    if index is None:
        index = identity_index(1 if patches.ndim == 1 else patches.shape[0], tokens, patches.device)
    patch_part = index[:, prefix:]
    if patches.ndim == 1:
        kept = patch_part.index_select(1, patches)
    else:
        kept = patch_part.expand(patches.shape[0], -1).gather(1, patches)
    return torch.cat([index[:, :prefix].expand(kept.shape[0], -1), kept], dim=1)


def gather_rope(rope: torch.Tensor, index: torch.Tensor, prefix: int) -> torch.Tensor:
    """The rotary embedding of the current patch tokens: rope (N - P, D) or per head (H, N - P, D) -> (B, 1 or H,
    T - P, D), broadcasting over the (B, H, T - P, d) queries and keys. A rope already gathered for the tokens a
    block received ((B or 1, 1 or H, K, D)) is gathered again, `index` then counting within those tokens."""
    patches = index[:, prefix:] - prefix
    if rope.ndim == 4:
        batch = max(rope.shape[0], patches.shape[0])
        picked = patches.expand(batch, -1)[:, None, :, None].expand(-1, rope.shape[1], -1, rope.shape[-1])
        return rope.expand(batch, -1, -1, -1).gather(2, picked)
    if rope.ndim == 2:
        return rope[patches].unsqueeze(1)
    return rope[:, patches].transpose(0, 1)


def gather_bias(bias: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The attention bias between current tokens: bias (H, N, N) or (1 or B, H, N, N) -> (B, H, T, T)."""
    if bias.ndim == 3:
        bias = bias.unsqueeze(0)
    batch = index.shape[0]
    rows = index.unsqueeze(-1).expand(-1, -1, index.shape[1])
    cols = index.unsqueeze(1).expand(-1, index.shape[1], -1)
    if bias.shape[0] == 1:
        return bias[0][:, rows, cols].transpose(0, 1)
    samples = torch.arange(batch, device=index.device).view(batch, 1, 1)
    return bias.permute(0, 2, 3, 1)[samples, rows, cols].permute(0, 3, 1, 2)


def relative_bias(attn: nn.Module, shared: torch.Tensor | None) -> torch.Tensor | None:
    """A BEiT attention layer's own relative position bias plus the model's shared one (1, H, N, N), or None."""
    own = attn._get_rel_pos_bias() if getattr(attn, "relative_position_bias_table", None) is not None else None
    if own is None:
        return shared
    return own if shared is None else own + shared
