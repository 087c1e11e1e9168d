"""torch.compile of the exported static program, its on-disk caches pointed into pomt's cache folder.

The exported graph module (one per token count, each with its own code) is compiled rather than the
live model, so the counts do not pile up recompilations on the model's forward.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from pomt.errors import BackendError
from pomt.models.tokens import truncate_tokens
from pomt.runtimes.backend import first_line
from pomt.runtimes.eager import inference
from pomt.runtimes.export import export_program


def compile_run(
    model: nn.Module, example: torch.Tensor, tokens: int | None, cache: Path | None
) -> tuple[Callable[[], object], bool]:
    """(run, cache hit): the compiled program of `model(example)` at `tokens`, run once to compile it; a hit
    when inductor found every graph in cache/inductor."""
    from torch._dynamo.utils import counters

    with contextlib.ExitStack() as stack:
        if tokens is not None:
            stack.enter_context(truncate_tokens(model, tokens))
        graph = export_program(model, example).module()
    run = inference(torch.compile(graph, dynamic=False), example)

    before = dict(counters["inductor"])
    with _inductor_cache(cache):
        try:
            run()
        except Exception as exc:
            raise BackendError(f"torch.compile cannot compile this model: {first_line(exc)}") from exc
    hits = counters["inductor"]["fxgraph_cache_hit"] - before.get("fxgraph_cache_hit", 0)
    misses = counters["inductor"]["fxgraph_cache_miss"] - before.get("fxgraph_cache_miss", 0)
    return run, hits > 0 and misses == 0


@contextlib.contextmanager
def _inductor_cache(cache: Path | None) -> Iterator[None]:
    """Point torch.compile's on-disk caches (FX graph, AOT autograd, kernels) into cache/inductor."""
    if cache is None:
        yield
        return
    folder = cache / "inductor"
    folder.mkdir(parents=True, exist_ok=True)
    with _environ(TRITON_CACHE_DIR=str(folder / "triton")):
        try:  # torch's own switch, which also clears its in-memory lookups of the old folder
            from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
        except ImportError:
            with _environ(TORCHINDUCTOR_CACHE_DIR=str(folder)):
                yield
        else:
            with temporary_cache_dir(str(folder)):
                yield


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
