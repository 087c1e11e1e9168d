"""Ctrl-C and kills (issue 31): Ctrl-C ends every long command with one line and exit code 130, its journal
intact and resumable; a search killed at any moment resumes to a whole, valid output set; a kill while the
output set is written leaves the previous set or the new one, and the next run clears what it left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pomt
import pomt.deploy.export as export_module
from pomt.formats.curve import read_points
from pomt.formats.trace import read_trace
from pomt.io import COMMIT, clear_stale

from conftest import DATA, ROOT, run_in_process, schedule_dict
from support.tiny_data import MODEL, SIZE

STEM = "test_vit_cpu_bs2_is96"
DEIT_TINY = ("--model", "deit_tiny", "--input-size", "64", "--batch-size", "1")  # N = 17
WORKLOAD = ("--model", MODEL, "--input-size", str(SIZE), "--batch-size", "2", "--threads", "1", "--no-progress")
QUICK = ("--passes", "3", "--visit-s", "0.01", "--confirm-rounds", "3", "--verify-rounds", "3")
SEARCH = (*WORKLOAD, *QUICK, "--latency-only", "--search", "full", "--reps", "3")
REPLAY = ("offline", "--replay", str(DATA / "deit_tiny_bs1_shuffled.csv"), "--no-progress", "--passes", "2",
          "--confirm-rounds", "3")
REPLAY_STEM = "deit_tiny_patch16_224_replay_bs1_is224"
SET = ("curve.csv", "png", "schedule.json")


def _start(args, cwd=ROOT) -> subprocess.Popen:
    """`python -m pomt ARGS` in a process group of its own, as a terminal's foreground job is (Ctrl-C reaches its
    whole process group, fresh processes included)."""
    return subprocess.Popen([sys.executable, "-m", "pomt", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _when_lines(process: subprocess.Popen, path: Path, lines: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= lines:
            return
        time.sleep(0.02)
    raise AssertionError(f"the run ended (or stalled) before {path.name} held {lines} lines")


def _ctrl_c(process: subprocess.Popen) -> subprocess.CompletedProcess:
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def assert_whole_set(folder: Path, stem: str) -> dict:
    """The output set is there, valid and of one run; nothing hidden is left beside it."""
    schedule = pomt.load_schedule(folder / f"{stem}.schedule.json")
    assert schedule.curve == f"{stem}.curve.csv" and read_points(folder / schedule.curve)
    assert (folder / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]
    return json.loads((folder / f"{stem}.schedule.json").read_text())


@pytest.mark.slow
def test_ctrl_c_in_a_search_is_one_line_exit_130_and_resumes(tmp_path):
    process = _start(["offline", *SEARCH, "--output-dir", str(tmp_path)])
    trace = tmp_path / f"{STEM}.trace.csv"
    _when_lines(process, trace, 40)
    result = _ctrl_c(process)
    assert result.returncode == 130, result.stderr
    visits = len(read_trace(trace).visits)  # the journal is intact: it reads as a trace
    assert result.stderr.splitlines() == [f"interrupted after {visits} visits; rerun with --resume to continue"]
    resumed = subprocess.run([sys.executable, "-m", "pomt", "offline", *SEARCH, "--output-dir", str(tmp_path),
                              "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    data = assert_whole_set(tmp_path, STEM)
    assert f"({data['measurement']['visits'] - visits} measured now" in resumed.stdout


@pytest.mark.slow
def test_a_search_killed_at_any_moment_resumes_to_a_whole_output_set(tmp_path):
    first = subprocess.run([sys.executable, "-m", "pomt", "offline", *SEARCH, "--output-dir", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    before = assert_whole_set(tmp_path, STEM)
    (tmp_path / f"{STEM}.trace.csv").unlink()  # so that its length tells how far the next run is
    process = _start(["offline", *SEARCH, "--output-dir", str(tmp_path), "--seed", "1"])
    _when_lines(process, tmp_path / f"{STEM}.trace.csv", 30)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert assert_whole_set(tmp_path, STEM)["created"] == before["created"]  # the previous set, untouched
    resumed = subprocess.run([sys.executable, "-m", "pomt", "offline", *SEARCH, "--output-dir", str(tmp_path),
                              "--seed", "1", "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert len(read_trace(tmp_path / f"{STEM}.trace.csv").visits) == assert_whole_set(tmp_path, STEM)[
        "measurement"]["visits"]


@pytest.mark.slow
def test_ctrl_c_in_a_recording_is_one_line_exit_130(tmp_path):
    args = ["record", *WORKLOAD, "--passes", "4", "--reps", "2", "--output-dir", str(tmp_path)]
    process = _start(args)
    trace = tmp_path / f"{STEM}.record.csv"
    _when_lines(process, trace, 30)
    result = _ctrl_c(process)
    visits = len(read_trace(trace).visits)
    assert result.returncode == 130 and result.stderr.splitlines() == [
        f"interrupted after {visits} visits; rerun with --resume to continue"]


def _interrupt_after(seconds: float) -> threading.Timer:
    """Ctrl-C to this process (as the terminal sends it) after `seconds`."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_in_a_benchmark_says_nothing_was_written(tmp_path):
    timer = _interrupt_after(2.0)
    try:
        result = run_in_process("bench", "--model", "deit_tiny", "--input-size", "64", "--rounds", "100000",
                                "--no-profile", "--output-dir", str(tmp_path))
    finally:
        timer.cancel()
    assert result.returncode == 130
    assert result.stderr.splitlines() == [
        "interrupted; a benchmark keeps no journal: nothing was written, run it again"]
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_an_export_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    """Ctrl-C arrives once the model file is written into the staging folder, while it is checked (a timer
    would race an export that may finish first)."""
    schedule = tmp_path / "tiny.schedule.json"
    schedule.write_text(json.dumps(schedule_dict()))
    check = export_module._max_abs_diff

    def ctrl_c_during_the_check(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return check(*args, **kwargs)

    monkeypatch.setattr(export_module, "_max_abs_diff", ctrl_c_during_the_check)
    result = run_in_process("export", str(schedule), "--no-pretrained")
    assert result.returncode == 130
    assert result.stderr.splitlines()[-1] == ("interrupted; nothing was exported (an earlier export there is as it "
                                              "was)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.schedule.json"]


def test_ctrl_c_while_a_fresh_process_works_ends_both_quietly(tmp_path):
    """The fresh process ignores Ctrl-C from its start (no traceback of its own); the parent stops it and
    exits without multiprocessing's warnings (leaked semaphores) at shutdown."""
    started = tmp_path / "started"
    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
              "from support.interrupt_job import touch_then_sleep\n"
              "from pomt.verification.fresh import in_fresh_process\n"
              "try:\n"
              f"    in_fresh_process(touch_then_sleep, {str(started)!r})\n"
              "except KeyboardInterrupt:\n"
              "    sys.exit(130)\n")
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    _when_lines(process, started, 1)
    result = _ctrl_c(process)
    assert result.returncode == 130 and result.stderr == ""


def test_a_finished_fresh_process_leaves_a_quiet_exit():
    script = ("import time\nfrom pomt.verification.fresh import in_fresh_process\n"
              "print(in_fresh_process(time.sleep, 0.01))\n")
    result = subprocess.run([sys.executable, "-W", "default", "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert (result.returncode, result.stdout, result.stderr) == (0, "None\n", "")


KILL_AT = """
import os, signal, sys
calls, real = [0], os.replace
def replace(source, target):
    calls[0] += 1
    if calls[0] == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(source, target)
os.replace = replace
from pomt.cli import main
main(sys.argv[2:])
"""


def _replay(folder: Path, kill_at: int, *extra: str) -> subprocess.CompletedProcess:
    """A replay into `folder`, SIGKILLed at its `kill_at`-th rename (every file is written to a temporary and
    renamed; a set is staged and then renamed into place), never when `kill_at` is 0."""
    return subprocess.run([sys.executable, "-c", KILL_AT, str(kill_at), *REPLAY, "--output-dir", str(folder),
                           *extra], cwd=ROOT, capture_output=True, text=True, timeout=600)


def _visible(folder: Path) -> dict[str, bytes]:
    """The set as a reader finds it, the schedule without its creation time."""
    files = {}
    for suffix in SET:
        path = folder / f"{REPLAY_STEM}.{suffix}"
        data = path.read_bytes() if path.exists() else b""
        if suffix == "schedule.json" and data:
            data = json.dumps({k: v for k, v in json.loads(data).items() if k != "created"}).encode()
        files[suffix] = data
    return files


def _killed_replays(old_folder: Path, tmp_path: Path, last: int = 19):
    """(kill_at, (folder, result)) for kill_at = 1, 2, ...: a copy of `old_folder` (with an orphaned temporary an
    older kill left) replayed into with seed 1 and killed at its kill_at-th rename. Two replays run at a time, each
    in its own folder (a replay times nothing: its files are the same run alone or beside another), so the
    process starts, most of each replay's time, overlap on the two cores."""
    def replayed(kill_at: int) -> tuple[Path, subprocess.CompletedProcess]:
        folder = tmp_path / f"kill{kill_at}"
        shutil.copytree(old_folder, folder)
        (folder / f".{REPLAY_STEM}.schedule.json.orphan.tmp").write_text("{")
        return folder, _replay(folder, kill_at, "--seed", "1")

    with ThreadPoolExecutor(max_workers=2) as pool:
        for first in range(1, last + 1, 2):
            pair = [k for k in (first, first + 1) if k <= last]
            results = list(pool.map(replayed, pair))
            yield from zip(pair, results, strict=True)


@pytest.mark.slow
def test_a_kill_while_the_outputs_are_written_leaves_the_previous_set_or_the_new_one(tmp_path):
    old_folder, new_folder = tmp_path / "old", tmp_path / "new"
    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side, as in _killed_replays
        runs = [pool.submit(_replay, old_folder, 0), pool.submit(_replay, new_folder, 0, "--seed", "1")]
        assert [run.result().returncode for run in runs] == [0, 0]
    old, new = _visible(old_folder), _visible(new_folder)
    assert all(old[s] != new[s] for s in SET)  # another seed serves other visits: every file differs
    renames, outcomes = 0, []
    for kill_at, (folder, result) in _killed_replays(old_folder, tmp_path):
        if result.returncode == 0:  # fewer renames than kill_at: the run was not killed
            renames = kill_at - 1
            break
        assert result.returncode == -signal.SIGKILL
        staging = folder / f".{REPLAY_STEM}.staging"
        seen = _visible(folder)
        if (staging / COMMIT).exists():  # killed while moving the committed set into place
            outcomes.append("committed")
            clear_stale(folder, REPLAY_STEM)  # what the next run does first
            seen = _visible(folder)
            assert seen == new
        else:
            outcomes.append("old" if seen == old else "new")
            assert seen in (old, new), (kill_at, [s for s in SET if seen[s] not in (old[s], new[s])])
        rerun = run_in_process(*REPLAY, "--output-dir", str(folder), "--seed", "1")  # no kill: in this process
        assert rerun.returncode == 0, rerun.stderr  # the next run clears every leftover
        assert _visible(folder) == new and not [p for p in folder.iterdir() if p.name.startswith(".")]
    assert renames >= 7 and outcomes[0] == "old" and "committed" in outcomes


def _start_script(script: str, *args: str, cwd: Path) -> subprocess.Popen:
    """A top-level script in a process group of its own, as a terminal's foreground job (Ctrl-C reaches its group)."""
    return subprocess.Popen([sys.executable, str(ROOT / script), *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize(
    ("script", "args", "journal"),
    [
        ("offline_computation.py", ("--search", "full", "--latency-only", "--passes", "40"), "trace.csv"),
        ("offline_computation.py", ("--search", "adaptive", "--latency-only", "--coarse-passes", "40"), "trace.csv"),
    ],
    ids=["full-search", "adaptive-search"],
)
def test_ctrl_c_in_the_offline_script_is_exit_130_with_its_resume_line(script, args, journal, tmp_path):
    out = tmp_path / "out"
    process = _start_script(script, *DEIT_TINY, "--threads", "1", "--reps", "2", "--no-progress", "--output-dir",
                            str(out), *args, cwd=tmp_path)
    _when_lines(process, out / f"deit_tiny_patch16_224_cpu_bs1_is64.{journal}", 4)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == 130, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "rerun with --resume to continue" in lines[0], lines[0]
