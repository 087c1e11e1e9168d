"""How a pruning forward reaches the pieces of a block: its first norm, q/k/v per head, the attention's output
path, the two residual branches. One `Parts` per family of block classes (`pomt.models.family.block_kind`):
timm's Block, EvaBlock and BEiT's Block and the DINOv2 authors' blocks share names; open_clip's
ResidualAttentionBlock carries an `nn.MultiheadAttention`."""

from __future__ import annotations

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


PARTS: dict[str, Parts] = {"timm": Parts(), "open_clip": OpenClipParts()}


def parts_of(block: nn.Module) -> Parts:
    """The `Parts` of `block` (PatchError where pomt cannot patch it)."""
    return PARTS[block_kind(block)]
