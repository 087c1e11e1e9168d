"""Checks of settings that several entry points share: one function per decision, one exception type each; each
returns the value it accepted, and `label` names the setting the way the caller's user knows it."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from pomt.errors import BatchSizeError, CalibrationError, OutputError, PatchError, SettingError
from pomt.options import SEED_MAX, flag
from pomt.stats import CONFIDENCE, half_width, trials_for_half_width

METHODS = ("pomt", "topk", "tome", "l2norm", "random")


def check_method(method: str, choices: Sequence[str] = METHODS) -> str:
    """Raise PatchError unless `method` is one of `choices` (the pruning methods, or a benchmark's variants)."""
    if method not in choices:
        raise PatchError(f"unknown method {method!r}; choose one of {', '.join(choices)}")
    return method


def check_prune_block(block: int, depth: int, label: str = "prune block") -> int:
    """Raise PatchError unless `block` indexes one of a model's `depth` blocks (0-based)."""
    if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < depth:
        raise PatchError(f"{label} {block!r} is outside the model's blocks 0..{depth - 1}")
    return block


def check_batch_size(batch: int) -> int:
    """Raise BatchSizeError unless `batch` is an integer >= 1."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise BatchSizeError(f"batch size must be an integer >= 1, got {batch!r}")
    return batch


def check_threads(threads: int | None, label: str = "--threads") -> int | None:
    """Raise SettingError for more threads than this machine has logical CPUs (None: torch's default)."""
    cores = os.cpu_count() or 1
    if threads is not None and threads > cores:
        raise SettingError(f"{label} {threads} exceeds the {cores} logical CPUs of this machine")
    return threads


def check_input_memory(batch: int, size: tuple[int, int]) -> int:
    """Raise BatchSizeError when one batch of float32 input images alone outgrows the memory available."""
    needed, available = batch * 3 * size[0] * size[1] * 4, psutil.virtual_memory().available
    if needed > available:
        raise BatchSizeError(f"batch size {batch} at {size[0]}x{size[1]} px needs {needed / 2**30:.3g} GiB for its "
                             f"input alone; this machine has {available / 2**30:.1f} GiB available")
    return batch


def check_seed(seed: int, label: str = "seed") -> int:
    """Raise SettingError unless `seed` is an integer in [0, SEED_MAX], which every generator pomt seeds takes."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise SettingError(f"{label} must be an integer in [0, {SEED_MAX}], got {seed!r}")
    return seed


def check_removal(method: str, block: int, remove: int, patch_tokens: int) -> int:
    """Raise PatchError unless `method` can remove `remove` of the `patch_tokens` patch tokens entering `block`: at
    least one patch token stays; ToMe merges at most half of them (a schedule must respect it, not be clamped)."""
    if isinstance(remove, bool) or not isinstance(remove, int) or remove < 0:
        raise PatchError(f"tokens to remove at block {block} must be an integer >= 0, got {remove!r}")
    if method == "tome" and remove > patch_tokens // 2:
        raise PatchError(f"ToMe merges at most half the {patch_tokens} patch tokens entering block {block} "
                         f"(r <= {patch_tokens // 2}), got r = {remove}")
    if remove >= patch_tokens:
        raise PatchError(f"block {block} cannot remove {remove} tokens: only {patch_tokens} patch tokens are left "
                         f"there and at least one patch token must stay (remove at most {patch_tokens - 1})")
    return remove


def check_removals(method: str, removal: Mapping[int, int], num_tokens: int, prefix_tokens: int,
                   depth: int) -> dict[int, int]:
    """Check a whole {block: remove} schedule block by block; returns it sorted, zero removals dropped."""
    for block in removal:
        check_prune_block(block, depth)
    patch_tokens, checked = num_tokens - prefix_tokens, {}
    for block, remove in sorted(removal.items()):
        check_removal(method, block, remove, patch_tokens)
        if remove:
            checked[block] = remove
            patch_tokens -= remove
    return checked


def check_calibration_size(images: int, accuracy: float, max_drop_points: float,
                           confidence: float = CONFIDENCE, label: str = "--max-accuracy-drop") -> int:
    """Raise CalibrationError when the Wilson interval of `accuracy` on `images` is wider than the drop asked."""
    if max_drop_points <= 0:
        raise CalibrationError(f"{label} must be positive, got {max_drop_points:g}")
    width = half_width(accuracy, images, confidence) * 100
    if width > max_drop_points:
        needed = trials_for_half_width(accuracy, max_drop_points / 100, confidence)
        raise CalibrationError(
            f"{images} calibration images measure an accuracy of {accuracy:.1%} to within +-{width:.1f} points "
            f"({confidence:.0%} Wilson interval), wider than the {max_drop_points:g}-point drop asked by {label}: "
            f"give at least {needed} images or allow a drop of {width:.1f} points or more")
    return images


def check_options(config: object) -> object:
    """Raise SettingError for a field of the dataclass `config` outside the range its `option()` declares."""
    for f in dataclasses.fields(config):
        low, high = f.metadata.get("min"), f.metadata.get("max")
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):  # inf: a loop without end, a bound that is none
            raise SettingError(f"{flag(f)} must be a finite number, got {value:g}")
        if (low is None and high is None) or value is None:
            continue
        for number in value if isinstance(value, (tuple, list)) else (value,):  # (H, W) sizes: each
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
                raise SettingError(f"{flag(f)} must be a number, got {value!r}")
            if (low is not None and number < low) or (high is not None and number > high):
                bounds = (f"in [{low:g}, {high:g}]" if low is not None and high is not None else
                          f">= {low:g}" if low is not None else f"<= {high:g}")
                raise SettingError(f"{flag(f)} must be {bounds}, got {number:g}")
    return config


def check_output_dir(path: str | Path, label: str = "--output-dir") -> Path:
    """Raise OutputError unless files can be written in the folder `path` (made later where it does not exist yet)."""
    if not str(path).strip():  # an unset shell variable: "" would mean the current folder
        raise OutputError(f"{label} is empty; name a folder (. for the current one)")
    path = Path(path)
    problem = _folder_problem(path)
    if problem:
        raise OutputError(f"{label} {path} {problem}")
    return path


def check_output_file(path: str | Path, label: str = "--output") -> Path:
    """Raise OutputError unless the file `path` can be written: not a folder itself, its folder writable."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{label} {path} is a folder; name a file")
    problem = _folder_problem(path.parent)
    if problem:
        raise OutputError(f"{label} {path} cannot be written: its folder {path.parent} {problem}")
    return path


def _folder_problem(path: Path) -> str | None:
    """Why no file can be written in the folder `path` (None: it can)."""
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return "is a file, not a folder" if existing == path else f"lies under the file {existing}"
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".pomt-probe-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        where = "" if existing == path else f" ({existing}, where it would be made)"
        return f"is not writable{where}: {exc.strerror}"
    return None
