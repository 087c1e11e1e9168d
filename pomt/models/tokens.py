"""Run a model with only n tokens kept right after patch + position embedding (by a forward pre-hook, through the
model's own `model(x)`; prefix tokens always kept), or with only its last few blocks, where what a reducer costs at a
block would drown in the other blocks' jitter.

Positions follow the tokens: a rotary embedding (timm Eva) and a relative position bias (timm BEiT) belong to a
token's place in the patch grid, so they are gathered with the tokens. `index` (B or 1, T) is the original place,
among the model's N tokens, of each current token; a merged token keeps its destination's place (ToMe), pomt's fused
token the place of the best-scored token it fuses."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

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
    Rotary embeddings and relative position biases are gathered with the tokens (`pomt.models.tokens`)."""
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
    kind = position_kind(model)
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


def _hook(state: _Cuts, block: int, prefix: int, kind: PositionKind | None) -> Callable:
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
                state.index = select_positions(state.index, prefix, kept, tokens)
        args, kwargs = put(x)
        if state.index is not None and kind == "rope" and kwargs.get("rope") is not None:
            kwargs = {**kwargs, "rope": gather_rope(kwargs["rope"], state.index, prefix)}
        if state.index is not None and kind == "relative" and kwargs.get("shared_rel_pos_bias") is not None:
            kwargs = {**kwargs, "shared_rel_pos_bias": gather_bias(kwargs["shared_rel_pos_bias"],
                                                                             state.index)}
        return args, kwargs

    return hook


@contextlib.contextmanager
def _relative_bias_follows(attn: nn.Module, state: _Cuts) -> Iterator[None]:
    """Inside the context a BEiT attention layer's own relative position bias is that of the current tokens."""
    own = type(attn)._get_rel_pos_bias

    def follows() -> torch.Tensor:
        bias = own(attn)
        return bias if state.index is None else gather_bias(bias, state.index)

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

PositionKind = Literal["rope", "relative"]


def position_kind(model: nn.Module) -> PositionKind | None:
    """"rope" for a model whose blocks take a rotary embedding, "relative" for one with relative position biases."""
    if getattr(model, "rope", None) is not None:
        return "rope"
    if getattr(model, "rel_pos_bias", None) is not None:
        return "relative"
    blocks = getattr(model, "blocks", None) or []
    first = next(iter(blocks), None)
    if getattr(getattr(first, "attn", None), "relative_position_bias_table", None) is not None:
        return "relative"
    return None


def identity_index(batch: int, tokens: int, device: torch.device) -> torch.Tensor:
    """Every token at its own place (B, T)."""
    return torch.arange(tokens, device=device).expand(batch, tokens)


def select_positions(index: torch.Tensor | None, prefix: int, patches: torch.Tensor, tokens: int) -> torch.Tensor:
    """The index after keeping the patch tokens at `patches` ((K,) shared or (B, K)) out of `tokens` tokens."""
    if index is None:
        index = identity_index(1 if patches.ndim == 1 else patches.shape[0], tokens, patches.device)
    patch_part = index[:, prefix:]
    if patches.ndim == 1:
        kept = patch_part.index_select(1, patches)
    else:
        kept = patch_part.expand(patches.shape[0], -1).gather(1, patches)
    return torch.cat([index[:, :prefix].expand(kept.shape[0], -1), kept], dim=1)


def gather_rope(rope: torch.Tensor, index: torch.Tensor, prefix: int) -> torch.Tensor:
    """The rotary embedding of the current patch tokens: rope (N - P, D) or per head (H, N - P, D) -> (B, 1 or H,
    T - P, D), broadcasting over the (B, H, T - P, d) queries and keys. A rope already gathered for the tokens a
    block received ((B or 1, 1 or H, K, D)) is gathered again, `index` then counting within those tokens."""
    patches = index[:, prefix:] - prefix
    if rope.ndim == 4:
        batch = max(rope.shape[0], patches.shape[0])
        picked = patches.expand(batch, -1)[:, None, :, None].expand(-1, rope.shape[1], -1, rope.shape[-1])
        return rope.expand(batch, -1, -1, -1).gather(2, picked)
    if rope.ndim == 2:
        return rope[patches].unsqueeze(1)
    return rope[:, patches].transpose(0, 1)


def gather_bias(bias: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The attention bias between current tokens: bias (H, N, N) or (1 or B, H, N, N) -> (B, H, T, T)."""
    if bias.ndim == 3:
        bias = bias.unsqueeze(0)
    batch = index.shape[0]
    rows = index.unsqueeze(-1).expand(-1, -1, index.shape[1])
    cols = index.unsqueeze(1).expand(-1, index.shape[1], -1)
    if bias.shape[0] == 1:
        return bias[0][:, rows, cols].transpose(0, 1)
    samples = torch.arange(batch, device=index.device).view(batch, 1, 1)
    return bias.permute(0, 2, 3, 1)[samples, rows, cols].permute(0, 3, 1, 2)


def relative_bias(attn: nn.Module, shared: torch.Tensor | None) -> torch.Tensor | None:
    """A BEiT attention layer's own relative position bias plus the model's shared one (1, H, N, N), or None."""
    own = attn._get_rel_pos_bias() if getattr(attn, "relative_position_bias_table", None) is not None else None
    if own is None:
        return shared
    return own if shared is None else own + shared
