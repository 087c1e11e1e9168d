"""A tiny ViT and its input for the runtime tests: timm's test_vit cut to 2 blocks, 101 tokens at 160 px."""

from __future__ import annotations

import timm
import torch

COUNTS = (101, 51, 11)
SIZE = 160
DEPTH = 2  # a short model keeps torch.compile's share of the tests small


def tiny_vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("test_vit", depth=DEPTH).eval()


def example() -> torch.Tensor:
    return torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))


def first_output(out) -> torch.Tensor:
    """The first output of any backend's forward as a torch tensor."""
    if isinstance(out, torch.Tensor):
        return out
    first = out[0] if isinstance(out, list | tuple) else out.to_tuple()[0]
    return torch.as_tensor(first)
