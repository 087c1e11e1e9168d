"""The shared accuracy cache: results round trip, processes writing one file at once, a writer killed mid-write, what
another process wrote seen at once, partial results never replacing complete ones, the first origin kept and what
other origins measured listed, the unpruned model's classes kept per split, a version 2 file taken on, and bad files
refused in one line."""

from __future__ import annotations

import json
import multiprocessing
import pickle
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from pomt.errors import AccuracyCacheError
from pomt.frontier.cache import FORMAT, VERSION, AccuracyCache, default_cache_path
from pomt.frontier.candidates import NONE, Candidate
from pomt.stats import Proportion

IDENTITY = {"model": "test_vit", "input_size": [3, 64, 64], "num_tokens": 17, "prefix_tokens": 1, "depth": 4,
            "num_classes": 4, "weights": "0123456789abcdef"}
SEARCH, HELD = "search:top1:aaaa:bbbb", "held_out:top1:aaaa:cccc"
PER_WRITER, SHARED = 200, 50  # entries each writer adds, and how many of their keys both write
SPAWN = multiprocessing.get_context("spawn")


def numbered(i: int) -> Candidate:
    return Candidate.of("tome", {0: i + 1, 3: 2})


def write_entries(path: Path, writer: int, start: multiprocessing.synchronize.Barrier) -> None:
    """Open the cache once both writers are ready, then add PER_WRITER entries, the first SHARED on common keys."""
    start.wait()
    cache = AccuracyCache(path, IDENTITY)
    for i in range(PER_WRITER):
        cache.add(numbered(i), "shared" if i < SHARED else f"writer{writer}", Proportion(i, 300, writer, 0))


def write_until_killed(path: Path, sent: multiprocessing.connection.Connection) -> None:
    """Add entries without end, sending each index once its `add` has returned."""
    cache = AccuracyCache(path, IDENTITY)
    for i in range(1_000_000):
        cache.add(numbered(i), SEARCH, Proportion(i, 1_000_000, 0, 0))
        sent.send(i)


def test_results_round_trip_and_a_reopened_cache_holds_them(tmp_path):
    path = tmp_path / "acc.sqlite"
    cache = AccuracyCache(path, IDENTITY)
    candidates = [Candidate.parse("tome:0=4,3=2"), NONE, Candidate.parse("topk:1=3,2=1")]
    results = {(c, s): Proportion(10 + n, 20, n, 1) for n, (c, s) in enumerate((c, s) for c in candidates
                                                                                 for s in (SEARCH, HELD))}
    results[(NONE, HELD)] = Proportion(5, 20)  # unpaired
    assert cache.get(candidates[0], SEARCH) is None and len(cache) == 0
    for (candidate, split), result in results.items():
        assert cache.add(candidate, split, result) == result
    for again in (cache, AccuracyCache(str(path), dict(IDENTITY, input_size=(3, 64, 64)))):
        assert {key: again.get(*key) for key in results} == results and len(again) == 6
    with sqlite3.connect(path) as db:
        assert dict(db.execute("SELECT name, value FROM meta")) == {
            "format": FORMAT, "version": str(VERSION), "identity": json.dumps(IDENTITY, sort_keys=True,
                                                                               separators=(",", ":"))}
        row = db.execute("SELECT method, removal, correct, images, lost, gained FROM results WHERE key = ?",
                         (candidates[0].key,)).fetchone()
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert row == ("tome", '{"0":4,"3":2}', 10, 20, 0, 1)


def test_in_memory_and_pickled_caches(tmp_path):
    memory = AccuracyCache(None, IDENTITY)
    memory.add(NONE, SEARCH, Proportion(3, 4, 0, 0))
    assert memory.path is None and memory.get(NONE, SEARCH) == Proportion(3, 4, 0, 0) and len(memory) == 1
    assert pickle.loads(pickle.dumps(memory)).get(NONE, SEARCH) == Proportion(3, 4, 0, 0)
    shared = AccuracyCache(tmp_path / "acc.sqlite", IDENTITY)
    copy = pickle.loads(pickle.dumps(shared))
    shared.add(NONE, SEARCH, Proportion(1, 2, 0, 0))
    assert copy.get(NONE, SEARCH) == Proportion(1, 2, 0, 0) and copy.identity == IDENTITY


def test_a_default_path_is_named_by_model_and_weights_and_its_folder_made(tmp_path):
    identity = dict(IDENTITY, model="hf-hub:timm/vit_base_patch16_224.augreg_in21k")
    path = default_cache_path(tmp_path, identity)
    assert path == tmp_path / "accuracy" / "hf-hub_timm_vit_base_patch16_224.augreg_in21k-0123456789abcdef.sqlite"
    AccuracyCache(path, identity).add(NONE, SEARCH, Proportion(1, 1, 0, 0))
    assert AccuracyCache(path, identity).get(NONE, SEARCH) == Proportion(1, 1, 0, 0)


def test_two_processes_writing_one_new_file_at_once_lose_nothing(tmp_path):
    path = tmp_path / "deep" / "acc.sqlite"
    start = SPAWN.Barrier(2)
    writers = [SPAWN.Process(target=write_entries, args=(path, w, start)) for w in (1, 2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
        writer.kill()  # only if it is still running
    assert [w.exitcode for w in writers] == [0, 0]
    cache = AccuracyCache(path, IDENTITY)
    assert len(cache) == SHARED + 2 * (PER_WRITER - SHARED)
    for i in range(PER_WRITER):
        if i < SHARED:
            assert cache.get(numbered(i), "shared") in (Proportion(i, 300, 1, 0), Proportion(i, 300, 2, 0))
        else:
            assert [cache.get(numbered(i), f"writer{w}") for w in (1, 2)] == [Proportion(i, 300, w, 0) for w in (1, 2)]


def test_a_writer_killed_while_adding_leaves_every_committed_entry(tmp_path):
    path = tmp_path / "acc.sqlite"
    received, sent = SPAWN.Pipe(duplex=False)
    writer = SPAWN.Process(target=write_until_killed, args=(path, sent))
    writer.start()
    sent.close()
    reported = []
    try:
        while len(reported) < 40:
            assert received.poll(60), "the writer reported nothing"
            reported.append(received.recv())
    finally:
        writer.kill()  # SIGKILL, in the middle of its next transaction or between two
        writer.join(60)
    while received.poll():
        try:
            reported.append(received.recv())
        except (EOFError, OSError):
            break
    cache = AccuracyCache(path, IDENTITY)
    assert reported == list(range(len(reported))) and len(cache) >= len(reported)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    assert all(cache.get(numbered(i), SEARCH) == Proportion(i, 1_000_000, 0, 0) for i in reported)
    cache.add(NONE, SEARCH, Proportion(1, 1, 0, 0))  # and it takes more
    assert AccuracyCache(path, IDENTITY).get(NONE, SEARCH) == Proportion(1, 1, 0, 0)


def test_an_entry_another_cache_object_wrote_is_seen_at_once(tmp_path):
    path = tmp_path / "acc.sqlite"
    earlier, writer = AccuracyCache(path, IDENTITY), AccuracyCache(path, IDENTITY)
    assert earlier.get(NONE, SEARCH) is None
    writer.add(NONE, SEARCH, Proportion(7, 9, 1, 0))
    assert earlier.get(NONE, SEARCH) == Proportion(7, 9, 1, 0) and len(earlier) == 1


@pytest.mark.parametrize("in_file", [True, False], ids=["file", "memory"])
def test_a_partial_result_never_replaces_a_complete_one(tmp_path, in_file):
    cache = AccuracyCache(tmp_path / "acc.sqlite" if in_file else None, IDENTITY)
    candidate = Candidate.parse("tome:0=4,3=2")
    cache.add(candidate, SEARCH, Proportion(18, 20, 2, 0))
    assert cache.add(candidate, SEARCH, Proportion(1, 4, 3, 0)) == Proportion(18, 20, 2, 0)  # stopped early
    assert cache.get(candidate, SEARCH) == Proportion(18, 20, 2, 0)
    assert cache.add(candidate, SEARCH, Proportion(19, 20, 1, 0)) == Proportion(19, 20, 1, 0)  # as many: replaces
    assert cache.add(candidate, SEARCH, Proportion(30, 40, 10, 0)) == cache.get(candidate, SEARCH)  # more: replaces
    assert cache.get(candidate, SEARCH) == Proportion(30, 40, 10, 0) and len(cache) == 1


def filled(path: Path) -> Path:
    cache = AccuracyCache(path, IDENTITY)
    for i in range(20):
        cache.add(numbered(i), SEARCH, Proportion(i, 20, 0, 0))
    cache.close()  # the last connection closed: everything checkpointed into the file
    return path


def corrupted(path: Path) -> Path:
    data = filled(path).read_bytes()
    path.write_bytes(data[:100] + b"\xff" * 3996 + data[4096:])  # the first page, after SQLite's header
    return path


def sqlite_of(path: Path, *statements: str) -> Path:
    with sqlite3.connect(path) as db:
        for statement in statements:
            db.execute(statement)
    db.close()
    return path


VERSION_1 = (  # a file without origins, as the first version wrote it
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE results (split TEXT NOT NULL, key TEXT NOT NULL, method TEXT NOT NULL, removal TEXT NOT NULL, "
    "correct INTEGER NOT NULL, images INTEGER NOT NULL, lost INTEGER, gained INTEGER, written_at REAL NOT NULL, "
    "PRIMARY KEY (split, key))",
    f"INSERT INTO meta VALUES ('format', '{FORMAT}'), ('version', '1'), ('identity', '{json.dumps(IDENTITY)}')",
    "INSERT INTO results VALUES ('s', 'none', 'none', '{}', 1, 2, 0, 0, 0.0)",
)
BAD_FILES = {
    "text": (lambda p: p.write_text("a\n" * 100) and p, "is not SQLite or is corrupt"),
    "corrupt": (corrupted, "is not SQLite or is corrupt"),
    "another-sqlite": (lambda p: sqlite_of(p, "CREATE TABLE notes (text TEXT)"), "not a pomt accuracy cache"),
    "another-meta": (lambda p: sqlite_of(p, "CREATE TABLE meta (name, value)", "CREATE TABLE results (a)"),
                     "not a pomt accuracy cache"),
    "version": (lambda p: sqlite_of(filled(p), "UPDATE meta SET value = '4' WHERE name = 'version'"),
                "is of version 4, this pomt reads version 3"),
    "version-1": (lambda p: sqlite_of(p, *VERSION_1), "is of version 1, this pomt reads version 3; delete it"),
    "other-model": (lambda p: AccuracyCache(p, dict(IDENTITY, model="other", weights="f" * 16)).path,
                    "belongs to another model .model 'other', now 'test_vit', weights 'f+', now '0123"),
    "folder": (lambda p: p.mkdir() or p, "is a folder; choose a file path"),
    "file-as-folder": (lambda p: (p.write_text("") or p) / "acc.sqlite", "acc.sqlite/acc.sqlite cannot be opened"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_cache_file_is_refused_in_one_line_and_left_as_it_was(tmp_path, case):
    make, message = BAD_FILES[case]
    path = make(tmp_path / "acc.sqlite")
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(AccuracyCacheError, match=message) as caught:
        AccuracyCache(path, IDENTITY)
    assert "\n" not in str(caught.value) and caught.value.__cause__ is None
    assert (path.read_bytes() if path.is_file() else None) == before


@pytest.mark.parametrize("in_file", [True, False], ids=["file", "memory"])
def test_a_result_keeps_the_origin_that_first_measured_it(tmp_path, in_file):
    cache = AccuracyCache(tmp_path / "acc.sqlite" if in_file else None, IDENTITY)
    candidate = Candidate.parse("tome:0=4,3=2")
    cache.add(candidate, SEARCH, Proportion(1, 4, 3, 0), origin="bs1")  # stopped early
    assert cache.add(candidate, SEARCH, Proportion(18, 20, 2, 0), origin="bs16") == Proportion(18, 20, 2, 0)
    assert cache.known(SEARCH, "bs16") == {candidate: Proportion(18, 20, 2, 0)}  # still bs1's
    assert cache.known(SEARCH, "bs1") == {}
    if in_file:
        with sqlite3.connect(cache.path) as db:
            assert db.execute("SELECT origin FROM results").fetchall() == [("bs1",)]
        db.close()


@pytest.mark.parametrize("in_file", [True, False], ids=["file", "memory"])
def test_known_lists_what_other_origins_measured_on_exactly_that_split(tmp_path, in_file):
    cache = AccuracyCache(tmp_path / "acc.sqlite" if in_file else None, IDENTITY)
    theirs = {NONE: Proportion(15, 20, 0, 0), Candidate.parse("topk:1=3,2=1"): Proportion(12, 20, 4, 1),
              Candidate.parse("pomt:3=8"): Proportion(3, 8, 5, 0)}
    for candidate, result in theirs.items():
        cache.add(candidate, SEARCH, result, origin="bs1")
    mine = Candidate.parse("tome:0=2")
    cache.add(mine, SEARCH, Proportion(14, 20, 1, 0), origin="bs16")
    cache.add(Candidate.parse("tome:0=3"), HELD, Proportion(9, 20, 2, 0), origin="bs1")  # another split
    cache.add(Candidate.parse("tome:0=1"), f"{SEARCH}|certify:0.01:0.95", Proportion(9, 20), origin="bs1")
    cache.add(Candidate.parse("tome:1=1"), "", Proportion(2, 3), origin="")  # no origin, another split
    known = cache.known(SEARCH, "bs16")
    assert known == theirs and all(type(c) is Candidate for c in known)
    assert cache.known(SEARCH, "bs1") == {mine: Proportion(14, 20, 1, 0)}
    assert cache.known(SEARCH, "") == {**theirs, mine: Proportion(14, 20, 1, 0)}
    again = pickle.loads(pickle.dumps(cache))
    assert again.known(SEARCH, "bs16") == theirs and again.known(HELD, "") == {Candidate.parse("tome:0=3"):
                                                                                Proportion(9, 20, 2, 0)}


@pytest.mark.parametrize("in_file", [True, False], ids=["file", "memory"])
def test_the_unpruned_classes_of_a_split_are_kept_once_and_read_back(tmp_path, in_file):
    cache = AccuracyCache(tmp_path / "acc.sqlite" if in_file else None, IDENTITY)
    classes = np.array([3, 0, 999, 2, 1])
    assert cache.classes(SEARCH) is None
    cache.add_classes(SEARCH, classes)
    cache.add_classes(SEARCH, np.zeros(5, dtype=np.int64))  # the first kept stay
    assert np.array_equal(cache.classes(SEARCH), classes) and cache.classes(HELD) is None
    again = pickle.loads(pickle.dumps(cache))
    assert again.classes(SEARCH).dtype == np.int64 and np.array_equal(again.classes(SEARCH), classes)


VERSION_2 = (  # a file with origins but no classes table
    VERSION_1[0],
    VERSION_1[1].replace("PRIMARY KEY (split, key))", "origin TEXT NOT NULL, PRIMARY KEY (split, key))"),
    VERSION_1[2].replace("'1'", "'2'"),
    "INSERT INTO results VALUES ('s', 'none', 'none', '{}', 1, 2, 0, 0, 0.0, 'bs1')",
)


def test_a_version_2_file_is_taken_on_with_its_results(tmp_path):
    path = sqlite_of(tmp_path / "acc.sqlite", *VERSION_2)
    cache = AccuracyCache(path, IDENTITY)
    assert cache.get(NONE, "s") == Proportion(1, 2, 0, 0) and cache.known("s", "bs16") == {NONE: Proportion(1, 2, 0, 0)}
    cache.add_classes("s", np.array([1, 1]))
    cache.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE name = 'version'").fetchone() == (str(VERSION),)
    db.close()
    assert np.array_equal(AccuracyCache(path, IDENTITY).classes("s"), [1, 1])


@pytest.mark.parametrize("in_file", [True, False], ids=["file", "memory"])
def test_an_origin_knows_what_others_had_written_when_it_first_asked(tmp_path, in_file):
    cache = AccuracyCache(tmp_path / "acc.sqlite" if in_file else None, IDENTITY)
    early, late = Candidate.parse("tome:0=2"), Candidate.parse("tome:0=3")
    cache.add(early, SEARCH, Proportion(14, 20, 1, 0), origin="bs1")
    assert cache.known(SEARCH, "bs16") == {early: Proportion(14, 20, 1, 0)}
    cache.add(late, SEARCH, Proportion(13, 20, 2, 0), origin="bs1")
    cache.add(early, SEARCH, Proportion(28, 40, 2, 0), origin="bs1")  # more images of one it knew: read as they are
    assert cache.known(SEARCH, "bs16") == {early: Proportion(28, 40, 2, 0)}  # asked again: alike
    assert cache.known(SEARCH, "bs4") == {early: Proportion(28, 40, 2, 0), late: Proportion(13, 20, 2, 0)}
    if in_file:
        assert AccuracyCache(cache.path, IDENTITY).known(SEARCH, "bs16") == {early: Proportion(28, 40, 2, 0)}
