"""CUDA graphs: a forward captured once and replayed, so the host issues one launch, not one per kernel.

A pruned ViT on a GPU can be launch-bound: its speed is then the host's, and a replayed graph takes the host out.
The graph is captured from the eager model as it is (patched, or truncated to a token count) after warm-up
forwards on a side stream. Its input is static: a new batch is copied into the captured example first. A forward
that waits on the host (a data-dependent shape, `.item()`) cannot be captured: one BackendError line.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from pomt.errors import BackendError
from pomt.models.tokens import truncate_tokens
from pomt.runtimes.backend import first_line

WARMUP = 3  # eager forwards on a side stream before the capture (lazy initialisation, autotuned kernels)


class GraphedForward:
    """`model(example)` captured as a CUDA graph. Call it to replay; called with a tensor, that batch (the
    example's shape and dtype) is copied into the captured input first. The output is the graph's own tensor,
    overwritten by the next replay: copy it to keep it. `reset()` frees the graph's memory."""

    def __init__(self, model: nn.Module, example: torch.Tensor) -> None:
        if example.device.type != "cuda":
            raise BackendError(f"the cudagraph backend runs on an NVIDIA GPU (--device cuda), not on {example.device}")
        self.example = example
        current = torch.cuda.current_stream(example.device)
        side = torch.cuda.Stream(device=example.device)
        side.wait_stream(current)
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(WARMUP):
                    model(example)
            current.wait_stream(side)
            with torch.cuda.graph(self.graph), torch.inference_mode():
                self.output = model(example)
        except RuntimeError as exc:
            with contextlib.suppress(RuntimeError):  # a capture broken half-way may not reset cleanly
                self.graph.reset()
            raise BackendError(f"cudagraph cannot capture this model's forward: {first_line(exc)}") from exc

    def __call__(self, x: torch.Tensor | None = None) -> torch.Tensor:
        if x is not None:
            if x.shape != self.example.shape or x.dtype != self.example.dtype:
                raise ValueError(f"the graph was captured for {tuple(self.example.shape)} {self.example.dtype} "
                                 f"inputs, not {tuple(x.shape)} {x.dtype}")
            with torch.inference_mode():  # the example may be an inference tensor: written only in that mode
                self.example.copy_(x)
        self.graph.replay()
        return self.output

    def reset(self) -> None:
        self.graph.reset()


def cudagraph_run(model: nn.Module, example: torch.Tensor, tokens: int | None) -> GraphedForward:
    """One forward of `model` keeping `tokens` tokens (None: as it is, e.g. patched), captured as a graph; the
    token hook is gone once captured."""
    with contextlib.nullcontext() if tokens is None else truncate_tokens(model, tokens):
        return GraphedForward(model, example)


def cuda_graph(model: nn.Module, example: torch.Tensor) -> GraphedForward:
    """Serve `model` (patched with `pomt.apply_schedule` or not) from a CUDA graph captured on `example`, a batch
    of the shape and dtype it will be fed; then `forward(batch)` replays it on each new batch."""
    return GraphedForward(model, example)
