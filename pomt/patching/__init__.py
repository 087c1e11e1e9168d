"""Pruning patches for timm ViT/DeiT/DINOv2 and the DINOv2 authors' ViT: pomt, top-k, ToMe, l2norm, random."""

from pomt.patching.api import apply_schedule, patch, patch_state, patched_block, unpatch
from pomt.patching.plan import METHODS, token_counts

__all__ = ["METHODS", "apply_schedule", "patch", "patch_state", "patched_block", "token_counts", "unpatch"]
