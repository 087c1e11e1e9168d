"""apply_schedule: patch a model as a schedule file says, after checking that the schedule fits the model
and warning where its promise was not measured where the model runs (another model of the same geometry,
another device, runtime, dtype, allocator or batch size, or never verified on the patched model)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from torch import nn

from pomt.checks import check_batch_size
from pomt.device import Fingerprint, device_fingerprint, fingerprint_hash
from pomt.device.allocator import allocator_settings, allocator_words
from pomt.errors import PatchError, PomtError, ScheduleError
from pomt.formats.schedule import Schedule, load_schedule
from pomt.models.family import check_family
from pomt.models.geometry import model_geometry
from pomt.models.registry import architecture
from pomt.patching.api import patch
from pomt.runtimes import IN_PROCESS, Backend, backend_info


class UnverifiedScheduleWarning(UserWarning):
    """A schedule whose promise was not measured on this device."""


def _mismatch(message: str, strict: bool, category: type[Warning] = UserWarning, depth: int = 0) -> None:
    """Raise ScheduleError under strict, else warn `depth` frames above the usual `stacklevel=3`."""
    if strict:
        raise ScheduleError(message + " (strict)")
    warnings.warn(message, category, stacklevel=3 + depth)


def eager_fingerprint(device: str = "cpu", backend: str = Backend.EAGER.value) -> Fingerprint:
    """The fingerprint of this process running a model in PyTorch on `device` in `backend` (eager, or a CUDA graph
    of it), as the offline computation records it, so a schedule verified here hashes the same."""
    return replace(device_fingerprint(device), backend=backend_info(backend))


def _check_identity(schedule: Schedule, model: nn.Module, strict: bool) -> None:
    """Warn (raise under strict) when the model is another timm architecture than the schedule's: one of the
    same token geometry patches without error, but the schedule's latency and accuracy are another model's."""
    theirs = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")  # timm's name of what it built
    if not theirs:
        return
    try:
        ours = architecture(schedule.model)
    except PomtError:  # a name this timm does not know: compared as written
        ours = schedule.model.partition(".")[0]
    if ours != str(theirs):
        _mismatch(f"schedule was made for {schedule.model}, the model is {theirs}", strict)


def _check_verified(schedule: Schedule, model: nn.Module, strict: bool) -> None:
    """Warn (raise under strict) when the schedule's speedup was never measured on the patched model, or was
    measured on another device than the one the model runs on."""
    verified = schedule.verified
    if verified is None:
        message = ("schedule is unverified: its speedup was predicted, never measured on the patched model; "
                   "run the offline computation again to verify it")
    else:  # a schedule measured as a CUDA graph is served as one (`pomt.cuda_graph`) after this patch
        device = next((p.device for p in model.parameters()), None)
        runtime = schedule.backend_name if schedule.backend_name in IN_PROCESS else Backend.EAGER.value
        here = fingerprint_hash(eager_fingerprint(str(device) if device is not None else "cpu", runtime))
        if here == verified.device_fingerprint_hash:
            return
        message = (f"schedule was verified on another device or runtime (fingerprint "
                   f"{verified.device_fingerprint_hash}, this one in PyTorch is {here}): its measured speedup may "
                   "not hold here")
    _mismatch(message, strict, UnverifiedScheduleWarning, depth=1)


def _check_allocator(schedule: Schedule, kind: str | None, strict: bool) -> None:
    """Warn (`UnverifiedScheduleWarning`; raise under strict) when a CPU schedule was measured under other host
    allocator settings than this process runs (on the CPU the allocator moves latency); one recording none passes."""
    theirs = schedule.device.allocator
    if schedule.device.kind != "cpu" or kind != "cpu" or theirs is None:
        return
    ours = allocator_settings()
    if ours == theirs:
        return
    _mismatch(f"schedule was measured under {allocator_words(theirs)}, this process runs {allocator_words(ours)}: "
              "its speedup holds under the same settings (pomt.steady_allocator() before serving, or the same "
              "environment)", strict, UnverifiedScheduleWarning, depth=1)


def apply_schedule(model: nn.Module, schedule: Schedule | str | Path | Mapping, strict: bool = False, *,
                   batch_size: int | None = None) -> nn.Module:
    """Patch `model` in place as the schedule says (path, decoded dict or Schedule); returns it.

    Raises UnsupportedModelError for a model pomt cannot patch, ScheduleError when the model's token count, prefix
    or depth differ from the schedule's. Another timm architecture, device kind, parameter dtype or `batch_size`
    (given here or seen at the first forward) warns once; so does a schedule that prunes but was never verified on
    the patched model, was verified on another device fingerprint or runtime, or (CPU) was measured under other
    allocator settings (`UnverifiedScheduleWarning`); with `strict` each of these raises.
    """
    check_family(model)
    if batch_size is not None:
        check_batch_size(batch_size)
    schedule = load_schedule(schedule)
    schedule.check_geometry(model_geometry(model))
    _check_identity(schedule, model, strict)
    parameter = next(model.parameters(), None)
    kind, wanted = None if parameter is None else parameter.device.type, schedule.device.kind
    if wanted and kind and wanted != kind:
        _mismatch(f"schedule was made on {wanted}, the model is on {kind}", strict)
    dtype = None if parameter is None else str(parameter.dtype).removeprefix("torch.")
    if dtype and dtype != schedule.dtype:
        _mismatch(f"schedule was measured in {schedule.dtype}, the model's parameters are {dtype}", strict)
    if batch_size is not None and batch_size != schedule.batch_size:
        _mismatch(f"schedule was made for batch size {schedule.batch_size}, not {batch_size}", strict)
    if schedule.removal:
        _check_verified(schedule, model, strict)
        _check_allocator(schedule, kind, strict)
    try:
        return patch(model, schedule.method, schedule.removal, batch_size=schedule.batch_size, strict=strict)
    except PatchError as exc:
        raise ScheduleError(f"schedule cannot be applied: {exc}") from None
