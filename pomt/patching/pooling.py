"""ToMe's size-weighted pooling: after a merge a token stands for several, so a head that averages tokens weighs each
by its size, and an attention-pool head (SigLIP's MAP) adds log(size) to its logits, as the blocks do. The model's
class (a transformers SigLIP's head's) is swapped to a subclass for as long as it is patched (timm VisionTransformer,
Eva and BEiT, open_clip, transformers SigLIP)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pomt.patching.blocks import STATE_ATTR

AVERAGING = ("avg", "avgmax")  # timm's global_pool values that average tokens, which ToMe weights by size
_POOLED_CLASSES: dict[type, type] = {}


OWNER = "_pomt_sized_by"  # on a pooling head swapped apart from its model: the patched model, whose state it reads


def _sizes(module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The sizes of the last ToMe forward's tokens (B, T, 1), when they describe `x`."""
    size = module.__dict__.get(OWNER, module).__dict__[STATE_ATTR].size
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


def _hf_attention_pool(self, hidden_state: torch.Tensor) -> torch.Tensor:
    """transformers SigLIP's attention-pool head with log(size) added to its probe's logits."""
    size = _sizes(self, hidden_state)
    if size is None:
        return super(type(self), self).forward(hidden_state)
    batch, heads = hidden_state.shape[0], self.attention.num_heads
    bias = size.log().to(hidden_state.dtype).transpose(1, 2).repeat_interleave(heads, dim=0)  # (B * heads, 1, T)
    pooled = self.attention(self.probe.repeat(batch, 1, 1), hidden_state, hidden_state, attn_mask=bias)[0]
    pooled = pooled + self.mlp(self.layernorm(pooled))
    return pooled[:, 0]


def _pooling_target(model: nn.Module) -> tuple[nn.Module, dict[str, Callable]] | None:
    """The module whose class pools `model`'s tokens by size, and its methods that do it."""
    from pomt.models import hf

    if hf.is_hf(model):
        head = getattr(hf.tower(model), "head", None)
        return (head, {"forward": _hf_attention_pool}) if type(head).__name__.endswith("AttentionPoolingHead") \
            else None
    methods = size_pooling(model)
    return None if methods is None else (model, methods)


def size_pooling(model: nn.Module) -> dict[str, Callable] | None:
    """The methods that pool a timm or open_clip `model`'s tokens by size, or None where its head does not combine
    tokens."""
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


def install_pooling(model: nn.Module) -> tuple[nn.Module, type] | None:
    """Swap the module that pools `model`'s tokens (the model, or a transformers model's head) to its size-weighted
    subclass; returns it with its original class, or None if nothing changed."""
    target = _pooling_target(model)
    if target is None:
        return None
    module, methods = target
    original = type(module)
    if original not in _POOLED_CLASSES:
        _POOLED_CLASSES[original] = type(f"SizePooled{original.__name__}", (original,), methods)
    module.__class__ = _POOLED_CLASSES[original]
    if module is not model:
        module.__dict__[OWNER] = model
    return module, original


def uninstall_pooling(module: nn.Module, original: type) -> None:
    """Give the pooling module back its original class."""
    module.__class__ = original
    module.__dict__.pop(OWNER, None)
