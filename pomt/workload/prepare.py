"""What is measured, and how it is set up on this machine, shared by the offline computation, the benchmark and
`pomt record`.

`prepare_run` resolves and checks the run before any model is built; `prepare` builds the model in its dtype on
its device with a seeded input and the token grid; `open_journal` opens (or, with `resume`, continues) the trace
a run writes every visit to; `live_run` measures into it; `journalled` turns Ctrl-C into `Interrupted`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from pomt.checks import check_batch_size, check_input_memory, check_options, check_output_dir, check_threads
from pomt.device import Fingerprint, device_fingerprint, resolve_device
from pomt.device import require_locked_clocks as refuse_unlocked_clocks
from pomt.device.allocator import ALLOCATOR_HELP, ALLOCATORS, check_allocator, use_allocator
from pomt.errors import Interrupted
from pomt.formats.schedule import utc_now
from pomt.formats.trace import TraceWriter
from pomt.measurement.design import token_grid
from pomt.measurement.sources import LiveSource, MeasurementRun, journal_end_s, live_forwards
from pomt.models.geometry import Geometry, model_geometry
from pomt.models.registry import (
    MAX_INPUT_SIZE,
    architecture,
    create_model,
    default_input_size,
    normalise_input_size,
    resolve_model_name,
)
from pomt.options import ADVANCED, MEASUREMENT, OUTPUTS, SEED_MAX, WORKLOAD, option
from pomt.runtimes import BACKENDS, DTYPES, backend_info, check_backend, resolve_dtype

MODEL, BATCH_SIZE = "deit_base", 4  # what a workload measures where it does not say


@dataclass(frozen=True)
class RunSetup:
    """The resolved setting of one run."""

    model: str  # timm name, pretrained tag kept
    device: str  # cpu, cuda, cuda:N or mps
    fingerprint: Fingerprint
    batch_size: int
    input_size: tuple[int, int]

    @property
    def architecture(self) -> str:
        return architecture(self.model)

    @property
    def stem(self) -> str:
        return output_stem(self.model, self.device, [self.batch_size], [self.input_size])

    def at(self, batch_size: int, input_size: int | tuple[int, int]) -> RunSetup:
        """The same run at another batch size and input size (a cell of a sweep)."""
        return replace(self, batch_size=check_batch_size(batch_size), input_size=normalise_input_size(input_size))


def output_stem(model: str, device: str, batch_sizes: Sequence[int], input_sizes: Sequence[tuple[int, int]]) -> str:
    """`<model>_<device>_bs<B>_is<S>`; a sweep joins its batch and input sizes with "-"."""
    sizes = "-".join(str(h) if h == w else f"{h}x{w}" for h, w in input_sizes)
    batches = "-".join(map(str, batch_sizes))
    return f"{architecture(model)}_{device.split(':')[0]}_bs{batches}_is{sizes}"


@dataclass(frozen=True)
class Host:
    """How the host is held while a run measures: its CPU allocator, and whether unlocked clocks are refused."""

    allocator: str = "steady"
    require_locked_clocks: bool = False


def prepare_run(model: str, device: str = "auto", threads: int | None = None, batch_size: int = 1,
                input_size: int | tuple[int, int] | None = None, host: Host = Host()) -> RunSetup:
    """Resolve the model name, sizes and device, set the host allocator on a CPU, and take the device's
    fingerprint; with `host.require_locked_clocks`, raise DeviceError unless its clocks are locked."""
    name = resolve_model_name(model)
    batch = check_batch_size(batch_size)
    size = normalise_input_size(input_size) or default_input_size(name)
    resolved = resolve_device(device)
    check_allocator(host.allocator)  # on every device, so a typo is refused before any GPU run too
    if resolved == "cpu":
        use_allocator(host.allocator)
    fingerprint = device_fingerprint(resolved, threads)
    if host.require_locked_clocks:
        refuse_unlocked_clocks(fingerprint)
    return RunSetup(name, resolved, fingerprint, batch, size)


@dataclass(frozen=True)
class Workload:
    """What is measured, on what, and where outputs go; each field is also the CLI option of its name."""

    model: str | None = option(None, f"timm model name or alias (default: {MODEL}; a replay's is its trace's).",
                               panel=WORKLOAD)
    batch_size: int | None = option(None, f"Batch size the latency is for (default: {BATCH_SIZE}; a replay's is "
                                          "its trace's).", min=1, panel=WORKLOAD)
    input_size: int | tuple[int, int] | None = option(None, "Input size in pixels (default: the model's).", min=1,
                                                      max=MAX_INPUT_SIZE, panel=WORKLOAD)
    device: str = option("auto", "auto (cuda if present, else cpu), cpu, cuda[:N], mps.", panel=WORKLOAD)
    threads: int | None = option(None, "CPU threads, fixed and recorded (default: torch's).", min=1, panel=WORKLOAD)
    allocator: str = option("steady", ALLOCATOR_HELP, choices=ALLOCATORS, panel=ADVANCED)
    dtype: str = option("float32", "Model and input dtype (bfloat16 on CPU, float16 on CUDA).", choices=DTYPES,
                        panel=WORKLOAD)
    backend: str = option("eager", "Runtime measured on.", choices=BACKENDS, panel=WORKLOAD)
    grid_token_start: int | None = option(None, "First kept-token count (default N).", min=1, panel=MEASUREMENT)
    grid_token_stop: int | None = option(None, "Last kept-token count (default P+1).", min=1, panel=MEASUREMENT)
    grid_token_stride: int = option(1, "Grid step in tokens.", min=1, panel=MEASUREMENT)
    output_dir: Path = option(Path("bin"), "Where outputs are written.", panel=OUTPUTS)
    resume: bool = option(False, "Continue a killed run from its journal; measure only what is missing.", panel=OUTPUTS)
    require_locked_clocks: bool = option(False, "Refuse to measure unless clocks are locked.", panel=MEASUREMENT)
    seed: int = option(0, "Seed for pass orders, the input, samples and random pruning.", min=0, max=SEED_MAX,
                       panel=ADVANCED)
    progress: bool = option(True, "Show progress bars.", negatable=True, panel=OUTPUTS)

    def check(self) -> Workload:
        """Raise for settings outside their ranges or an output folder no file can be written in."""
        check_options(self)
        check_threads(self.threads)
        check_output_dir(self.output_dir)
        return self


@dataclass
class Prepared:
    """A workload made concrete: setup, model and input, and the journals opened for it (`open_journal`)."""

    setup: RunSetup
    geometry: Geometry
    grid: list[int]
    model: nn.Module
    x: torch.Tensor | None
    journals: list[TraceWriter] = field(default_factory=list)

    @property
    def cache_dir(self) -> Path:
        return Path("cache") / self.setup.stem


def workload_grid(workload: Workload, geometry: Geometry) -> list[int]:
    """The token counts to measure, ascending; N is always among them (the reference of every pass)."""
    grid = token_grid(workload.grid_token_start if workload.grid_token_start is not None else geometry.num_tokens,
                      workload.grid_token_stop if workload.grid_token_stop is not None else geometry.min_tokens,
                      workload.grid_token_stride, min_tokens=geometry.min_tokens, max_tokens=geometry.num_tokens)
    return sorted(set(grid) | {geometry.num_tokens})


def prepare(workload: Workload, pretrained: bool = False, checkpoint: str | Path | None = None,
            run: RunSetup | None = None) -> Prepared:
    """Resolve and check the workload (clocks before any model is built), build the model in its dtype; `run`: the
    run already resolved (a benchmark sweep's cell, `RunSetup.at`), used as it is."""
    setup = run if run is not None else prepare_run(
        MODEL if workload.model is None else workload.model, workload.device, workload.threads,
        BATCH_SIZE if workload.batch_size is None else workload.batch_size, workload.input_size,
        Host(workload.allocator, workload.require_locked_clocks))
    check_input_memory(setup.batch_size, setup.input_size)
    backend = check_backend(workload.backend, setup.device)
    dtype = resolve_dtype(workload.dtype, setup.device)
    model = create_model(setup.model, setup.input_size, pretrained=pretrained, checkpoint=checkpoint)
    model = model.to(setup.device, dtype)
    geometry = model_geometry(model)
    generator = torch.Generator().manual_seed(workload.seed)
    x = torch.randn(setup.batch_size, 3, *geometry.input_size, generator=generator).to(setup.device, dtype)
    setup = replace(setup, fingerprint=replace(setup.fingerprint, backend=backend_info(backend), dtype=workload.dtype))
    return Prepared(setup, geometry, workload_grid(workload, geometry), model, x)


def trace_meta(prepared: Prepared, workload: Workload, what: str) -> dict:
    """The sidecar of a trace this machine writes (what `pomt.formats.trace.read_sidecar` needs, and more)."""
    geometry, setup = prepared.geometry, prepared.setup
    return {"format": "pomt.trace", "version": 1, "model": geometry.model, "batch_size": setup.batch_size,
            "input_size": list(geometry.input_size), "num_tokens": geometry.num_tokens,
            "prefix_tokens": geometry.prefix_tokens, "depth": geometry.depth, "threads": setup.fingerprint.threads,
            "dtype": workload.dtype, "backend": workload.backend, "order": "shuffled per pass", "measured": what,
            "device": setup.fingerprint.to_dict(), "date": utc_now()}


def open_journal(workload: Workload, prepared: Prepared, name: str, what: str, settings: dict) -> TraceWriter:
    """`<output>/<stem>.<name>.csv`: continued when `resume` and its settings match, else started afresh."""
    keys = {"grid": prepared.grid, "seed": workload.seed, "dtype": workload.dtype, "backend": workload.backend,
            "threads": prepared.setup.fingerprint.threads, "device": prepared.setup.fingerprint.name, **settings}
    path = Path(workload.output_dir) / f"{prepared.setup.stem}.{name}.csv"
    journal = TraceWriter(path, trace_meta(prepared, workload, what), keys, resume=workload.resume)
    prepared.journals.append(journal)
    return journal


@contextmanager
def journalled(prepared: Prepared) -> Iterator[Prepared]:
    """Ctrl-C inside becomes `Interrupted` (with the visits kept for `--resume`) where a journal was opened."""
    try:
        yield prepared
    except Interrupted:
        raise
    except KeyboardInterrupt:
        if not prepared.journals:
            raise
        raise Interrupted.after_visits(sum(len(journal.visits) for journal in prepared.journals)) from None


def live_run(workload: Workload, prepared: Prepared, journal: TraceWriter | None = None) -> MeasurementRun:
    """Measure the model at a token count through the workload's runtime, into the journal (None: not written)."""
    forward_at = live_forwards(prepared.model, prepared.x, backend=workload.backend, threads=workload.threads,
                               cache_dir=Path(workload.output_dir) / prepared.cache_dir)
    source = LiveSource(forward_at, prepared.setup.device, workload.threads, start_s=journal_end_s(journal),
                        backend=workload.backend)
    return MeasurementRun(source, journal)


def settings_keys(settings: object) -> dict:
    """A dataclass of settings as journal keys (a resumed run must have been measured with the same)."""
    return asdict(settings)
