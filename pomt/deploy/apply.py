"""apply_schedule: patch a model as a schedule file says, after checking that the schedule fits the model
and warning where its promise was not measured where the model runs (another device, dtype or batch size,
or never verified on the patched model)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path

from torch import nn

from pomt.device import device_fingerprint, fingerprint_hash
from pomt.errors import PatchError, ScheduleError
from pomt.formats.schedule import Schedule, load_schedule
from pomt.models.geometry import model_geometry
from pomt.patching.api import patch


class UnverifiedScheduleWarning(UserWarning):
    """A schedule whose promise was not measured on this device."""


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
        if here == verified.device_fingerprint_hash:
            return
        message = (f"schedule was verified on another device (fingerprint {verified.device_fingerprint_hash}, "
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
    kind, wanted = _device_kind(model), schedule.device.kind
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
