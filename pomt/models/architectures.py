"""ViT architectures pomt registers with timm: a small model of a family timm has only at larger sizes, for the
digits case and the tests (random weights: no pretrained weights exist)."""

from __future__ import annotations

from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer


@register_model
def pomt_siglip_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """SigLIP's image tower (no class token, an attention-pool MAP head) at ViT-Ti size: 192 wide, 12 blocks, 3
    heads, 16 px patches."""
    if pretrained:
        raise RuntimeError("pomt_siglip_tiny_patch16_224 has no pretrained weights")
    for timm_only in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # what timm's factory passes
        kwargs.pop(timm_only, None)
    options = {"patch_size": 16, "embed_dim": 192, "depth": 12, "num_heads": 3, "class_token": False,
               "global_pool": "map", **kwargs}
    model = VisionTransformer(**options)
    model.pretrained_cfg = {"architecture": "pomt_siglip_tiny_patch16_224", "input_size": (3, 224, 224),
                            "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
    return model
