"""patch / unpatch / apply_schedule: put pruning blocks into a timm or DINOv2 ViT and take them out.

Only the blocks that remove tokens are patched (plus, for ToMe, the blocks after the first merge, which
need proportional attention, and the pooling of timm models that average their tokens, which ToMe
weights by token size); every other block keeps its class and timm's fused attention. A block
asked to remove 0 tokens is left alone, so the outputs equal the unpatched model's exactly.
Patching a model that is already patched first unpatches it (the new plan replaces the old one).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

from torch import nn

from pomt.device import device_fingerprint, fingerprint_hash
from pomt.errors import PatchError, ScheduleError
from pomt.geometry import model_geometry, transformer_blocks
from pomt.patching import blocks, pooling
from pomt.patching.plan import check_method, resolve_removal, token_counts
from pomt.schedule import Schedule, load_schedule

STATE_ATTR = blocks.STATE_ATTR


class UnverifiedScheduleWarning(UserWarning):
    """A schedule whose promise was not measured on this device."""


def patch_state(model: nn.Module) -> blocks.PatchState | None:
    """The model's patch state, or None when it is not patched."""
    return model.__dict__.get(STATE_ATTR)


def patch(
    model: nn.Module,
    method: str,
    prune: Mapping[int, int] | int,
    *,
    seed: int = 0,
    batch_size: int | None = None,
    strict: bool = False,
) -> nn.Module:
    """Patch `model` in place so that block b removes prune[b] tokens with `method`; returns it.

    `prune` maps block index -> tokens to remove there; an int removes that many at every block
    (ToMe style; ToMe merges at most (tokens - prefix tokens) // 2 pairs per block, clamped as ToMe does).
    `seed` seeds the `random` method. With `batch_size`, a forward at another batch size warns once
    (raises PatchError when `strict`).
    """
    check_method(method)
    geometry = model_geometry(model)
    removal = resolve_removal(prune, geometry.depth)
    token_counts(geometry.num_tokens, geometry.prefix_tokens, geometry.depth, method, removal)
    if method == "topk" and geometry.prefix_tokens == 0 and removal:
        raise PatchError("topk scores tokens by class-token attention, but this model has no class token")
    model_blocks = transformer_blocks(model)
    state = blocks.PatchState(
        method=method, removal=removal, prefix_tokens=geometry.prefix_tokens, seed=seed,
        batch_size=batch_size, strict=strict,
    )
    plans = blocks.build_plans(state, geometry.depth)
    unpatch(model)
    try:
        for index, plan in plans.items():
            state.originals[index] = blocks.install(model_blocks[index], plan)
        if method == "tome" and plans:
            state.model_class = pooling.install(model)
    except BaseException:
        _restore(model, model_blocks, state)
        raise
    model.__dict__[STATE_ATTR] = state
    return model


def _restore(model: nn.Module, model_blocks: list[nn.Module], state: blocks.PatchState) -> None:
    for index, original in state.originals.items():
        blocks.uninstall(model_blocks[index], original)
    state.originals.clear()
    if state.model_class is not None:
        pooling.uninstall(model, state.model_class)
        state.model_class = None


def unpatch(model: nn.Module) -> nn.Module:
    """Restore the original block and model classes and remove every attribute pomt added; returns it."""
    state = model.__dict__.pop(STATE_ATTR, None)
    if state is not None:
        _restore(model, transformer_blocks(model), state)
    return model


def _device_kind(model: nn.Module) -> str | None:
    parameter = next(model.parameters(), None)
    return None if parameter is None else parameter.device.type


def _dtype_name(model: nn.Module) -> str | None:
    parameter = next(model.parameters(), None)
    return None if parameter is None else str(parameter.dtype).removeprefix("torch.")


def _mismatch(message: str, strict: bool) -> None:
    if strict:
        raise ScheduleError(message + " (strict)")
    warnings.warn(message, stacklevel=3)


def _check_verified(schedule: Schedule, model: nn.Module, strict: bool) -> None:
    """Warn (raise under strict) when the schedule's speedup was never measured on the patched model, or
    was measured on another device than the one the model runs on; once per application, not per forward."""
    verified = schedule.verified
    if verified is None:
        message = ("schedule is unverified: its speedup was predicted, never measured on the patched model; "
                   "run the offline computation again to verify it")
    else:
        device = next((p.device for p in model.parameters()), None)
        here = fingerprint_hash(device_fingerprint(str(device) if device is not None else "cpu"))
        if here == verified.get("device_fingerprint_hash"):
            return
        message = (f"schedule was verified on another device (fingerprint {verified.get('device_fingerprint_hash')}, "
                   f"this one is {here}): its measured speedup may not hold here")
    if strict:
        raise ScheduleError(message + " (strict)")
    warnings.warn(message, UnverifiedScheduleWarning, stacklevel=3)


def apply_schedule(
    model: nn.Module,
    schedule: Schedule | str | Path | Mapping,
    strict: bool = False,
    *,
    batch_size: int | None = None,
) -> nn.Module:
    """Patch `model` in place as the schedule says (path, decoded dict or Schedule); returns it.

    Raises ScheduleError when the model's token count, prefix or depth differ from the schedule's.
    A different device kind, parameter dtype, or `batch_size` (given here or seen at the first forward)
    warns once; so does a schedule that prunes but was never verified on the patched model, or was verified
    on another device fingerprint (`UnverifiedScheduleWarning`); with `strict` each of these raises.
    """
    schedule = load_schedule(schedule)
    schedule.check_geometry(model_geometry(model))
    kind, wanted = _device_kind(model), schedule.device.get("kind")
    if wanted and kind and wanted != kind:
        _mismatch(f"schedule was made on {wanted}, the model is on {kind}", strict)
    dtype = _dtype_name(model)
    if dtype and dtype != schedule.dtype:
        _mismatch(f"schedule was measured in {schedule.dtype}, the model's parameters are {dtype}", strict)
    if batch_size is not None and batch_size != schedule.batch_size:
        _mismatch(f"schedule was made for batch size {schedule.batch_size}, not {batch_size}", strict)
    if schedule.removal:
        _check_verified(schedule, model, strict)
    try:
        return patch(
            model, schedule.method, schedule.removal, batch_size=schedule.batch_size, strict=strict
        )
    except PatchError as exc:
        raise ScheduleError(f"schedule cannot be applied: {exc}") from None
