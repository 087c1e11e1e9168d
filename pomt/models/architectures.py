"""ViT architectures pomt registers with timm: small models of a family timm has only at larger sizes, for the
digits case and the tests (random weights: no pretrained weights exist)."""

from __future__ import annotations

from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer


def _siglip_tiny(name: str, pool: str, pretrained: bool, kwargs: dict) -> VisionTransformer:
    if pretrained:
        raise RuntimeError(f"{name} has no pretrained weights")
    for timm_only in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # what timm's factory passes
        kwargs.pop(timm_only, None)
    options = {"patch_size": 16, "embed_dim": 192, "depth": 12, "num_heads": 3, "class_token": False,
               "global_pool": pool, **kwargs}
    model = VisionTransformer(**options)
    model.pretrained_cfg = {"architecture": name, "input_size": (3, 224, 224), "mean": (0.5, 0.5, 0.5),
                            "std": (0.5, 0.5, 0.5)}
    return model


@register_model
def pomt_siglip_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """SigLIP's image tower (no class token, an attention-pool MAP head) at ViT-Ti size: 192 wide, 12 blocks, 3
    heads, 16 px patches."""
    return _siglip_tiny("pomt_siglip_tiny_patch16_224", "map", pretrained, kwargs)


@register_model
def pomt_siglip_tiny_gap_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """The same tower averaging its tokens (SigLIP's `gap` variant)."""
    return _siglip_tiny("pomt_siglip_tiny_gap_patch16_224", "avg", pretrained, kwargs)
