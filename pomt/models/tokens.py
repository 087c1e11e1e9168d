"""Run a model with only n tokens kept right after patch + position embedding (by a forward pre-hook, through the
model's own `model(x)`; prefix tokens always kept), or with only its last few blocks, where what a reducer costs at a
block would drown in the other blocks' jitter."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from pomt.models import positions
from pomt.models.geometry import block_container, model_geometry, transformer_blocks

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


Cut = Callable[[torch.Tensor], "int | torch.Tensor"]  # tokens in -> first n kept, or the patch indices kept


@contextlib.contextmanager
def truncate_tokens(model: nn.Module, n: int, selection: Selection = "first", seed: int = 0,
                    indices: torch.Tensor | None = None, at_block: int = 0) -> Iterator[nn.Module]:
    """Inside the context `model(x)` carries only n tokens from block `at_block` on.

    selection: "first" keeps the first n tokens; "random" a seeded per-sample subset that changes from call to call
    (reproducibly); `indices` (patch positions, (K,) or (B, K)) overrides both. At n = N the model is left untouched.
    Rotary embeddings and relative position biases are gathered with the tokens (`pomt.models.positions`)."""
    geometry = model_geometry(model)
    geometry.check_tokens(n)
    prefix, keep = geometry.prefix_tokens, n - geometry.prefix_tokens
    if indices is not None and indices.shape[-1] != keep:
        raise ValueError(f"indices hold {indices.shape[-1]} patch tokens, n = {n} needs {keep}")
    if n == geometry.num_tokens and indices is None:
        yield model
        return
    generator = torch.Generator().manual_seed(seed)

    def cut(x: torch.Tensor) -> int | torch.Tensor:
        if indices is not None:
            return indices.to(x.device)
        if selection == "first":
            return n
        return random_patch_indices(x.shape[0], x.shape[1] - prefix, keep, generator, x.device)

    with cut_tokens(model, {at_block: cut}):
        yield model


def forward_at_tokens(model: nn.Module, x: torch.Tensor, n: int, selection: Selection = "first", seed: int = 0,
                      indices: torch.Tensor | None = None) -> torch.Tensor:
    """The model's output on `x` when only n tokens go through its blocks."""
    with truncate_tokens(model, n, selection=selection, seed=seed, indices=indices):
        return model(x)


@contextlib.contextmanager
def dropped_to(model: nn.Module, counts: Sequence[int]) -> Iterator[nn.Module]:
    """Inside the context block b receives the first counts[b] tokens (a schedule's counts, no reducer's work)."""
    cuts: dict[int, Cut] = {}
    previous = model_geometry(model).num_tokens
    for block, tokens in enumerate(counts):
        if tokens < previous:
            cuts[block] = lambda _x, tokens=tokens: tokens
        previous = tokens
    with cut_tokens(model, cuts):
        yield model


def _hidden_states(args: tuple, kwargs: dict) -> tuple[torch.Tensor, Callable[[torch.Tensor], tuple[tuple, dict]]]:
    """A block's token tensor, wherever its caller put it, and how to put a new one in its place."""
    if args:
        return args[0], lambda x: ((x, *args[1:]), kwargs)
    return kwargs["hidden_states"], lambda x: (args, {**kwargs, "hidden_states": x})


@dataclass(eq=False)
class _Cuts:
    """The cuts active on one model, in the order their contexts were entered, and the hooks that run them."""

    stack: list[Mapping[int, Cut]] = field(default_factory=list)
    hooked: set[int] = field(default_factory=set)  # the blocks whose hook is installed
    index: torch.Tensor | None = None  # the original place of each token now (positional models)


ACTIVE_CUTS = "_pomt_cuts"


@contextlib.contextmanager
def cut_tokens(model: nn.Module, cuts: Mapping[int, Cut]) -> Iterator[nn.Module]:
    """Inside the context block b's input is cut by `cuts[b]` (forward pre-hooks, run before any other); later
    blocks see the rotary embedding or relative position bias of the tokens that are left. Contexts nest: every
    active cut of a block runs, the outer first."""
    if not cuts:
        yield model
        return
    state = model.__dict__.setdefault(ACTIVE_CUTS, _Cuts())
    blocks, prefix = transformer_blocks(model), model_geometry(model).prefix_tokens
    kind = positions.position_kind(model)
    state.stack.append(cuts)
    first = min(min(c) for c in state.stack)
    try:
        with contextlib.ExitStack() as stack:
            for block in range(first, len(blocks)) if kind else sorted(cuts):
                if block not in state.hooked:
                    hook = _hook(state, block, prefix, kind)
                    handle = blocks[block].register_forward_pre_hook(hook, prepend=True, with_kwargs=True)
                    state.hooked.add(block)
                    stack.callback(state.hooked.discard, block)
                    stack.callback(handle.remove)
                    if kind == "relative" and blocks[block].attn.relative_position_bias_table is not None:
                        stack.enter_context(_relative_bias_follows(blocks[block].attn, state))
            yield model
    finally:
        state.stack.remove(cuts)
        if not state.stack:
            del model.__dict__[ACTIVE_CUTS]


def _hook(state: _Cuts, block: int, prefix: int, kind: positions.Kind | None) -> Callable:
    """The pre-hook of `block`: every active cut of it, then the positions of the tokens left."""

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        x, put = _hidden_states(args, kwargs)
        if block == min(min(c) for c in state.stack):
            state.index = None  # a new forward
        for cuts in list(state.stack):
            if block not in cuts:
                continue
            tokens, choice = x.shape[1], cuts[block](x)
            if isinstance(choice, int):
                kept = torch.arange(choice - prefix, device=x.device) if kind else None
                x = x[:, :choice]
            else:
                kept, x = choice, gather_tokens(x, prefix, choice)
            if kind:
                state.index = positions.select(state.index, prefix, kept, tokens)
        args, kwargs = put(x)
        if state.index is not None and kind == "rope" and kwargs.get("rope") is not None:
            kwargs = {**kwargs, "rope": positions.gather_rope(kwargs["rope"], state.index, prefix)}
        if state.index is not None and kind == "relative" and kwargs.get("shared_rel_pos_bias") is not None:
            kwargs = {**kwargs, "shared_rel_pos_bias": positions.gather_bias(kwargs["shared_rel_pos_bias"],
                                                                             state.index)}
        return args, kwargs

    return hook


@contextlib.contextmanager
def _relative_bias_follows(attn: nn.Module, state: _Cuts) -> Iterator[None]:
    """Inside the context a BEiT attention layer's own relative position bias is that of the current tokens."""
    own = type(attn)._get_rel_pos_bias

    def follows() -> torch.Tensor:
        bias = own(attn)
        return bias if state.index is None else positions.gather_bias(bias, state.index)

    attn.__dict__["_get_rel_pos_bias"] = follows
    try:
        yield
    finally:
        del attn.__dict__["_get_rel_pos_bias"]


@contextlib.contextmanager
def last_blocks(model: nn.Module, count: int) -> Iterator[nn.Module]:
    """Inside the context `model` runs only its last `count` blocks; the original container is put back on leaving."""
    blocks = transformer_blocks(model)
    if not 1 <= count <= len(blocks):
        raise ValueError(f"count must lie in [1, {len(blocks)}], got {count}")
    owner, name = block_container(model)
    original = getattr(owner, name)
    container = nn.Sequential if isinstance(original, nn.Sequential) else nn.ModuleList
    setattr(owner, name, container(*blocks[-count:]) if container is nn.Sequential else container(blocks[-count:]))
    try:
        yield model
    finally:
        setattr(owner, name, original)
