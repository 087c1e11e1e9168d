"""Size-weighted token pooling for ToMe on timm ViTs that average their tokens (global_pool "avg"/"avgmax").

A merged token stands for `size` original tokens, so ToMe's paper pools by token size: the mean over
tokens becomes sum(size · x) / sum(size) (the authors' MAE patch does the same). timm 1.0's
`VisionTransformer.forward_head` pools through `self.pool`; the model's class is swapped to a subclass
whose `pool` weights that mean and defers everything else (class token, max, attention pooling) to timm.
Only models whose pooling averages are swapped, and `uninstall` gives the original class back.
"""

from __future__ import annotations

import torch
from torch import nn

from pomt.patching.blocks import STATE_ATTR

AVERAGING = ("avg", "avgmax")

_POOLED_CLASSES: dict[type, type] = {}


def _size_weighted_pool(self, x: torch.Tensor, pool_type: str | None = None) -> torch.Tensor:
    """timm's `pool` with the token mean weighted by the sizes of the last ToMe forward."""
    pool_type = self.global_pool if pool_type is None else pool_type
    size = self.__dict__[STATE_ATTR].size
    if size is None or pool_type not in AVERAGING or self.attn_pool is not None or size.shape[1] != x.shape[1]:
        return super(type(self), self).pool(x, pool_type)
    start = 0 if self.pool_include_prefix else self.num_prefix_tokens
    x, size = x[:, start:], size[:, start:].to(x.dtype)
    mean = (x * size).sum(dim=1) / size.sum(dim=1)
    return mean if pool_type == "avg" else 0.5 * (x.amax(dim=1) + mean)


def averages_tokens(model: nn.Module) -> bool:
    """Whether `model` is a timm VisionTransformer whose head averages its tokens."""
    from timm.models.vision_transformer import VisionTransformer

    return (
        isinstance(model, VisionTransformer)
        and getattr(model, "global_pool", None) in AVERAGING
        and getattr(model, "attn_pool", None) is None
    )


def install(model: nn.Module) -> type | None:
    """Swap `model` to its size-weighted pooling subclass when its head averages tokens; returns the
    original class, or None when nothing was changed."""
    if not averages_tokens(model):
        return None
    original = type(model)
    if original not in _POOLED_CLASSES:
        name = f"SizePooled{original.__name__}"
        _POOLED_CLASSES[original] = type(name, (original,), {"pool": _size_weighted_pool})
    model.__class__ = _POOLED_CLASSES[original]
    return original


def uninstall(model: nn.Module, original: type) -> None:
    """Give `model` back its original class."""
    model.__class__ = original
