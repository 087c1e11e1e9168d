"""Token geometry read from the model itself: tokens, prefix tokens, patch grid, depth, width, heads."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch import nn

from pomt.errors import GridError, PatchError
from pomt.models import hf


@dataclass(frozen=True)
class Geometry:
    """What a ViT's token layout looks like at one input size."""

    model: str
    input_size: tuple[int, int]
    patch_size: tuple[int, int]
    grid: tuple[int, int]
    prefix_tokens: int
    num_tokens: int
    depth: int
    embed_dim: int
    num_heads: int

    @property
    def patch_tokens(self) -> int:
        return self.num_tokens - self.prefix_tokens

    @property
    def min_tokens(self) -> int:
        """Fewest tokens a forward may keep: the prefix plus one patch token."""
        return self.prefix_tokens + 1

    def to_dict(self) -> dict:
        data = asdict(self)
        data["patch_tokens"] = self.patch_tokens
        return data

    def check_tokens(self, n: int) -> int:
        """Raise GridError unless P + 1 <= n <= N."""
        if not self.min_tokens <= n <= self.num_tokens:
            raise GridError(f"token count {n} is outside the model's range [{self.min_tokens}, {self.num_tokens}]")
        return n


def _pair(value) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def block_container(model: nn.Module) -> tuple[nn.Module, str]:
    """The module holding the blocks and the attribute they are under: `blocks` (timm, DINOv2),
    `transformer.resblocks` (open_clip), the layers of a transformers model."""
    if hf.is_hf(model):
        return hf.layer_container(model)
    if getattr(model, "blocks", None) is not None:
        return model, "blocks"
    transformer = getattr(model, "transformer", None)
    if getattr(transformer, "resblocks", None) is not None:
        return transformer, "resblocks"
    raise PatchError(f"{type(model).__name__} has no `blocks`: not a ViT that pomt supports")


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks in execution order, flattening DINOv2's block chunks."""
    owner, name = block_container(model)
    blocks = getattr(owner, name)
    flat: list[nn.Module] = []
    for block in blocks:
        if isinstance(block, nn.ModuleList):  # dinov2 BlockChunk: leading Identity placeholders
            flat.extend(b for b in block if not isinstance(b, nn.Identity))
        else:
            flat.append(block)
    return flat


def prefix_token_count(model: nn.Module) -> int:
    """Class + distillation + register tokens, as the model reports them."""
    if hf.is_hf(model):
        return hf.prefix_tokens(model)
    if hasattr(model, "num_prefix_tokens"):
        return int(model.num_prefix_tokens)
    registers = int(getattr(model, "num_register_tokens", 0) or 0)
    cls = getattr(model, "cls_token", None) if hasattr(model, "cls_token") else getattr(model, "class_embedding", None)
    return (1 if cls is not None else 0) + registers


def model_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return str(cfg.get("architecture") or type(model).__name__)


def _layout(model: nn.Module) -> tuple[tuple[int, int], tuple[int, int], int, int]:
    """Input size, patch size, width and heads of a timm or DINOv2 ViT (a patch embedding), an open_clip one
    (`conv1`) or a transformers one."""
    if hf.is_hf(model):
        return hf.layout(model)
    embed = getattr(model, "patch_embed", None)
    if embed is not None:
        size, patch, width = embed.img_size, getattr(embed, "patch_size", None) or model.patch_size, model.embed_dim
    elif getattr(model, "conv1", None) is not None and hasattr(model, "grid_size"):
        size, patch, width = model.image_size, model.patch_size, model.transformer.width
    else:
        raise PatchError(f"{type(model).__name__} has no patch embedding: not a ViT that pomt supports")
    block = transformer_blocks(model)[0]
    heads = getattr(getattr(block, "attn", None), "num_heads", None)
    if heads is None:
        raise PatchError(f"cannot patch block {type(block).__module__}.{type(block).__name__}: it has no attention "
                         "layer `attn` with `num_heads`")
    return _pair(size), _pair(patch), int(width), int(heads)


def model_geometry(model: nn.Module) -> Geometry:
    """Geometry of a timm ViT/DeiT/DINOv2/Eva/BEiT, the DINOv2 authors' DinoVisionTransformer, an open_clip
    VisionTransformer or a transformers vision model."""
    input_size, patch, width, heads = _layout(model)
    grid = (input_size[0] // patch[0], input_size[1] // patch[1])
    prefix = prefix_token_count(model)
    return Geometry(
        model=model_name(model), input_size=input_size, patch_size=patch, grid=grid, prefix_tokens=prefix,
        num_tokens=prefix + grid[0] * grid[1], depth=len(transformer_blocks(model)), embed_dim=width,
        num_heads=heads,
    )
