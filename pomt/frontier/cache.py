"""Accuracies by (split, candidate) for one model in a SQLite file that many processes share: the ranks of a job,
searches for several devices, runs side by side; what was committed survives a kill.

The file is in WAL mode: readers never wait for the writer, and each `add` is one committed transaction. `get` reads
the file, so what another process wrote since is seen. A result over fewer images (a candidate stopped early)
never replaces one over more of the same (split, key). Each result keeps the `origin` that first measured it (a
search's latency curve), so a search can start from what others measured (`known`).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple, TypeVar

from pomt.errors import AccuracyCacheError
from pomt.frontier.candidates import Candidate
from pomt.stats import Proportion

FORMAT = "pomt.accuracy-cache"
VERSION = 2
BUSY_SECONDS = 60.0  # how long one statement waits for another process's lock
ATTEMPTS = 5  # of a transaction still locked out after BUSY_SECONDS
SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE results (split TEXT NOT NULL, key TEXT NOT NULL, method TEXT NOT NULL, removal TEXT NOT NULL, "
    "correct INTEGER NOT NULL, images INTEGER NOT NULL, lost INTEGER, gained INTEGER, written_at REAL NOT NULL, "
    "origin TEXT NOT NULL, PRIMARY KEY (split, key))",
)
UPSERT = ("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (split, key) DO UPDATE SET "
          "(method, removal, correct, images, lost, gained, written_at) = (excluded.method, excluded.removal, "
          "excluded.correct, excluded.images, excluded.lost, excluded.gained, excluded.written_at) "
          "WHERE excluded.images >= results.images")
SELECT = "SELECT correct, images, lost, gained FROM results WHERE split = ? AND key = ?"
KNOWN = "SELECT method, removal, correct, images, lost, gained FROM results WHERE split = ? AND origin != ?"
_FORKED: list[sqlite3.Connection] = []  # a parent's connections in a forked child: kept, never used nor closed
T = TypeVar("T")


class Held(NamedTuple):
    """An in-memory cache's entry: the candidate, its result, the origin that first measured it."""

    candidate: Candidate
    result: Proportion
    origin: str


def canonical_json(data: object) -> str:
    """One text for equal data: sorted keys, no spaces."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def default_cache_path(root: Path, identity: Mapping) -> Path:
    """The cache file of a model under `root`: named by the model and its weights, so their runs share it."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", str(identity["model"])).strip("._") or "model"
    return Path(root) / "accuracy" / f"{slug}-{identity['weights']}.sqlite"


def differences(stored: Mapping, now: Mapping) -> str:
    """The fields in which two identities differ, each with both values."""
    keys = sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))
    return ", ".join(f"{k} {stored.get(k)!r}, now {now.get(k)!r}" for k in keys)


class AccuracyCache:
    """Accuracies by (candidate, split) for one model (`model_identity`: another's is refused), in a SQLite file
    shared safely between processes (`path` None: in memory only)."""

    def __init__(self, path: str | Path | None, identity: Mapping) -> None:
        self.path = None if path is None else Path(path)
        self.identity = dict(identity)
        self._memory: dict[tuple[str, str], Held] | None = {} if self.path is None else None
        self._db: sqlite3.Connection | None = None
        if self.path is not None:
            self._open()

    def _open(self) -> None:
        """Connect to the file, created (with its folder) when missing, and check it."""
        if self.path.is_dir():
            raise AccuracyCacheError(f"accuracy cache {self.path} is a folder; choose a file path for the cache")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as error:
            raise AccuracyCacheError(f"accuracy cache {self.path} cannot be opened ({error}); "
                                     "choose another cache file") from None
        self._pid, self._lock = os.getpid(), threading.Lock()
        try:
            self._run(lambda db: self._transaction(db, self._check))
            self._run(lambda db: db.execute("PRAGMA journal_mode = WAL"))
            self._db.execute("PRAGMA synchronous = NORMAL")  # a commit survives a kill; a power cut may lose the last
        except BaseException:
            self._db.close()
            raise

    def _check(self, db: sqlite3.Connection) -> None:
        """Write the header into an empty database, or check a database's header against this model."""
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        stored = canonical_json(self.identity)
        if not tables:
            for statement in SCHEMA:
                db.execute(statement)
            db.executemany("INSERT INTO meta VALUES (?, ?)",
                           [("format", FORMAT), ("version", str(VERSION)), ("identity", stored)])
            return
        meta = dict(db.execute("SELECT name, value FROM meta")) if {"meta", "results"} <= tables else {}
        if meta.get("format") != FORMAT:
            raise AccuracyCacheError(f"{self.path} is a SQLite file but not a pomt accuracy cache; "
                                     "choose another cache file")
        if meta.get("version") != str(VERSION):
            raise AccuracyCacheError(f"accuracy cache {self.path} is of version {meta.get('version')}, this pomt "
                                     f"reads version {VERSION}; delete it or choose another cache file")
        found, now = json.loads(meta.get("identity") or "{}"), json.loads(stored)
        if found != now:
            raise AccuracyCacheError(f"accuracy cache {self.path} belongs to another model "
                                     f"({differences(found, now)}); delete it or choose another cache file")

    @staticmethod
    def _transaction(db: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` in one transaction holding the write lock from its start, committed; rolled back if it fails."""
        db.execute("BEGIN IMMEDIATE")
        try:
            out = work(db)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return out

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work(connection)`, one at a time, tried again while another process holds the lock; a SQLite failure
        as AccuracyCacheError."""
        if self._pid != os.getpid():  # a connection must not cross a fork: a forked child opens its own
            _FORKED.append(self._db)
            self._open()
        for attempt in range(ATTEMPTS):
            try:
                with self._lock:
                    return work(self._db)
            except sqlite3.OperationalError as error:
                if not ("locked" in str(error) or "busy" in str(error)):
                    raise AccuracyCacheError(f"accuracy cache {self.path} cannot be used ({error}); "
                                             "choose another cache file") from None
                if attempt + 1 == ATTEMPTS:
                    raise AccuracyCacheError(f"accuracy cache {self.path} stayed locked by another process; "
                                             "run again once it has finished") from None
                time.sleep(0.05 * (attempt + 1))
            except (sqlite3.DatabaseError, ValueError) as error:  # not a database, or a malformed one
                raise AccuracyCacheError(f"{self.path} is not SQLite or is corrupt ({error}); "
                                         "delete it or choose another cache file") from None
        raise AssertionError("unreachable")

    def get(self, candidate: Candidate, split: str) -> Proportion | None:
        """The result held for `candidate` on `split`, as the file holds it now; None if there is none."""
        if self._memory is not None:
            held = self._memory.get((split, candidate.key))
            return None if held is None else held.result
        row = self._run(lambda db: db.execute(SELECT, (split, candidate.key)).fetchone())
        return None if row is None else Proportion(*row)

    def add(self, candidate: Candidate, split: str, result: Proportion, origin: str = "") -> Proportion:
        """Record one result, committed before returning; the result held afterwards (one over more images stays,
        and the origin that first measured it)."""
        if self._memory is not None:
            held = self._memory.get((split, candidate.key))
            if held is None or result.trials >= held.result.trials:
                held = Held(candidate, result, origin if held is None else held.origin)
                self._memory[(split, candidate.key)] = held
            return held.result
        row = (split, candidate.key, candidate.method, canonical_json(candidate.to_dict()["removal"]),
               result.successes, result.trials, result.lost, result.gained, time.time(), origin)

        def write(db: sqlite3.Connection) -> tuple:
            db.execute(UPSERT, row)
            return db.execute(SELECT, (split, candidate.key)).fetchone()

        return Proportion(*self._run(lambda db: self._transaction(db, write)))

    def known(self, split: str, exclude_origin: str) -> dict[Candidate, Proportion]:
        """Every result held on exactly `split` that an origin other than `exclude_origin` measured first."""
        if self._memory is not None:
            return {h.candidate: h.result for (s, _), h in self._memory.items()
                    if s == split and h.origin != exclude_origin}
        rows = self._run(lambda db: db.execute(KNOWN, (split, exclude_origin)).fetchall())
        return {Candidate.from_dict({"method": method, "removal": json.loads(removal)}): Proportion(*counts)
                for method, removal, *counts in rows}

    def __len__(self) -> int:
        if self._memory is not None:
            return len(self._memory)
        return self._run(lambda db: db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def __getstate__(self) -> dict:
        """Pickled as its path and identity (a copy of the entries in memory): unpickling opens the file again."""
        return {"path": self.path, "identity": self.identity, "memory": self._memory}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["identity"])
        self._memory = state["memory"]
