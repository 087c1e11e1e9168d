"""Atomic file writes: a file, or a set of files (`staged_set`), is fully written or not there at all."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 text atomically (see `atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write bytes to a temporary file in the same folder, fsync it, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, data: object) -> Path:
    """Write JSON (indented, trailing newline) atomically."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def atomic_write_csv(path: str | Path, rows: Iterable[dict], columns: Sequence[str]) -> Path:
    """Write rows (dicts) as CSV with the given column order, atomically."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return atomic_write_text(path, buffer.getvalue())


def atomic_save_figure(path: str | Path, figure) -> Path:
    """Save a matplotlib figure as PNG atomically (rendered in memory, then `atomic_write_bytes`)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    return atomic_write_bytes(path, buffer.getvalue())


STAGING = ".staging"  # suffix of the hidden folder a set is staged in
COMMIT = "COMMIT"  # the staged set is whole: its file names, in the order they are moved into place


def staging_folder(folder: str | Path, name: str) -> Path:
    """The hidden folder in `folder` where the set `name` is staged."""
    return Path(folder) / f".{name}{STAGING}"


@contextmanager
def staged_set(folder: str | Path, name: str, last: Sequence[str] = ()) -> Iterator[Path]:
    """Write a set of files as a whole into the yielded staging folder; on leaving, a COMMIT marker lists them and
    they are moved into `folder`, the names in `last` last (Ctrl-C waits). A run killed before the marker leaves the
    previous set, one killed while moving is completed by the next `clear_stale`; a staging error removes the folder."""
    staging = staging_folder(folder, name)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    names = sorted((p.name for p in staging.iterdir() if not p.name.startswith(".")),
                   key=lambda n: (n in last, last.index(n) if n in last else 0, n))
    with sigint_held():
        atomic_write_text(staging / COMMIT, "\n".join(names) + "\n")
        _move_committed(staging)


@contextmanager
def staged_folder(root: str | Path) -> Iterator[Path]:
    """Build a whole folder in the yielded hidden folder beside `root`; on leaving it replaces `root` (a half-built
    one included); an error removes it and leaves `root` as it was."""
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}."))
    try:
        yield staging
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def clear_stale(folder: str | Path, name: str) -> None:
    """Clear what a killed writer of the set `name` left in `folder`: finish a committed set, remove the rest."""
    folder = Path(folder)
    staging = staging_folder(folder, name)
    if (staging / COMMIT).is_file():
        _move_committed(staging)
    shutil.rmtree(staging, ignore_errors=True)
    if folder.is_dir():
        for stale in folder.glob(f".{name}*.tmp"):
            stale.unlink(missing_ok=True)


def _move_committed(staging: Path) -> None:
    """Move a committed set's files (those still staged) into the folder above, in the marker's order."""
    for file_name in (staging / COMMIT).read_text(encoding="utf-8").split():
        staged = staging / file_name
        if staged.exists():
            os.replace(staged, staging.parent / file_name)
    shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def sigint_held() -> Iterator[None]:
    """Ctrl-C held back (raised on leaving) in the main thread, for writes that must happen together or not at all."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(*caught[0])
