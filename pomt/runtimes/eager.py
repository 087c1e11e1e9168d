"""Eager PyTorch: the model itself, called as `model(example)` without autograd.

The kept-token count is a hook on the model (`pomt.models.tokens.truncate_tokens`), left on until the
forward is released; torch.compile runs its program through the same call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from pomt.models.tokens import truncate_tokens


def inference(model: nn.Module | Callable, example: torch.Tensor) -> Callable[[], object]:
    """model(example) without autograd, the same way for every torch backend."""

    def run() -> object:
        with torch.inference_mode():
            return model(example)

    return run


def eager_run(
    model: nn.Module, example: torch.Tensor, tokens: int | None
) -> tuple[Callable[[], object], Callable[[], None]]:
    """(run, release): one forward of `model` keeping `tokens` tokens (None: all), and what removes its hook."""
    stack = contextlib.ExitStack()
    if tokens is not None:
        stack.enter_context(truncate_tokens(model, tokens))
    return inference(model, example), stack.close
