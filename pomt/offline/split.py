"""The offline computation in three steps, each writing the file the next reads: on the device, the latency model
(`<stem>.latency.json`: the search's visits, the reducers' costs, the fingerprint); anywhere, the frontier search
priced on it with accuracy measured there, spread over a torchrun job's ranks (`<stem>.candidates.json` and the
frontier's files, unverified); on the device again, the verification of the candidates (the run's usual files and
schedule). Each later step serves the latency search its recorded visits in order, so it finds the curve the device
measured and the split ships what one run ships."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from pomt.device.fingerprint import Fingerprint, fingerprint_hash
from pomt.errors import LatencyFileError, SettingError, TraceError
from pomt.formats.trace import TraceWriter, sidecar_path
from pomt.frontier.candidates import Candidate
from pomt.frontier.certify import Certification, Certifier
from pomt.frontier.choice import Evaluated
from pomt.frontier.distributed import check_same_images, join_from_env, leave_group
from pomt.frontier.latency import MixedCounts, ReducerCost
from pomt.frontier.report import write_frontier
from pomt.frontier.search import FrontierResult
from pomt.io import atomic_write_json, atomic_write_text
from pomt.measurement.search import SearchSettings
from pomt.measurement.sources import MeasurementRun
from pomt.models.registry import resolve_model_name
from pomt.offline.choose import (
    FrontierFound,
    costs_path,
    find_frontier,
    latency_model,
    prepare_frontier,
    reducer_costs,
)
from pomt.offline.config import OfflineConfig, Request, max_remove, validate
from pomt.offline.measure import Run, accuracy_sample, check_replayed_workload, measure_latency, prepare_live
from pomt.offline.pipeline import Calibrated, OfflineResult, conclude_frontier, frontier_result
from pomt.offline.write import output_names
from pomt.stats import Proportion
from pomt.workload.prepare import Workload, journalled, prepare, settings_keys

LATENCY, CANDIDATES, VERSION = "pomt.latency", "pomt.candidates", 1


def reach(config: OfflineConfig, run: Run) -> int:
    """The kept tokens from which the latency search examines candidate steps first (the frontier's: all)."""
    return run.geometry.num_tokens - max_remove(config, run.geometry, True)


def measure_step(workload: Workload, config: OfflineConfig, settings: SearchSettings) -> Path:
    """On the device: the latency curve and the reducers' costs, written as `<stem>.latency.json`."""
    request = Request(workload, config, settings)
    validate(config, settings)
    workload.check()
    if config.replay is not None:
        raise SettingError("pomt measure times this device; --replay analyses a trace: give one or the other")
    run = prepare_live(workload, config, settings)
    with journalled(run.prepared):
        latency = measure_latency(request, run, reach(config, run))
        costs, mixed, notes = reducer_costs(request, run)
    trace = latency.trace
    fingerprint = run.setup.fingerprint
    bundle = {"format": LATENCY, "version": VERSION, "stem": run.setup.stem, "model": run.geometry.model,
              "batch_size": run.setup.batch_size, "input_size": list(run.geometry.input_size),
              "dtype": workload.dtype, "backend": workload.backend, "device": run.setup.device,
              "threads": workload.threads, "seed": workload.seed, "fingerprint": fingerprint.to_dict(),
              "fingerprint_hash": fingerprint_hash(fingerprint), "search": config.search,
              "settings": settings_keys(settings), "trace": trace.read_text(encoding="utf-8"),
              "trace_sidecar": json.loads(sidecar_path(trace).read_text(encoding="utf-8")),
              "reducer_costs": {m: c.to_dict() for m, c in costs.items()},
              "mixed_counts": None if mixed is None else mixed.to_dict(), "notes": list(notes),
              "seconds": {"latency": round(latency.seconds, 2)}}
    return atomic_write_json(Path(workload.output_dir) / f"{run.setup.stem}.latency.json", bundle)


def read_bundle(path: str | Path, kind: str = LATENCY) -> dict:
    """A latency (or candidates) file, checked: one LatencyFileError line where it is not one of this version."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LatencyFileError(f"{path} not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LatencyFileError(f"{path} is not a readable {kind} file ({error}); measure it again") from None
    if not isinstance(data, dict) or data.get("format") != kind:
        raise LatencyFileError(f"{path} is not a {kind} file")
    if data.get("version") != VERSION:
        raise LatencyFileError(f"{path} is a {kind} file of version {data.get('version')!r}; this pomt reads "
                               f"version {VERSION}: measure it again with this pomt")
    needed = ("stem", "model", "batch_size", "input_size", "trace", "trace_sidecar", "fingerprint_hash", "settings")
    missing = [k for k in needed if k not in (data if kind == LATENCY else data.get("latency", {}))]
    if missing:
        raise LatencyFileError(f"{path} lacks {', '.join(missing)}: it is corrupt; measure it again")
    return data


def serve_visits(bundle: dict, output_dir: Path) -> Path:
    """The bundle's trace (and its reducers' costs) written where a resumed run reads them; the trace's path."""
    trace = output_dir / f"{bundle['stem']}.trace.csv"
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(trace, bundle["trace"])
    atomic_write_json(sidecar_path(trace), bundle["trace_sidecar"])
    if bundle.get("mixed_counts") is not None:
        atomic_write_json(costs_path(output_dir, bundle["stem"]),
                          {"reducers": bundle["reducer_costs"], "mixed_counts": bundle["mixed_counts"]})
    return trace


class RecordedOnly:
    """A latency source that holds only what the device recorded: asked for any other visit, it says so."""

    def visit(self, tokens: int, reps: int, pass_index: int):
        raise LatencyFileError(f"the latency file holds no visit of {tokens} tokens in pass {pass_index}: the search "
                               "asked for one the device did not measure (other search settings?); measure again")


def recorded_run(bundle: dict, workload: Workload, config: OfflineConfig, device: str) -> Run:
    """The bundle's workload with the model on `device` for accuracy, its latency served from the recorded visits."""
    trace = serve_visits(bundle, Path(workload.output_dir))
    pretrained = config.checkpoint is None if config.pretrained is None else config.pretrained
    prepared = prepare(replace(workload, device=device), checkpoint=config.checkpoint, pretrained=pretrained)
    setup = replace(prepared.setup, device=bundle["device"], fingerprint=Fingerprint.from_dict(bundle["fingerprint"]))
    prepared = replace(prepared, setup=setup, x=None)
    journal = TraceWriter(trace, bundle["trace_sidecar"], bundle["trace_sidecar"]["settings"], resume=True)
    return Run(prepared, MeasurementRun(RecordedOnly(), journal))


def workload_of(bundle: dict, workload: Workload) -> Workload:
    """`workload` (where it writes, its progress) running the bundle's workload; one asked otherwise is refused."""
    check_replayed_workload(replace(workload, device=Workload().device), bundle["trace_sidecar"],
                            resolve_model_name(bundle["model"]))
    return replace(workload, model=bundle["model"], batch_size=bundle["batch_size"],
                   input_size=tuple(bundle["input_size"]), dtype=bundle["dtype"], backend=bundle["backend"],
                   threads=bundle["threads"], seed=bundle["seed"], resume=True)


def search_step(latency_file: Path, workload: Workload, config: OfflineConfig, device: str = "cpu") -> Path:
    """Anywhere: the frontier search on the latency file with accuracy on `device` (each rank of a torchrun job
    one shard); rank 0 writes `<stem>.candidates.json` and the frontier's files, unverified."""
    bundle = read_bundle(latency_file)
    workload = workload_of(bundle, workload)
    settings = SearchSettings(**bundle["settings"])
    request = Request(workload, replace(config, search=bundle["search"], verify=False), settings)
    validate(request.config, settings)
    ranks = join_from_env(device)
    run = recorded_run(bundle, workload, request.config, device)
    sample = accuracy_sample(workload, request.config, run)
    if sample is None:
        raise SettingError("pomt search measures accuracy: give --dataset-root")
    setup = prepare_frontier(workload, request.config, run, sample, sharded=ranks.size > 1)
    check_same_images(setup.calibration.split_ids, ranks)
    latency = measure_latency(request, run, reach(request.config, run))
    found = find_frontier(request, run, setup, latency)
    chosen = conclude_frontier(request, run, Calibrated.of(setup), latency, found)
    folder = Path(workload.output_dir)
    path = folder / f"{bundle['stem']}.candidates.json"
    if ranks.rank == 0:
        write_frontier(folder, output_names(bundle["stem"]), chosen.report)
        document = {"format": CANDIDATES, "version": VERSION, "latency": bundle,
                    "latency_sha256": hashlib.sha256(Path(latency_file).read_bytes()).hexdigest(),
                    "calibrated": Calibrated.of(setup).to_dict(), "found": found_to_dict(found)}
        atomic_write_json(path, document)
    leave_group()
    return path


def found_to_dict(found: FrontierFound) -> dict:
    """What verification needs of the search: its result, what to verify, the certification, the times."""
    certification = found.certification
    return {"result": found.result.to_dict(), "shippable": [p.candidate.key for p in found.shippable],
            "uniform": None if found.uniform is None else found.uniform.candidate.key,
            "to_verify": [p.candidate.key for p in found.to_verify], "reps": found.reps, "measured": found.measured,
            "seconds": found.seconds, "notes": list(found.notes),
            "certifier": None if certification is None else vars(certification.certifier),
            "finalists": [] if certification is None else [p.candidate.key for p in certification.finalists]}


def evaluated_of(data: dict) -> Evaluated:
    """An `Evaluated.to_dict` read back."""
    held = data.get("held_out")
    return Evaluated(Candidate.from_dict(data), data["family"], float(data["predicted_ms"]),
                     Proportion.from_dict(data["search"]), None if held is None else Proportion.from_dict(held))


def found_of(data: dict, latency_model) -> FrontierFound:
    """`found_to_dict` read back, priced by `latency_model`."""
    result = data["result"]
    evaluated = tuple(evaluated_of(e) for e in result["evaluated"])
    by_key = {e.candidate.key: e for e in evaluated}
    baseline = evaluated_of(result["baseline"])
    by_key.setdefault(baseline.candidate.key, baseline)
    frontier = tuple(by_key[k] for k in result["frontier"])
    found = FrontierResult(baseline, evaluated, frontier, result["evals"], tuple(result["notes"]))
    certification = None if data["certifier"] is None else Certification(
        Certifier(**data["certifier"]), tuple(by_key[k] for k in data["finalists"]))
    return FrontierFound(found, latency_model, tuple(by_key[k] for k in data["shippable"]),
                         None if data["uniform"] is None else by_key[data["uniform"]], data["reps"],
                         data["measured"], data["seconds"], tuple(data["notes"]),
                         tuple(by_key[k] for k in data["to_verify"]), certification)


def verify_step(candidates_file: Path, workload: Workload, config: OfflineConfig) -> OfflineResult:
    """On the device: the candidates verified here and in a fresh process, and the run's files written; a file
    measured on another device, model, batch, input size, dtype or runtime is refused in one line."""
    document = read_bundle(candidates_file, CANDIDATES)
    bundle = document["latency"]
    workload = workload_of(bundle, workload)
    settings = SearchSettings(**bundle["settings"])
    request = Request(workload, replace(config, search=bundle["search"]), settings)
    serve_visits(bundle, Path(workload.output_dir))
    try:
        run = prepare_live(workload, request.config, settings)
    except TraceError as error:
        raise LatencyFileError(f"{candidates_file}: {error}") from None
    here = fingerprint_hash(run.setup.fingerprint)
    if here != bundle["fingerprint_hash"] or run.setup.stem != bundle["stem"]:
        raise LatencyFileError(f"{candidates_file} was priced on another device or workload ({bundle['stem']}, "
                               f"device {bundle['fingerprint_hash']}; here {run.setup.stem}, device {here}): verify "
                               "it where its latency file was measured")
    with journalled(run.prepared):
        latency = measure_latency(request, run, reach(request.config, run))
        costs = {m: ReducerCost.from_dict(c) for m, c in bundle["reducer_costs"].items()}
        mixed = None if bundle["mixed_counts"] is None else MixedCounts.from_dict(bundle["mixed_counts"])
        found = found_of(document["found"], latency_model(run.geometry, latency, costs, mixed))
        chosen = conclude_frontier(request, run, Calibrated.from_dict(document["calibrated"]), latency, found)
        paths = {} if latency.trace is None else {"trace": latency.trace}
        return frontier_result(request, run, chosen, paths)
