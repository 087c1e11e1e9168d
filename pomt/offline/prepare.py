"""The run made concrete before anything is measured: the workload on this machine with the journal its
search writes to, or the model a recorded trace names with the trace as its source of latency (`--replay`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pomt.device.fingerprint import Fingerprint
from pomt.errors import GridError, SettingError
from pomt.formats.trace import check_trace_geometry, read_trace
from pomt.measurement.search import SearchSettings
from pomt.measurement.sources import ReplaySource, Session
from pomt.models.geometry import Geometry, model_geometry
from pomt.models.registry import architecture, create_model, normalise_input_size, resolve_model_name
from pomt.offline.config import OfflineConfig, check_pruning, needs_accuracy_model
from pomt.workload.prepare import Prepared, Workload, live_session, open_journal, prepare, settings_keys, workload_grid
from pomt.workload.setup import RunSetup


@dataclass(frozen=True)
class Run:
    """A prepared run: the workload made concrete, and where its latency comes from (None: nowhere, as
    for --accuracy-only); `replay` is the trace a replay analyses."""

    prepared: Prepared
    session: Session | None
    replay: Path | None = None

    @property
    def setup(self) -> RunSetup:
        return self.prepared.setup

    @property
    def geometry(self) -> Geometry:
        return self.prepared.geometry


def prepare_run(workload: Workload, config: OfflineConfig, settings: SearchSettings) -> Run:
    """The run `--replay` asks for, else the live one."""
    return prepare_replay(workload, config) if config.replay is not None else prepare_live(workload, config, settings)


def prepare_live(workload: Workload, config: OfflineConfig, settings: SearchSettings) -> Run:
    """Set up measuring on this machine: the workload, weights only when accuracy is measured, the journal."""
    pretrained = config.pretrained
    if pretrained is None:
        pretrained = needs_accuracy_model(config) and config.checkpoint is None
    prepared = prepare(workload, pretrained=pretrained, checkpoint=config.checkpoint)
    check_pruning(config, prepared.geometry)
    if config.accuracy_only:
        return Run(prepared, None)
    journal = open_journal(workload, prepared, "trace", "whole model, tokens truncated after embedding",
                           {"search": config.search, **settings_keys(settings)})
    return Run(prepared, live_session(workload, prepared, journal))


def prepare_replay(workload: Workload, config: OfflineConfig) -> Run:
    """Set up analysing a recorded trace: the model it names (for its geometry), the trace's own counts."""
    trace = read_trace(config.replay)
    meta = trace.meta
    name = resolve_model_name(meta["model"])
    check_replayed_workload(workload, meta, name)
    model = create_model(name, tuple(meta["input_size"]))
    geometry = model_geometry(model)
    check_trace_geometry(trace, geometry.num_tokens, geometry.prefix_tokens, name)
    check_pruning(config, geometry)
    setup = RunSetup(name, "replay", replayed_fingerprint(meta, config.replay), int(meta["batch_size"]),
                     geometry.input_size)
    if geometry.num_tokens not in trace.counts:
        raise GridError(f"trace {config.replay} has no visit at N = {geometry.num_tokens}, the reference")
    grid = [n for n in workload_grid(workload, geometry) if n in set(trace.counts)]
    return Run(Prepared(setup, geometry, grid, model, None), Session(ReplaySource(trace)), config.replay)


def check_replayed_workload(workload: Workload, meta: dict, name: str) -> None:
    """Raise SettingError where the workload asks for another model, batch, input size, device kind, thread
    count, dtype or runtime than the trace's (a setting left at its default asks nothing): a replay analyses
    what was recorded, and would otherwise answer another question than the one asked."""
    recorded, default = meta.get("device") if isinstance(meta.get("device"), dict) else {}, Workload()
    asked = {
        "--model": (None if workload.model is None else architecture(workload.model), architecture(name)),
        "--batch-size": (workload.batch_size, int(meta["batch_size"])),
        "--input-size": (normalise_input_size(workload.input_size), tuple(meta["input_size"])),
        "--device": (None if workload.device == default.device else workload.device.split(":")[0].strip().lower(),
                     recorded.get("kind") or "cpu"),
        "--threads": (workload.threads, recorded.get("threads", meta.get("threads"))),
        "--dtype": (None if workload.dtype == default.dtype else workload.dtype, meta.get("dtype", default.dtype)),
        "--backend": (None if workload.backend == default.backend else workload.backend,
                      meta.get("backend", default.backend)),
    }
    clashes = [f"{flag} {mine if not isinstance(mine, tuple) else 'x'.join(map(str, mine))} (the trace's: "
               f"{theirs if not isinstance(theirs, tuple) else 'x'.join(map(str, theirs))})"
               for flag, (mine, theirs) in asked.items() if None not in (mine, theirs) and mine != theirs]
    if clashes:
        raise SettingError(f"--replay analyses the recorded workload, not {', '.join(clashes)}: leave those out, "
                           "or measure anew without --replay")


def replayed_fingerprint(meta: dict, path: Path) -> Fingerprint:
    """The fingerprint a trace's sidecar recorded (the few facts of an older sidecar without one), and
    where it was replayed from."""
    recorded = meta.get("device") if isinstance(meta.get("device"), dict) else {
        "kind": "cpu", "name": meta.get("cpu"), "threads": meta.get("threads"), "torch": meta.get("torch"),
        "timm": meta.get("timm"),
    }
    return Fingerprint.from_dict({**recorded, "replayed_from": str(path)})
