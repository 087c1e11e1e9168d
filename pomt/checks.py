"""Checks of settings that several entry points share: one function per decision, one exception type each.

Each returns the value it accepted, so a caller can check and use it in one expression. `label` names the
setting in the message the way the caller's user knows it (a CLI flag, or a field of a schedule file).
"""

from __future__ import annotations

from collections.abc import Sequence

from pomt.errors import BatchSizeError, PatchError

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
