"""Accuracies by (split, candidate) for one model in a SQLite file that many processes share: the ranks of a job,
searches for several devices, runs side by side; what was committed survives a kill.

The file is in WAL mode: readers never wait for the writer, and each `add` is one committed transaction. `get` reads
the file, so what another process wrote since is seen. A result over fewer images (a candidate stopped early)
never replaces one over more of the same (split, key). Each result keeps the `origin` that first measured it (a
search's latency curve), so a search can start from what others measured (`known`): what they had measured when that
origin first asked, so a resumed search starts alike. The unpruned model's top-1 class of each image of a split
(`classes`), which every result on it is counted against, is kept once per split.
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

import numpy as np

from pomt.errors import AccuracyCacheError
from pomt.frontier.candidates import Candidate
from pomt.stats import Proportion

FORMAT = "pomt.accuracy-cache"
VERSION = 3
MIGRATES = {"2": (  # from version: what to add
    "CREATE TABLE classes (split TEXT PRIMARY KEY, classes BLOB NOT NULL)",
    "CREATE TABLE origins (origin TEXT PRIMARY KEY, seen_upto INTEGER NOT NULL)",
)}
BUSY_SECONDS = 60.0  # how long one statement waits for another process's lock
ATTEMPTS = 5  # of a transaction still locked out after BUSY_SECONDS
SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE results (split TEXT NOT NULL, key TEXT NOT NULL, method TEXT NOT NULL, removal TEXT NOT NULL, "
    "correct INTEGER NOT NULL, images INTEGER NOT NULL, lost INTEGER, gained INTEGER, written_at REAL NOT NULL, "
    "origin TEXT NOT NULL, PRIMARY KEY (split, key))",
    *MIGRATES["2"],
)
UPSERT = ("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (split, key) DO UPDATE SET "
          "(method, removal, correct, images, lost, gained, written_at) = (excluded.method, excluded.removal, "
          "excluded.correct, excluded.images, excluded.lost, excluded.gained, excluded.written_at) "
          "WHERE excluded.images >= results.images")
SELECT = "SELECT correct, images, lost, gained FROM results WHERE split = ? AND key = ?"
CLASSES_OF = "SELECT classes FROM classes WHERE split = ?"
SEEN = ("INSERT INTO origins SELECT ?, COALESCE(MAX(rowid), 0) FROM results WHERE true "
        "ON CONFLICT (origin) DO NOTHING")  # an origin's first ask: the results written so far (rowids grow as
# results are written; pomt never runs VACUUM, which could renumber them)
KNOWN = ("SELECT method, removal, correct, images, lost, gained FROM results WHERE split = ? AND origin != ? AND "
         "rowid <= (SELECT seen_upto FROM origins WHERE origin = ?)")
_FORKED: list[sqlite3.Connection] = []  # a parent's connections in a forked child: kept, never used nor closed
CLASS_DTYPE = "<i4"  # a class index as the file keeps it
T = TypeVar("T")


class Held(NamedTuple):
    """An in-memory cache's entry: the candidate, its result, the origin that first measured it."""

    candidate: Candidate
    result: Proportion
    origin: str
    number: int  # in the order first written


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
        self._seen: dict[str, int] = {}  # in memory only: by origin, the entries written when it first asked
        self._classes: dict[str, bytes] = {}  # in memory only
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
        if meta.get("version") in MIGRATES:
            for statement in MIGRATES[meta["version"]]:
                db.execute(statement)
            db.execute("UPDATE meta SET value = ? WHERE name = 'version'", (str(VERSION),))
        elif meta.get("version") != str(VERSION):
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
                held = (Held(candidate, result, origin, len(self._memory)) if held is None
                        else held._replace(result=result))
                self._memory[(split, candidate.key)] = held
            return held.result
        row = (split, candidate.key, candidate.method, canonical_json(candidate.to_dict()["removal"]),
               result.successes, result.trials, result.lost, result.gained, time.time(), origin)

        def write(db: sqlite3.Connection) -> tuple:
            db.execute(UPSERT, row)
            return db.execute(SELECT, (split, candidate.key)).fetchone()

        return Proportion(*self._run(lambda db: self._transaction(db, write)))

    def known(self, split: str, exclude_origin: str) -> dict[Candidate, Proportion]:
        """Every result held on exactly `split` that an origin other than `exclude_origin` measured first, among
        those written when `exclude_origin` first asked: asked again (a resumed search), it gets them alike."""
        if self._memory is not None:
            upto = self._seen.setdefault(exclude_origin, len(self._memory))
            return {h.candidate: h.result for (s, _), h in self._memory.items()
                    if s == split and h.origin != exclude_origin and h.number < upto}

        def read(db: sqlite3.Connection) -> list:
            db.execute(SEEN, (exclude_origin,))
            return db.execute(KNOWN, (split, exclude_origin, exclude_origin)).fetchall()

        rows = self._run(lambda db: self._transaction(db, read))
        return {Candidate.from_dict({"method": method, "removal": json.loads(removal)}): Proportion(*counts)
                for method, removal, *counts in rows}

    def classes(self, split: str) -> np.ndarray | None:
        """The unpruned model's top-1 class of each image of `split`, in order; None if not kept."""
        if self._memory is not None:
            data = self._classes.get(split)
        else:
            row = self._run(lambda db: db.execute(CLASSES_OF, (split,)).fetchone())
            data = None if row is None else row[0]
        return None if data is None else np.frombuffer(data, dtype=CLASS_DTYPE).astype(np.int64)

    def add_classes(self, split: str, classes: np.ndarray) -> None:
        """Keep the unpruned model's classes on `split` (the first kept stay: they are the same)."""
        data = np.asarray(classes).astype(CLASS_DTYPE).tobytes()
        if self._memory is not None:
            self._classes.setdefault(split, data)
            return
        self._run(lambda db: self._transaction(
            db, lambda d: d.execute("INSERT OR IGNORE INTO classes VALUES (?, ?)", (split, data))))

    def __len__(self) -> int:
        if self._memory is not None:
            return len(self._memory)
        return self._run(lambda db: db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def __getstate__(self) -> dict:
        """Pickled as its path and identity (a copy of the entries in memory): unpickling opens the file again."""
        return {"path": self.path, "identity": self.identity, "memory": self._memory, "classes": self._classes,
                "seen": self._seen}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["identity"])
        self._memory, self._classes, self._seen = state["memory"], state["classes"], state["seen"]
