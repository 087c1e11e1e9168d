"""patch / unpatch: put pruning blocks into a ViT and take them out.

Only the blocks that remove tokens are patched, plus the blocks after the first removal where they must follow it
(ToMe's proportional attention; the rotary embedding or relative position bias of the tokens left) and, for ToMe,
the pooling of models that average their tokens or pool them by attention, which ToMe weights by token size;
every other block keeps its class and its model's fused attention. A block
asked to remove 0 tokens is left alone, so the outputs equal the unpatched model's exactly.
Patching a model that is already patched first unpatches it (the new plan replaces the old one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from torch import nn

from pomt.checks import check_batch_size, check_method, check_prune_block, check_seed
from pomt.errors import PatchError
from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.models.positions import position_kind
from pomt.patching import blocks, pooling
from pomt.patching.blocks import token_counts

STATE_ATTR = blocks.STATE_ATTR


def patch_state(model: nn.Module) -> blocks.PatchState | None:
    """The model's patch state, or None when it is not patched."""
    return model.__dict__.get(STATE_ATTR)


def patch(model: nn.Module, method: str, prune: Mapping[int, int] | int, *, seed: int = 0,
          batch_size: int | None = None, strict: bool = False) -> nn.Module:
    """Patch `model` in place so that block b removes prune[b] tokens with `method`; returns it.

    `prune` maps block index -> tokens to remove there; an int removes that many at every block
    (ToMe style; ToMe merges at most (tokens - prefix tokens) // 2 pairs per block, clamped as ToMe does).
    `seed` seeds the `random` method. With `batch_size`, a forward at another batch size warns once
    (raises PatchError when `strict`).
    """
    check_method(method)
    check_seed(seed)
    if batch_size is not None:
        check_batch_size(batch_size)
    geometry = model_geometry(model)
    removal = resolve_removal(prune, geometry.depth)
    token_counts(geometry.num_tokens, geometry.prefix_tokens, geometry.depth, method, removal)
    model_blocks = transformer_blocks(model)
    state = blocks.PatchState(
        method=method, removal=removal, prefix_tokens=geometry.prefix_tokens, seed=seed,
        batch_size=batch_size, strict=strict, positions=position_kind(model),
        class_token=geometry.prefix_tokens > 0 and getattr(model, "cls_token", True) is not None,
    )
    plans = blocks.build_plans(state, geometry.depth)
    unpatch(model)
    try:
        for index, plan in plans.items():
            state.originals[index] = blocks.install(model_blocks[index], plan)
        if method == "tome" and plans:
            state.pooled = pooling.install_pooling(model)
    except BaseException:
        _restore(model, model_blocks, state)
        raise
    model.__dict__[STATE_ATTR] = state
    return model


def _restore(model: nn.Module, model_blocks: list[nn.Module], state: blocks.PatchState) -> None:
    for index, original in state.originals.items():
        blocks.uninstall(model_blocks[index], original)
    state.originals.clear()
    if state.pooled is not None:
        pooling.uninstall_pooling(*state.pooled)
        state.pooled = None


def resolve_removal(prune: Mapping[int, int] | int, depth: int) -> dict[int, int]:
    """`patch`'s `prune`, checked: {block: tokens removed}, zero entries dropped; an int means every block."""
    if isinstance(prune, bool) or not isinstance(prune, (int, Mapping)):
        raise PatchError(f"prune must be an int or a {{block: remove}} mapping, got {type(prune).__name__}")
    items = {block: prune for block in range(depth)} if isinstance(prune, int) else dict(prune)
    removal: dict[int, int] = {}
    for block, remove in sorted(items.items()):
        check_prune_block(block, depth)
        if isinstance(remove, bool) or not isinstance(remove, int) or remove < 0:
            raise PatchError(f"tokens to remove at block {block} must be an integer >= 0, got {remove!r}")
        if remove:
            removal[block] = remove
    return removal


@contextlib.contextmanager
def patched(model: nn.Module, method: str, prune: Mapping[int, int] | int, **options) -> Iterator[nn.Module]:
    """`model` patched as `patch(model, method, prune, **options)` inside the context, unpatched on leaving."""
    patch(model, method, prune, **options)
    try:
        yield model
    finally:
        unpatch(model)


def unpatch(model: nn.Module) -> nn.Module:
    """Restore the original block and model classes and remove every attribute pomt added; returns it."""
    if not isinstance(model, nn.Module):
        raise PatchError(f"unpatch takes the model patch() was given, a torch module, not {type(model).__name__}")
    state = model.__dict__.pop(STATE_ATTR, None)
    if state is not None:
        _restore(model, transformer_blocks(model), state)
    return model
