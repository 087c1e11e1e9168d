"""One forward of a model in one runtime, as a closable callable that pomt times like an eager forward.

Eager runs the model itself; cudagraph replays its forward captured as a CUDA graph; torch.compile, ONNX Runtime,
OpenVINO and TensorRT run the static program of its token count, from the program cache when it holds it.
`ProgramCache` keeps the last few forwards open for a measurement that goes back and forth between counts.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pomt.errors import BackendError
from pomt.models.geometry import model_geometry
from pomt.runtimes.backend import Backend, eager_run, first_line, parse_backend
from pomt.runtimes.cudagraph import cudagraph_run
from pomt.runtimes.exported import onnxruntime_run, openvino_run, tensorrt_run
from pomt.runtimes.programs import cached_onnx, compile_run, program_folder, program_key


@dataclass(frozen=True)
class ProgramFiles:
    """Where exported programs are kept between runs (None: a temporary folder per program), and what stands for
    the weights in their key: None, a fingerprint of the parameters; a fixed string such as "latency" reuses
    programs across models that differ only in weights, for timing alone."""

    folder: str | Path | None = None
    weights: str | None = None


class Forward:
    """One forward of a model in one runtime: call it to run it; `close()` (or a with block) releases it.
    `cache_hit`: the program came from the cache; `artifact`: the cached file it runs, when there is one."""

    def __init__(self, run: Callable[[], object], backend: Backend, tokens: int | None, *, cache_hit: bool = False,
                 artifact: Path | None = None, release: Callable[[], None] | None = None) -> None:
        self._run, self.backend, self.tokens = run, backend, tokens
        self.cache_hit, self.artifact, self._release = cache_hit, artifact, release

    def __call__(self) -> object:
        return self._run()

    def close(self) -> None:
        """Remove the token hook (eager) and drop the runtime's program so its memory can go."""
        release, self._release = self._release, None
        self._run = _closed
        if release is not None:
            release()

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _closed() -> object:
    raise RuntimeError("this Forward is closed")


def build_forward(model: nn.Module, example: torch.Tensor, *, backend: Backend | str, tokens: int | None = None,
                  threads: int | None = None, files: ProgramFiles | None = None) -> Forward:
    """A callable that runs ONE forward of `model` on `example` in `backend` (synchronous; warm-up is yours).
    `tokens`: keep that many tokens after the position embedding (one export per count), or None to run the model
    as it is. Model and example must already be in the dtype to measure. `threads`: the runtime's intra-op threads
    (default torch's). Eager leaves the token hook on `model` until the Forward is closed."""
    device, backend = str(example.device), parse_backend(backend)
    if (dtype := parameter_dtype(model)) is not None and dtype != example.dtype:
        raise ValueError(f"model parameters are {dtype} but the example is {example.dtype}; cast both")
    if backend == Backend.ONNXRUNTIME and example.dtype == torch.bfloat16 and not device.startswith("cuda"):
        raise BackendError("onnxruntime on the CPU takes numpy inputs and numpy has no bfloat16; use openvino")
    if tokens is not None:
        model_geometry(model).check_tokens(tokens)
    threads = threads or torch.get_num_threads()
    if backend == Backend.EAGER:
        run, release = eager_run(model, example, tokens)
        return Forward(run, backend, tokens, release=release)
    if backend == Backend.CUDAGRAPH:
        graphed = cudagraph_run(model, example, tokens)
        return Forward(graphed, backend, tokens, release=graphed.reset)
    files = files or ProgramFiles()
    cache = Path(files.folder) if files.folder is not None else None
    if backend == Backend.COMPILE:
        run, hit = compile_run(model, example, tokens, cache)
        return Forward(run, backend, tokens, cache_hit=hit)
    key = program_key(model, example, tokens, files.weights)
    with program_folder(cache) as folder:
        if backend == Backend.TENSORRT:
            run, artifact, hit = tensorrt_run(model, example, tokens, folder, key, device)
        else:
            artifact, hit = cached_onnx(model, example, tokens, folder, key)
            runner = onnxruntime_run if backend == Backend.ONNXRUNTIME else openvino_run
            run = runner(artifact, example, device, threads)
        forward = Forward(run, backend, tokens, cache_hit=hit, artifact=artifact if cache else None)
        try:
            forward()
        except Exception as exc:
            forward.close()
            raise BackendError(f"{backend.value} cannot run this model: {first_line(exc)}") from exc
    return forward


def parameter_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's weights, which its inputs must match; None for a model without any."""
    parameter = next(model.parameters(), None)
    return None if parameter is None else parameter.dtype


class ProgramCache:
    """`cache(key)`: a context giving the Forward `build(key)` makes, the last `keep` kept open (0: each
    closed after use); a `ForwardAt` of `pomt.measurement.sources`."""

    def __init__(self, build: Callable[[int], Forward], keep: int = 0):
        self.build, self.keep = build, keep
        self._open: OrderedDict[int, Forward] = OrderedDict()

    @contextlib.contextmanager
    def __call__(self, key: int) -> Iterator[Forward]:
        if self.keep == 0:
            forward = self.build(key)
            try:
                yield forward
            finally:
                forward.close()
            return
        if key not in self._open:
            self._open[key] = self.build(key)
            while len(self._open) > self.keep:
                self._open.popitem(last=False)[1].close()
        self._open.move_to_end(key)
        yield self._open[key]
