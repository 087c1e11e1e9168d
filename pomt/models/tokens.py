"""Run a model with only n tokens kept right after patch + position embedding (by a forward pre-hook, through the
model's own `model(x)`; prefix tokens always kept), or with only its last few blocks, where what a reducer costs at a
block would drown in the other blocks' jitter."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from torch import nn

from pomt.models.geometry import model_geometry, transformer_blocks

Selection = Literal["first", "random"]


def random_patch_indices(batch: int, patch_tokens: int, keep: int, generator: torch.Generator,
                         device: torch.device | str = "cpu") -> torch.Tensor:
    """Per-sample uniform random subset of `keep` patch indices, in ascending order (B, keep)."""
    noise = torch.rand(batch, patch_tokens, generator=generator)
    return noise.argsort(dim=1)[:, :keep].sort(dim=1).values.to(device)


def gather_tokens(x: torch.Tensor, prefix: int, patch_indices: torch.Tensor) -> torch.Tensor:
    """Prefix tokens followed by the patch tokens at `patch_indices` ((K,) shared or (B, K) per sample)."""
    patches = x[:, prefix:]
    if patch_indices.ndim == 1:
        kept = patches.index_select(1, patch_indices.to(x.device))
    else:
        index = patch_indices.to(x.device).unsqueeze(-1).expand(-1, -1, x.shape[-1])
        kept = patches.gather(1, index)
    return torch.cat([x[:, :prefix], kept], dim=1)


@contextlib.contextmanager
def truncate_tokens(model: nn.Module, n: int, selection: Selection = "first", seed: int = 0,
                    indices: torch.Tensor | None = None, at_block: int = 0) -> Iterator[nn.Module]:
    """Inside the context `model(x)` carries only n tokens from block `at_block` on.

    selection: "first" keeps the first n tokens; "random" a seeded per-sample subset that changes from call to call
    (reproducibly); `indices` (patch positions, (K,) or (B, K)) overrides both. At n = N the model is left untouched."""
    geometry = model_geometry(model)
    geometry.check_tokens(n)
    prefix, keep = geometry.prefix_tokens, n - geometry.prefix_tokens
    if indices is not None and indices.shape[-1] != keep:
        raise ValueError(f"indices hold {indices.shape[-1]} patch tokens, n = {n} needs {keep}")
    if n == geometry.num_tokens and indices is None:
        yield model
        return
    generator = torch.Generator().manual_seed(seed)

    def drop(_module: nn.Module, args: tuple) -> tuple:
        x, *rest = args
        if indices is not None:
            x = gather_tokens(x, prefix, indices)
        elif selection == "first":
            x = x[:, :n]
        else:
            picked = random_patch_indices(x.shape[0], x.shape[1] - prefix, keep, generator, x.device)
            x = gather_tokens(x, prefix, picked)
        return (x, *rest)

    handle = transformer_blocks(model)[at_block].register_forward_pre_hook(drop, prepend=True)
    try:
        yield model
    finally:
        handle.remove()


def forward_at_tokens(model: nn.Module, x: torch.Tensor, n: int, selection: Selection = "first", seed: int = 0,
                      indices: torch.Tensor | None = None) -> torch.Tensor:
    """The model's output on `x` when only n tokens go through its blocks."""
    with truncate_tokens(model, n, selection=selection, seed=seed, indices=indices):
        return model(x)


@contextlib.contextmanager
def dropped_to(model: nn.Module, counts: Sequence[int]) -> Iterator[nn.Module]:
    """Inside the context block b receives the first counts[b] tokens (a schedule's counts, no reducer's work)."""
    with contextlib.ExitStack() as stack:
        previous = model_geometry(model).num_tokens
        for block, tokens in enumerate(counts):
            if tokens < previous:
                stack.enter_context(truncate_tokens(model, tokens, at_block=block))
            previous = tokens
        yield model


@contextlib.contextmanager
def last_blocks(model: nn.Module, count: int) -> Iterator[nn.Module]:
    """Inside the context `model` runs only its last `count` blocks; the original container is put back on leaving."""
    blocks = transformer_blocks(model)
    if not 1 <= count <= len(blocks):
        raise ValueError(f"count must lie in [1, {len(blocks)}], got {count}")
    original = model.blocks
    container = nn.Sequential if isinstance(original, nn.Sequential) else nn.ModuleList
    model.blocks = container(*blocks[-count:]) if container is nn.Sequential else container(blocks[-count:])
    try:
        yield model
    finally:
        model.blocks = original
