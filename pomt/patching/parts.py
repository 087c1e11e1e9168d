"""How a pruning forward reaches the pieces of a block: its first norm, q/k/v per head, the attention's output
path, the two residual branches. One `Parts` per family of block classes (`pomt.models.family.block_kind`):
timm's Block, EvaBlock and BEiT's Block and the DINOv2 authors' blocks share names; open_clip's
ResidualAttentionBlock carries an `nn.MultiheadAttention`; transformers' layers name theirs in three ways."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import apply_rot_embed_cat
from torch import nn

from pomt.models.family import block_kind
from pomt.patching.attention import call_layer

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def rotate(q: torch.Tensor, k: torch.Tensor, rope: torch.Tensor, prefix: int, half: bool) -> tuple[torch.Tensor, ...]:
    """q and k with the rotary embedding `rope` applied to their patch tokens (prefix tokens are not rotated)."""
    q = torch.cat([q[:, :, :prefix], apply_rot_embed_cat(q[:, :, prefix:], rope, half=half)], dim=2)
    k = torch.cat([k[:, :, :prefix], apply_rot_embed_cat(k[:, :, prefix:], rope, half=half)], dim=2)
    return q, k


class Parts:
    """timm's names: norm1, attn (qkv or q/k/v projections, q/k norms, scale norm, gate, proj), ls1/gamma_1,
    drop_path1, norm2, mlp, ls2/gamma_2, drop_path2."""

    def norm1(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return block.norm1(x)

    def scale(self, block: nn.Module) -> float:
        return block.attn.scale

    def dropout(self, block: nn.Module) -> nn.Module:
        return block.attn.attn_drop

    def heads(self, block: nn.Module, y: torch.Tensor, rope: torch.Tensor | None = None) -> QKV:
        """q, k, v per head (B, H, N, d) of normed tokens `y`, q unscaled: after q/k norms, the rotary embedding
        (Eva), and k/v repeated to the query heads where the layer has fewer."""
        attn, (batch, tokens, _) = block.attn, y.shape
        if getattr(attn, "qkv", None) is not None:
            q_bias = getattr(attn, "q_bias", None)  # BEiT and EVA: q and v biases beside a bias-free projection
            qkv = attn.qkv(y) if q_bias is None else F.linear(
                y, attn.qkv.weight, torch.cat((q_bias, attn.k_bias, attn.v_bias)))
            q, k, v = qkv.reshape(batch, tokens, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            kv_heads = getattr(attn, "num_kv_heads", attn.num_heads)
            q = attn.q_proj(y).reshape(batch, tokens, attn.num_heads, -1).transpose(1, 2)
            k = attn.k_proj(y).reshape(batch, tokens, kv_heads, -1).transpose(1, 2)
            v = attn.v_proj(y).reshape(batch, tokens, kv_heads, -1).transpose(1, 2)
        q_norm = getattr(attn, "q_norm", None)
        if q_norm is not None:
            q, k = call_layer(q_norm, q), call_layer(attn.k_norm, k)
        if rope is not None:
            q, k = rotate(q, k, rope, attn.num_prefix_tokens, getattr(attn, "rotate_half", False))
            q, k = q.type_as(v), k.type_as(v)
        groups = getattr(attn, "num_kv_groups", 1)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return q, k, v

    def project(self, block: nn.Module, heads_out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Merge heads and apply the layer's output path (scale norm, gate, projection); `y` is its input."""
        attn, (batch, _, tokens, _) = block.attn, heads_out.shape
        out = heads_out.transpose(1, 2).reshape(batch, tokens, -1)
        norm = getattr(attn, "norm", None)
        if norm is not None:
            out = call_layer(norm, out)
        gate = getattr(attn, "gate", None)
        if gate is not None:
            out = out * gate(y).sigmoid()
        return call_layer(attn.proj_drop, attn.proj(out))

    def attention(self, block: nn.Module, y: torch.Tensor) -> torch.Tensor:
        """The layer's own forward on normed tokens `y`."""
        return block.attn(y)

    def _scaled(self, block: nn.Module, which: int, out: torch.Tensor) -> torch.Tensor:
        layer = getattr(block, f"ls{which}", None)
        if layer is not None:
            out = call_layer(layer, out)
        gamma = getattr(block, f"gamma_{which}", None)
        return out if gamma is None else gamma * out

    def attn_residual(self, block: nn.Module, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return x + call_layer(block.drop_path1, self._scaled(block, 1, out))

    def mlp_residual(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x + call_layer(block.drop_path2, self._scaled(block, 2, block.mlp(block.norm2(x))))


class OpenClipParts(Parts):
    """open_clip's ResidualAttentionBlock: ln_1, attn (`nn.MultiheadAttention`, batch first), ls_1, ln_2, mlp,
    ls_2."""

    def norm1(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return block.ln_1(x)

    def scale(self, block: nn.Module) -> float:
        return block.attn.head_dim ** -0.5

    def dropout(self, block: nn.Module) -> nn.Module:
        return nn.Dropout(block.attn.dropout) if block.training and block.attn.dropout else nn.Identity()

    def heads(self, block: nn.Module, y: torch.Tensor, rope: torch.Tensor | None = None) -> QKV:
        attn, (batch, tokens, _) = block.attn, y.shape
        qkv = F.linear(y, attn.in_proj_weight, attn.in_proj_bias)
        q, k, v = qkv.reshape(batch, tokens, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def project(self, block: nn.Module, heads_out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        batch, _, tokens, _ = heads_out.shape
        return block.attn.out_proj(heads_out.transpose(1, 2).reshape(batch, tokens, -1))

    def attention(self, block: nn.Module, y: torch.Tensor) -> torch.Tensor:
        return block.attention(q_x=y)

    def attn_residual(self, block: nn.Module, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return x + call_layer(block.ls_1, out)

    def mlp_residual(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x + call_layer(block.ls_2, block.mlp(block.ln_2(x)))


@dataclass(frozen=True)
class Names:
    """Where a transformers layer keeps its pieces (attributes of the layer, then of its attention)."""

    norm1: str
    attention: str
    output: str  # the attention's output projection
    norm2: str
    heads: str  # the attention's count of heads
    scale: str
    dropout: str  # the attention's dropout probability
    residual: str | None = None  # a module after each branch: dropout (ViT) or drop path (DINOv2)
    ls1: str | None = None
    ls2: str | None = None


class HFParts(Parts):
    """A transformers 5 vision layer: separate q/k/v projections, pre-norm residual branches, names of `Names`."""

    def __init__(self, names: Names) -> None:
        self.names = names

    def _attn(self, block: nn.Module) -> nn.Module:
        return getattr(block, self.names.attention)

    def norm1(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return getattr(block, self.names.norm1)(x)

    def scale(self, block: nn.Module) -> float:
        return getattr(self._attn(block), self.names.scale)

    def dropout(self, block: nn.Module) -> nn.Module:
        p = getattr(self._attn(block), self.names.dropout)
        return nn.Dropout(p) if block.training and p else nn.Identity()

    def heads(self, block: nn.Module, y: torch.Tensor, rope: torch.Tensor | None = None) -> QKV:
        attn, (batch, tokens, _) = self._attn(block), y.shape
        count = getattr(attn, self.names.heads)
        return tuple(getattr(attn, proj)(y).reshape(batch, tokens, count, -1).transpose(1, 2)
                     for proj in ("q_proj", "k_proj", "v_proj"))

    def project(self, block: nn.Module, heads_out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        batch, _, tokens, _ = heads_out.shape
        return getattr(self._attn(block), self.names.output)(heads_out.transpose(1, 2).reshape(batch, tokens, -1))

    def attention(self, block: nn.Module, y: torch.Tensor) -> torch.Tensor:
        return self._attn(block)(y)[0]

    def _branch(self, block: nn.Module, scale: str | None, out: torch.Tensor) -> torch.Tensor:
        if scale is not None:
            out = getattr(block, scale)(out)
        return out if self.names.residual is None else call_layer(getattr(block, self.names.residual), out)

    def attn_residual(self, block: nn.Module, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return x + self._branch(block, self.names.ls1, out)

    def mlp_residual(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x + self._branch(block, self.names.ls2, block.mlp(getattr(block, self.names.norm2)(x)))


PARTS: dict[str, Parts] = {
    "timm": Parts(),
    "open_clip": OpenClipParts(),
    "hf-vit": HFParts(Names("layernorm_before", "attention", "o_proj", "layernorm_after", "num_attention_heads",
                            "scaling", "attention_dropout", residual="dropout")),
    "hf-clip": HFParts(Names("layer_norm1", "self_attn", "out_proj", "layer_norm2", "num_heads", "scale",
                             "dropout")),
    "hf-dinov2": HFParts(Names("norm1", "attention", "o_proj", "norm2", "num_attention_heads", "scaling",
                               "attention_dropout", residual="drop_path", ls1="layer_scale1", ls2="layer_scale2")),
}


def parts_of(block: nn.Module) -> Parts:
    """The `Parts` of `block` (PatchError where pomt cannot patch it)."""
    return PARTS[block_kind(block)]
