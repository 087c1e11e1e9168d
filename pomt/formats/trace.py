"""Latency traces on disk: `NAME.csv` with one row per timed forward (`tokens,pass,rep,t_s,ms`) and a `NAME.json`
sidecar describing how it was taken. Consecutive rows of one count starting at `rep == 0` form a *visit*: `reps`
timed forwards, after an untimed one where the runtime needed it. `pomt record` writes dense traces; the offline
computation writes its measurements in the same format (so a run can be resumed, and re-analysed with `--replay`)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pomt.errors import TraceError
from pomt.io import atomic_write_bytes, atomic_write_json, sigint_held

COLUMNS = ("tokens", "pass", "rep", "t_s", "ms")
SIDECAR_REQUIRED = ("model", "batch_size", "input_size", "num_tokens", "prefix_tokens")


@dataclass(frozen=True)
class Visit:
    """`reps` timed forwards at one token count, back to back (after an untimed one where the runtime needed it)."""

    tokens: int
    pass_index: int
    t_s: float  # seconds since the trace started, at the visit's first timed forward
    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        ordered = sorted(self.samples_ms)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])

    def rows(self) -> list[tuple[int, int, int, float, float]]:
        """CSV rows; each forward's time is the visit's start plus the forwards before it."""
        times, t = [], self.t_s
        for ms in self.samples_ms:
            times.append(t)
            t += ms / 1e3
        return [(self.tokens, self.pass_index, rep, times[rep], ms) for rep, ms in enumerate(self.samples_ms)]


@dataclass(frozen=True)
class Trace:
    """A trace in memory: its visits in the order they were taken and the sidecar's description."""

    visits: tuple[Visit, ...]
    meta: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def counts(self) -> list[int]:
        return sorted({v.tokens for v in self.visits})

    @property
    def num_tokens(self) -> int:
        return int(self.meta["num_tokens"])

    @property
    def prefix_tokens(self) -> int:
        return int(self.meta["prefix_tokens"])

    @property
    def device_kind(self) -> str:
        """cpu, cuda...: what the trace was measured on (cpu for an older sidecar that names no device)."""
        device = self.meta.get("device")
        return (device.get("kind") if isinstance(device, dict) else None) or "cpu"

    @property
    def backend(self) -> str:
        """The runtime the trace was measured in (eager for an older sidecar that names none)."""
        return str(self.meta.get("backend", "eager"))

    def samples(self) -> int:
        return sum(len(v.samples_ms) for v in self.visits)


def sidecar_path(csv_path: str | Path) -> Path:
    return Path(csv_path).with_suffix(".json")


def _number(text: str, kind: type, where: str) -> float | int:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {text!r} is not a number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise TraceError(f"{where}: {text!r} is not finite")
    return value


def group_visits(rows: Iterable[tuple[int, int, int, float, float]]) -> list[Visit]:
    """Rows in file order -> visits: a new visit starts at rep 0 or when the count or pass changes."""
    visits: list[Visit] = []
    current: list[tuple[int, int, int, float, float]] = []

    def flush() -> None:
        if current:
            tokens, pass_index, _, t_s, _ = current[0]
            visits.append(Visit(tokens, pass_index, t_s, tuple(r[4] for r in current)))
            current.clear()

    for row in rows:
        if current and (row[2] == 0 or row[0] != current[0][0] or row[1] != current[0][1]):
            flush()
        current.append(row)
    flush()
    return visits


def parse_rows(text: str, name: str) -> list[tuple[int, int, int, float, float]]:
    """Validated rows of a trace CSV (header first); a truncated last line is dropped."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]  # a run killed in the middle of a line
    try:
        table = list(csv.reader(lines))
    except csv.Error as exc:  # a cell beyond the csv module's field limit, an unclosed quote
        raise TraceError(f"{name} is not a latency trace: {exc}") from None
    header = table[0] if table else None
    if header is None or [h.strip() for h in header[: len(COLUMNS)]] != list(COLUMNS):
        raise TraceError(f"{name} is not a latency trace: the header must start with {','.join(COLUMNS)}")
    rows = []
    for number, cells in enumerate(table[1:], start=2):
        if not cells:
            continue
        if len(cells) < len(COLUMNS):
            raise TraceError(f"{name} line {number}: expected {len(COLUMNS)} values, got {len(cells)}")
        where = f"{name} line {number}"
        tokens, pass_index, rep = (_number(c, int, where) for c in cells[:3])
        t_s, ms = (_number(c, float, where) for c in cells[3:5])
        if tokens < 1 or rep < 0 or pass_index < 0 or ms <= 0:
            raise TraceError(f"{where}: tokens >= 1, pass >= 0, rep >= 0 and ms > 0 are required")
        rows.append((tokens, pass_index, rep, t_s, ms))
    return rows


def read_sidecar(csv_path: str | Path) -> dict:
    """The trace's JSON description, validated for the fields every reader needs."""
    path = sidecar_path(csv_path)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TraceError(f"trace sidecar not found: {path} (every trace CSV needs its JSON beside it)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: JSON's, huge numbers'
        raise TraceError(f"corrupt trace sidecar {path}: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    if not isinstance(meta, dict):
        raise TraceError(f"corrupt trace sidecar {path}: expected a JSON object")
    missing = [key for key in SIDECAR_REQUIRED if key not in meta]
    if missing:
        raise TraceError(f"trace sidecar {path} lacks {', '.join(missing)}")
    size = meta["input_size"]
    size = [size, size] if isinstance(size, int) else size
    whole = [meta["batch_size"], *(size if isinstance(size, list) else []), meta["num_tokens"], meta["prefix_tokens"]]
    checks = [
        isinstance(meta["model"], str) and meta["model"],
        isinstance(meta["batch_size"], int) and meta["batch_size"] >= 1,
        isinstance(size, list) and len(size) == 2 and all(isinstance(s, int) and s > 0 for s in size),
        isinstance(meta["num_tokens"], int) and isinstance(meta["prefix_tokens"], int),
        not any(isinstance(value, bool) for value in whole),  # JSON's true is no count
    ]
    if not all(checks) or not 0 <= meta["prefix_tokens"] < meta["num_tokens"]:
        raise TraceError(f"trace sidecar {path}: model, batch_size, input_size, num_tokens or prefix_tokens is invalid")
    return {**meta, "input_size": size}


def read_trace(path: str | Path) -> Trace:
    """Read and validate a trace CSV and its sidecar; every problem is one TraceError line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"trace not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from None
    meta = read_sidecar(path)
    visits = group_visits(parse_rows(text, str(path)))
    if not visits:
        raise TraceError(f"trace {path} holds no measurements")
    low, high = meta["prefix_tokens"] + 1, meta["num_tokens"]
    outside = sorted({v.tokens for v in visits if not low <= v.tokens <= high})
    if outside:
        raise TraceError(f"trace {path} has token counts outside [{low}, {high}] (its sidecar's N): {outside[:3]}")
    return Trace(tuple(visits), meta, path)


def check_trace_geometry(trace: Trace, num_tokens: int, prefix_tokens: int, model: str) -> None:
    """Raise TraceError when the trace's sidecar disagrees with the model it names."""
    theirs = (trace.num_tokens, trace.prefix_tokens)
    if theirs != (num_tokens, prefix_tokens):
        raise TraceError(
            f"trace {trace.path} says N={theirs[0]}, prefix={theirs[1]} but {model} at its input size has "
            f"N={num_tokens}, prefix={prefix_tokens}"
        )


def inject_steps(trace: Trace, factors: Mapping[int, float]) -> Trace:
    """A copy of the trace with every sample at tokens > k multiplied by factors[k]: steps whose truth is known."""

    def scale(tokens: int) -> float:
        return math.prod(f for k, f in factors.items() if tokens > k)

    visits = tuple(
        Visit(v.tokens, v.pass_index, v.t_s, tuple(ms * scale(v.tokens) for ms in v.samples_ms))
        for v in trace.visits
    )
    return Trace(visits, {**trace.meta, "injected": {str(k): f for k, f in factors.items()}}, trace.path)


class TraceWriter:
    """Append visits to a trace CSV durably (one write and fsync per visit) beside its sidecar.

    With `resume`, an existing trace whose sidecar `settings` equal these is continued: `visits` holds what it already
    has (a half-written last line is cut off); otherwise the trace starts afresh."""

    def __init__(self, path: str | Path, meta: dict, settings: dict, resume: bool = False):
        self.path = Path(path)
        self.meta = {**meta, "settings": _jsonable(settings)}
        self.visits: list[Visit] = []
        self._ends: list[int] = []  # byte offset after each visit's rows
        if resume and self.path.exists():
            self._continue()
        else:
            atomic_write_bytes(self.path, ",".join(COLUMNS).encode() + b"\n")  # replaces an old trace whole
            atomic_write_json(sidecar_path(self.path), self.meta)

    def _continue(self) -> None:
        try:
            stored = read_sidecar(self.path).get("settings")
        except TraceError:
            stored = None
        if stored != self.meta["settings"]:
            if not isinstance(stored, dict):
                raise TraceError(f"{self.path} is not a resumable pomt trace; delete it or drop --resume")
            keys = sorted(k for k in set(stored) | set(self.meta["settings"])
                          if stored.get(k) != self.meta["settings"].get(k))
            diffs = ", ".join(f"{k}={stored.get(k)!r} (now {self.meta['settings'].get(k)!r})" for k in keys)
            raise TraceError(f"{self.path} was measured with other settings: {diffs}; delete it or drop --resume")
        data = self.path.read_bytes()
        keep = data[: data.rfind(b"\n") + 1]  # cut a half-written last line
        rows = parse_rows(keep.decode("utf-8"), str(self.path))
        self.visits = group_visits(rows)
        offset = keep.index(b"\n") + 1
        counts = [len(v.samples_ms) for v in self.visits]
        lines = keep[offset:].split(b"\n")
        for count in counts:
            offset += sum(len(line) + 1 for line in lines[:count])
            lines = lines[count:]
            self._ends.append(offset)
        with self.path.open("r+b") as handle:
            handle.truncate(len(keep))

    def truncate(self, keep_visits: int) -> None:
        """Forget every visit after the first `keep_visits` (a resumed run diverged from the journal)."""
        end = self._ends[keep_visits - 1] if keep_visits else self.path.read_bytes().index(b"\n") + 1
        with self.path.open("r+b") as handle:
            handle.truncate(end)
        del self.visits[keep_visits:]
        del self._ends[keep_visits:]

    def add(self, visit: Visit) -> Visit:
        """Append one visit; returns it as stored (rounded), so a run and its resumption see the same numbers."""
        stored = rounded(visit)
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        for tokens, pass_index, rep, t_s, ms in stored.rows():
            writer.writerow([tokens, pass_index, rep, f"{t_s:.4f}", f"{ms:.4f}"])
        with sigint_held():  # Ctrl-C finds the visit in the file and counted, or in neither
            self._write_bytes(buffer.getvalue().encode())
            self.visits.append(stored)
            self._ends.append(self.path.stat().st_size)
        return stored

    def _write_bytes(self, data: bytes) -> None:
        with self.path.open("ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def update_meta(self, **extra) -> None:
        """Add facts learned during the run (e.g. the measured drift) to the sidecar, atomically."""
        self.meta.update(_jsonable(extra))
        atomic_write_json(sidecar_path(self.path), self.meta)


def rounded(visit: Visit) -> Visit:
    """The visit at the precision a trace file keeps (0.1 microsecond)."""
    return Visit(visit.tokens, visit.pass_index, round(visit.t_s, 4), tuple(round(ms, 4) for ms in visit.samples_ms))


def _jsonable(data: dict) -> dict:
    return json.loads(json.dumps(data, sort_keys=True, default=str))
