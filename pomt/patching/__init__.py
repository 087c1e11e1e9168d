"""Pruning patches for timm ViT/DeiT/DINOv2 and the DINOv2 authors' ViT: pomt, top-k, ToMe, l2norm, random."""

from pomt.checks import METHODS
from pomt.patching.api import patch, patch_state, patched, unpatch
from pomt.patching.blocks import token_counts

__all__ = ["METHODS", "patch", "patch_state", "patched", "token_counts", "unpatch"]
