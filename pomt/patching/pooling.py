"""ToMe's size-weighted pooling: after a merge a token stands for several, so a head that averages tokens weighs each
by its size, and an attention-pool head (SigLIP's MAP) adds log(size) to its logits, as the blocks do. The model's
class is swapped to a subclass for as long as it is patched (timm VisionTransformer, Eva and BEiT, open_clip)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pomt.patching.blocks import STATE_ATTR

AVERAGING = ("avg", "avgmax")  # timm's global_pool values that average tokens, which ToMe weights by size
_POOLED_CLASSES: dict[type, type] = {}


def _sizes(model: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The sizes of the last ToMe forward's tokens (B, T, 1), when they describe `x`."""
    size = model.__dict__[STATE_ATTR].size
    return size if size is not None and size.shape[1] == x.shape[1] else None


def _weighted_mean(x: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    size = size.to(x.dtype)
    return (x * size).sum(dim=1) / size.sum(dim=1)


def _vit_pool(self, x: torch.Tensor, pool_type: str | None = None) -> torch.Tensor:
    """timm VisionTransformer's `pool`, by token size: the mean weighted, the attention pool's logits biased."""
    pool_type = self.global_pool if pool_type is None else pool_type
    size = _sizes(self, x)
    if size is None or (self.attn_pool is None and pool_type not in AVERAGING):
        return super(type(self), self).pool(x, pool_type)
    start = 0 if self.pool_include_prefix else self.num_prefix_tokens
    x, size = x[:, start:], size[:, start:]
    if self.attn_pool is not None:
        return self.attn_pool(x, attn_mask=size.log().to(x.dtype).transpose(1, 2).unsqueeze(1))
    mean = _weighted_mean(x, size)
    return mean if pool_type == "avg" else 0.5 * (x.amax(dim=1) + mean)


def _eva_pool(self, x: torch.Tensor, pool_type: str | None = None) -> torch.Tensor:
    """timm Eva's `pool` with the mean over patch tokens weighted by token size."""
    pool_type = self.global_pool if pool_type is None else pool_type
    size = _sizes(self, x)
    if size is None or self.attn_pool is not None or pool_type != "avg":
        return super(type(self), self).pool(x, pool_type)
    return _weighted_mean(x[:, self.num_prefix_tokens:], size[:, self.num_prefix_tokens:])


def _beit_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
    """timm BEiT's `forward_head` with the mean over patch tokens weighted by token size."""
    size = _sizes(self, x)
    if size is None or self.global_pool != "avg":
        return super(type(self), self).forward_head(x, pre_logits)
    x = self.head_drop(self.fc_norm(_weighted_mean(x[:, self.num_prefix_tokens:], size[:, self.num_prefix_tokens:])))
    return x if pre_logits else self.head(x)


def _open_clip_pool(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """open_clip's `_global_pool` with the mean over patch tokens weighted by token size."""
    size = _sizes(self, x)
    if size is None or self.pool_type != "avg":
        return super(type(self), self)._global_pool(x)
    return _weighted_mean(x[:, 1:], size[:, 1:]), x[:, 1:]


def size_pooling(model: nn.Module) -> dict[str, Callable] | None:
    """The methods that pool `model`'s tokens by size, or None where its head does not combine tokens."""
    from timm.models.beit import Beit
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer

    if isinstance(model, VisionTransformer) and (model.attn_pool is not None or model.global_pool in AVERAGING):
        return {"pool": _vit_pool}
    if isinstance(model, Eva) and model.attn_pool is None and model.global_pool == "avg":
        return {"pool": _eva_pool}
    if isinstance(model, Beit) and model.global_pool == "avg":
        return {"forward_head": _beit_head}
    if type(model).__module__.startswith("open_clip.") and getattr(model, "pool_type", None) == "avg":
        return {"_global_pool": _open_clip_pool}
    return None


def install_pooling(model: nn.Module) -> type | None:
    """Swap `model` to its size-weighted pooling subclass; returns the original class, or None if unchanged."""
    methods = size_pooling(model)
    if methods is None:
        return None
    original = type(model)
    if original not in _POOLED_CLASSES:
        _POOLED_CLASSES[original] = type(f"SizePooled{original.__name__}", (original,), methods)
    model.__class__ = _POOLED_CLASSES[original]
    return original


def uninstall_pooling(model: nn.Module, original: type) -> None:
    """Give `model` back its original class."""
    model.__class__ = original
