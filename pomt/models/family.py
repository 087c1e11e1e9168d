"""Whether pomt can patch a model: a ViT-family transformer whose blocks and attention layers are of the classes
pomt's pruning forwards run; told by the name before anything is built (on the meta device), else by the model."""

from __future__ import annotations

import functools

import timm
import torch
from torch import nn

from pomt.errors import PatchError, UnsupportedModelError
from pomt.models.geometry import model_geometry, transformer_blocks

PATCHED_FROM = "_pomt_original"  # the class attribute naming the class a pomt pruning block class derives from
SUPPORTED = ("timm's VisionTransformer family (ViT, DeiT, DeiT III, DINOv2, CLIP and SigLIP ViTs, ...), timm's Eva "
             "(EVA02, DINOv3, RoPE ViTs) and BEiT, the DINOv2 authors' models, open_clip's image towers and "
             "Hugging Face ViT, CLIP, SigLIP and DINOv2 vision models")


def check_family(model: nn.Module, name: str | None = None) -> nn.Module:
    """Raise UnsupportedModelError unless pomt can patch `model` (named `name` in the message)."""
    problem = _family_problem(model)
    if problem is not None:
        kind = f"{type(model).__module__}.{type(model).__name__}"
        raise UnsupportedModelError(f"{name or type(model).__name__} is a {kind}, which pomt cannot prune "
                                    f"({problem}); pomt supports {SUPPORTED}")
    return model


def check_family_by_name(name: str) -> None:
    """Raise UnsupportedModelError when the timm model `name` is not one pomt can patch (silent if not buildable)."""
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
    try:
        model_geometry(model)
        blocks = transformer_blocks(model)
        if not blocks:
            return "no transformer blocks"
        for block in blocks:
            block_kind(block)
    except PatchError as exc:
        return str(exc).split(":")[0]
    return None


def _block_classes(block: nn.Module) -> tuple[type, ...]:
    """Supported block classes of the block's own package (imports DINOv2 only for DINOv2 blocks)."""
    if type(block).__module__.startswith("dinov2."):
        from dinov2.layers.block import Block as DinoBlock
        from dinov2.layers.block import NestedTensorBlock

        return (DinoBlock, NestedTensorBlock)
    from timm.models.beit import Block as BeitBlock
    from timm.models.eva import EvaBlock
    from timm.models.vision_transformer import Block as TimmBlock

    return (TimmBlock, EvaBlock, BeitBlock)


def _attention_classes(attn: nn.Module) -> tuple[type, ...]:
    """Supported attention classes of the layer's own package (imports DINOv2 only for DINOv2 layers)."""
    if type(attn).__module__.startswith("dinov2."):
        from dinov2.layers.attention import Attention as DinoAttention
        from dinov2.layers.attention import MemEffAttention

        return (DinoAttention, MemEffAttention)
    from timm.layers import Attention as TimmAttention
    from timm.layers.attention import AttentionRope
    from timm.models.beit import Attention as BeitAttention
    from timm.models.eva import EvaAttention

    return (TimmAttention, EvaAttention, AttentionRope, BeitAttention)


def _open_clip_problem(block: nn.Module) -> str | None:
    """What keeps pomt from patching an open_clip block, or None: a ResidualAttentionBlock whose attention is a
    batch-first `nn.MultiheadAttention` over its own tokens."""
    if type(block).__name__ != "ResidualAttentionBlock":
        return f"cannot patch block {type(block).__module__}.{type(block).__name__}: pomt supports open_clip's " \
               "ResidualAttentionBlock"
    attn = block.attn
    if type(attn) is not nn.MultiheadAttention or not attn.batch_first or not attn._qkv_same_embed_dim \
            or hasattr(block, "ln_1_kv"):
        return "cannot patch attention of open_clip's ResidualAttentionBlock: pomt supports a batch-first " \
               "nn.MultiheadAttention over the block's own tokens"
    return None


HF_LAYERS = {"ViTLayer": "hf-vit", "CLIPEncoderLayer": "hf-clip", "SiglipEncoderLayer": "hf-clip",
             "Dinov2Layer": "hf-dinov2", "Dinov2WithRegistersLayer": "hf-dinov2"}  # class -> its parts


def _hf_kind(block: nn.Module, original: type) -> str:
    """The parts of a transformers layer: its attention must have separate q/k/v projections (transformers 5)."""
    kind = HF_LAYERS.get(original.__name__)
    if kind is None:
        raise PatchError(f"cannot patch layer {original.__module__}.{original.__name__}: pomt supports transformers' "
                         f"{', '.join(HF_LAYERS)}")
    attn = getattr(block, "attention", None) or getattr(block, "self_attn", None)
    if getattr(attn, "q_proj", None) is None:
        raise PatchError(f"cannot patch {original.__name__}: its attention has no q_proj/k_proj/v_proj, the layout "
                         "of transformers 5 and later (pip install -U transformers)")
    return kind


def block_kind(block: nn.Module) -> str:
    """The family of `block`'s parts pomt's pruning forwards run ("timm" for timm's Block, EvaBlock and BEiT's Block
    and the DINOv2 authors' blocks; "open_clip"; "hf-vit", "hf-clip", "hf-dinov2"); PatchError where pomt cannot
    patch it."""
    original = vars(type(block)).get(PATCHED_FROM, type(block))
    if original.__module__.startswith("transformers."):
        return _hf_kind(block, original)
    if original.__module__.startswith("open_clip."):
        problem = _open_clip_problem(block)
        if problem is not None:
            raise PatchError(problem)
        return "open_clip"
    check_block(block)
    return "timm"


def check_block(block: nn.Module) -> None:
    """Raise PatchError unless `block` and its attention are of the classes pomt's pruning forwards run."""
    original = vars(type(block)).get(PATCHED_FROM, type(block))
    if original not in _block_classes(block):
        raise PatchError(
            f"cannot patch block {original.__module__}.{original.__name__}: pomt supports timm "
            "vision_transformer.Block, EvaBlock and BEiT's Block, and the DINOv2 authors' Block/NestedTensorBlock"
        )
    attn = block.attn
    if type(attn) not in _attention_classes(attn):
        raise PatchError(
            f"cannot patch attention {type(attn).__module__}.{type(attn).__name__}: pomt supports timm "
            "Attention, EvaAttention, AttentionRope and BEiT's Attention, and the DINOv2 authors' "
            "Attention/MemEffAttention"
        )
