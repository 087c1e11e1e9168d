"""The top-level scripts (`offline_computation.py`, `benchmark.py`, `benchmarks/*.py`) answer bad input with
one line on stderr and exit code 2, no traceback (issue 31); one case of each runs through a real interpreter,
the others in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import DATA, assert_one_line_error, run_script, run_script_in_process
from support.bad_files import TRACE


def _filled(args: list[str], scene: Path, out: Path) -> list[str]:
    return [a.format(scene=scene, out=out, data=DATA) for a in args]


def fill(args: tuple[str, ...], bad: Path, out: Path) -> list[str]:
    """The case's arguments with {F} (the bad files' folder), {O} (an output folder) and {T} (a good trace)."""
    return [a.format(F=bad, O=out, T=TRACE) for a in args]


SCRIPT_CASES = [
    ("benchmark-latin1-schedule", "benchmark.py", ["--schedule", "{scene}/latin1.json"], ["not UTF-8"]),
    ("benchmark-output-is-a-file", "benchmark.py", ["--model", "deit_tiny", "--output-dir", "{scene}/file"],
     ["is a file"]),
    ("offline-script-resnet18", "offline_computation.py", ["--model", "resnet18", "--no-progress"],
     ["resnet18", "pomt supports"]),
    ("offline-script-threads-0", "offline_computation.py", ["--threads", "0", "--no-progress"], ["--threads"]),
    ("frontier-benchmark-unknown-model", "benchmarks/frontier.py", ["--model", "nonesuch", "--smoke"],
     ["unknown model 'nonesuch'"]),
    ("frontier-benchmark-absent-device", "benchmarks/frontier.py", ["--device", "cuda:99", "--smoke"],
     ["cuda:99"]),
    ("frontier-benchmark-unreadable-also", "benchmarks/frontier.py", ["--also", "tome:0", "--smoke"],
     ["cannot read schedule 'tome:0'"]),
    ("frontier-benchmark-also-unpruned", "benchmarks/frontier.py", ["--also", "none", "--smoke"],
     ["--also takes pruned schedules"]),
    ("frontier-benchmark-cudagraph-on-cpu", "benchmarks/frontier.py", ["--backend", "cudagraph", "--smoke"],
     ["cudagraph backend runs on an NVIDIA GPU"]),
    ("serve-graph-without-a-gpu", "benchmarks/serve_graph.py", ["{scene}/tiny.schedule.json"],
     ["serves on an NVIDIA GPU"]),
    ("prediction-error-cudagraph-on-cpu", "benchmarks/prediction_error.py", ["--part", "multi", "--backend",
                                                                              "cudagraph"],
     ["cudagraph backend runs on an NVIDIA GPU"]),
    ("prediction-error-changes-on-cuda", "benchmarks/prediction_error.py", ["--part", "changes", "--device", "cuda"],
     ["--part changes measures the CPU only"]),
    ("prediction-error-unreadable-also", "benchmarks/prediction_error.py", ["--part", "multi", "--also", "tome:0"],
     ["cannot read schedule 'tome:0'"]),
    ("prediction-error-also-beyond-depth", "benchmarks/prediction_error.py",
     ["--part", "multi", "--workloads", "test_vit:1:64", "--also", "tome:40=2"], ["prune block 40", "0..5"]),
    ("prediction-error-also-outside-multi", "benchmarks/prediction_error.py", ["--part", "changes", "--also",
                                                                                "tome:0=2"],
     ["--also adds schedules to --part multi"]),
]
# One case of each script through a real interpreter (what a user's shell runs, import-time warnings
# included); the others in this process, as the same script runs there.
THROUGH_A_SUBPROCESS = [(c[1], c[2]) for c in SCRIPT_CASES
                        if c[0] in ("benchmark-latin1-schedule", "offline-script-resnet18",
                                    "frontier-benchmark-unknown-model")]


@pytest.mark.parametrize(("script", "args", "fragments"), [c[1:] for c in SCRIPT_CASES],
                         ids=[c[0] for c in SCRIPT_CASES])
def test_the_scripts_answer_bad_input_with_one_line(scene, tmp_path, script, args, fragments):
    run = run_script if (script, args) in THROUGH_A_SUBPROCESS else run_script_in_process
    assert_one_line_error(run(script, *_filled(args, scene, tmp_path)), *fragments)


@pytest.mark.parametrize(
    ("script", "args", "fragment"),
    [
        ("offline_computation.py", ("--model", "deit_tiny", "--visit-s", "inf"), "--visit-s"),
        ("offline_computation.py", ("--replay", "{F}/huge_cell.csv"), "field larger than field limit"),
        ("benchmark.py", ("--model", "deit_tiny", "--methods", ",,"), "--methods names no variant"),
        ("benchmark.py", ("--schedule", "{F}/deep.json"), "not a schedule's JSON"),
    ],
    ids=["offline-script-visit-s-inf", "offline-script-huge-cell", "bench-script-no-methods",
         "bench-script-deep-json"],
)
def test_the_scripts_themselves_say_it_in_one_line(script, args, fragment, bad, tmp_path):
    out = str(tmp_path / "out")
    result = run_script_in_process(script, *fill(args, bad, tmp_path), "--output-dir", out, cwd=tmp_path)
    assert_one_line_error(result, fragment)
