"""Whether pomt can patch a model: a ViT-family transformer with patch tokens whose blocks pomt's pruning
blocks can run (`pomt.patching.blocks.check_block`). Told by the name before anything is built (timm's
entrypoint built on the meta device, which allocates nothing), else by the model once it is built."""

from __future__ import annotations

import functools

import timm
import torch
from torch import nn

from pomt.errors import PatchError, UnsupportedModelError
from pomt.models.geometry import transformer_blocks
from pomt.patching.blocks import check_block, is_patched

SUPPORTED = ("timm's VisionTransformer family (ViT, DeiT, DeiT III, DINOv2, CLIP and SigLIP ViTs, ...) and the "
             "DINOv2 authors' models")


def check_family(model: nn.Module, name: str | None = None) -> nn.Module:
    """Raise UnsupportedModelError unless pomt can patch `model` (named `name` in the message)."""
    problem = _family_problem(model)
    if problem is not None:
        kind = f"{type(model).__module__}.{type(model).__name__}"
        raise UnsupportedModelError(f"{name or type(model).__name__} is a {kind}, which pomt cannot prune "
                                    f"({problem}); pomt supports {SUPPORTED}")
    return model


def check_family_by_name(name: str) -> None:
    """Raise UnsupportedModelError when the timm model `name` (resolved, without its tag) is not one pomt can
    patch; silent where its meta-device build fails (`check_family` then tells once the model is built)."""
    model = _meta_model(name)
    if model is not None:
        check_family(model, name)


@functools.lru_cache(maxsize=64)
def _meta_model(name: str) -> nn.Module | None:
    """timm's model `name` at its defaults on the meta device (no memory, no weights), or None."""
    try:
        with torch.device("meta"):
            return timm.create_model(name, pretrained=False)
    except Exception:  # an entrypoint that cannot run on the meta device: the built model is checked instead
        return None


def _family_problem(model: nn.Module) -> str | None:
    """What keeps pomt from patching `model`, or None."""
    if getattr(model, "patch_embed", None) is None:
        return "no patch embedding: not a transformer over patch tokens"
    try:
        blocks = transformer_blocks(model)
        if not blocks:
            return "no transformer blocks"
        for block in blocks:
            if not is_patched(block):  # a block pomt patched already is one it can run
                check_block(block)
    except PatchError as exc:
        return str(exc).split(":")[0]
    return None
