"""Broken and surprising files for the bad-input tests: schedules, traces, curves, checkpoints and
image folders, each wrong in one way a user's file can be (`make_bad_files`), and the few files the command
line and API catalogues point at (`make_scene`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image

from conftest import DATA, assert_one_line_error, run_in_process, schedule_dict, verified_record
from support.tiny_data import make_image_folder

TRACE = DATA / "deit_tiny_bs1_shuffled.csv"  # deit_tiny at 224 px, batch 1, 2 threads, float32, eager, on a CPU
HEADER = "tokens,pass,rep,t_s,ms\n"


def good_schedule(**changes) -> dict:
    """A valid deit_tiny schedule at 64 px (N = 17), removing 14 tokens at block 3, unverified."""
    return {**schedule_dict("deit_tiny_patch16_224", size=64), **changes}


SCHEDULES = {
    "good": {},
    "curve_number": {"curve": 5},
    "curve_dot": {"curve": "."},
    "model_null": {"model": None},
    "model_number": {"model": 42},
    "version_true": {"version": True},
    "version_two": {"version": 2},
    "format_other": {"format": "pomt.trace"},
    "nan_verified": {"verified": {**verified_record(), "unpruned_ms": float("nan")}},
    "inf_speedup": {"verified": {**verified_record(), "speedup": float("inf")}},
    "cost_list": {"curve": "lat.curve.csv", "verified": {**verified_record(), "method_cost_ms": [1, 2]}},
    "input_bool": {"input_size": [True, True]},
    "input_other": {"input_size": [224, 224]},
    "steps_text": {"steps": "none"},
    "policy_list": {"policy": []},
    "device_text": {"device": "cpu"},
    "resnet": {"model": "resnet18"},
    "typo_model": {"model": "deit_tinny"},
    "small_model": {"model": "deit_small_patch16_224"},
    "batch_zero": {"batch_size": 0},
    "tome_beyond_cap": {"method": "tome", "prune": [{"block": 3, "remove": 9}], "kept_tokens": 8},
    "prune_pairs": {"prune": [[3, 5]]},
    "blocks_twice": {"prune": [{"block": 3, "remove": 1}, {"block": 3, "remove": 1}], "kept_tokens": 15},
    "remove_float": {"prune": [{"block": 3, "remove": 5.0}], "kept_tokens": 12},
    "prefix_negative": {"prefix_tokens": -1},
    "dtype_int8": {"dtype": "int8"},
    "backend_tpu": {"backend": {"name": "tpu"}},
    "kept_wrong": {"kept_tokens": 5},
}
TEXTS = {
    "deep": "[" * 100_000 + "]" * 100_000,
    "long_number": '{"format": "pomt.schedule", "version": ' + "9" * 5000 + "}",
    "bom": "\ufeff" + json.dumps(good_schedule()),
    "list": "[1, 2, 3]",
    "empty": "",
    "truncated": json.dumps(good_schedule())[:-40],
}
TRACES = {  # name: (CSV text or None for the good trace's, sidecar changes or a sidecar's text, or None: none)
    "no_sidecar": (None, None),
    "header_other": ("a,b,c\n1,2,3\n", {}),
    "no_text": ("", {}),
    "header_only": (HEADER, {}),
    "nan_ms": (HEADER + "197,0,0,0.0,nan\n", {}),
    "negative_ms": (HEADER + "197,0,0,0.0,-1\n", {}),
    "beyond_n": (HEADER + "500,0,0,0.0,1\n", {}),
    "huge_cell": (HEADER + "197,0,0,0.0," + "1" * 200_000 + "\n", {}),
    "nul_byte": (HEADER + "197,0,0,0.0,1\x00\n", {}),
    "no_reference": (HEADER + "100,0,0,0.0,1\n", {}),
    "sidecar_long_number": (None, '{"model": "deit_tiny", "batch_size": ' + "9" * 5000 + "}"),
    "sidecar_list": (None, "[1]"),
    "sidecar_typo": (None, {"model": "deit_tinny"}),
    "sidecar_resnet": (None, {"model": "resnet18"}),
    "sidecar_n": (None, {"num_tokens": 50}),
    "sidecar_size_text": (None, {"input_size": "224"}),
    "sidecar_batch_true": (None, {"batch_size": True}),
    "sidecar_huge_size": (None, {"input_size": [100_000, 100_000]}),
}
ACCURACY = {
    "above_one": "tokens,accuracy\n17,2.0\n2,0.5\n",
    "nan": "tokens,accuracy\n17,nan\n2,0.5\n",
    "one_count": "tokens,accuracy\n17,0.8\n",
    "beyond_n": "tokens,accuracy\n500,0.8\n2,0.1\n",
    "mixed_kinds": "tokens,accuracy,kind\n17,0.8,top1\n2,0.1,agreement\n",
    "count_twice": "tokens,accuracy\n17,0.8\n17,0.1\n2,0.1\n",
    "no_columns": "n,a\n17,0.8\n",
}


def _images(folder: Path, count: int, size: int = 64) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (size, size), (i * 40, 90, 160)).save(folder / f"image_{i}.png")


def _traces(root: Path) -> None:
    sidecar = json.loads(TRACE.with_suffix(".json").read_text())
    for name, (text, side) in TRACES.items():
        (root / f"{name}.csv").write_text(TRACE.read_text() if text is None else text)
        if isinstance(side, dict):
            (root / f"{name}.json").write_text(json.dumps({**sidecar, **side}))
        elif isinstance(side, str):
            (root / f"{name}.json").write_text(side)


def _schedules(root: Path) -> None:
    for name, changes in SCHEDULES.items():
        (root / f"{name}.json").write_text(json.dumps(good_schedule(**changes)))
    for name, text in TEXTS.items():
        (root / f"{name}.json").write_text(text)
    (root / "not_utf8.json").write_bytes(b"\xff\xfe\x00{}")
    (root / "lat.curve.csv").write_text("tokens,latency_ms\n17,1.0\n2,0.5\n")


def _folders(root: Path) -> None:
    (root / "a_file.txt").write_text("not a folder\n")
    (root / "empty").mkdir()
    (root / "texts" / "cats").mkdir(parents=True)
    (root / "texts" / "cats" / "notes.txt").write_text("no image here\n")
    (root / "empty_classes" / "a").mkdir(parents=True)
    (root / "empty_classes" / "b").mkdir()
    (root / "corrupt").mkdir()
    (root / "corrupt" / "x.png").write_bytes(b"not a png")
    _images(root / "flat", 3)
    _images(root / "one_class" / "only", 3)


def _checkpoints(root: Path) -> None:
    (root / "garbage.pth").write_bytes(b"garbage")
    (root / "empty.pth").write_bytes(b"")
    torch.save({"foo": torch.zeros(1)}, root / "other_keys.pth")
    torch.save([1, 2, 3], root / "a_list.pth")


def make_bad_files(root: Path) -> Path:
    """Write every broken file and folder above under `root`; returns it."""
    for make in (_traces, _schedules, _folders, _checkpoints):
        make(root)
    for name, text in ACCURACY.items():
        (root / f"accuracy_{name}.csv").write_text(text)
    return root


def make_scene(root: Path) -> Path:
    """A file in the way, schedules good and bad, files that are not UTF-8, a data folder of one class, under
    `root`; returns it."""
    (root / "file").write_text("not a folder\n")
    (root / "x.onnx").mkdir()
    (root / "empty").mkdir()
    (root / "latin1.json").write_bytes('{"model": "d\xe9it"}'.encode("latin-1"))
    (root / "latin1.csv").write_bytes("tokens,accuracy\n17,0.5 \xe9\n".encode("latin-1"))
    (root / "latin1_trace.csv").write_bytes("tokens,pass,rep,t_s,ms\n17,0,0,0.0,1.0 \xff\n".encode("latin-1"))
    (root / "latin1_trace.json").write_text((DATA / "deit_tiny_bs1_shuffled.json").read_text())
    (root / "corrupt.json").write_text("{ not json")
    (root / "resnet.schedule.json").write_text(json.dumps(schedule_dict("resnet18")))
    (root / "tiny.schedule.json").write_text(json.dumps(schedule_dict()))
    (root / "small.schedule.json").write_text(json.dumps(schedule_dict("deit_small_patch16_224")))
    (root / "future.schedule.json").write_text(json.dumps(schedule_dict(version=99)))
    make_image_folder(root / "one_class" / "only_class", per_class=4, labelled=False)  # one class folder
    return root


def assert_refused_writing_nothing(args: tuple[str, ...], fragment: str, bad: Path, tmp_path: Path) -> None:
    """`pomt ARGS` (`{F}`: the bad files, `{T}`: `TRACE`, `{O}`: an output folder; offline and bench write into
    tmp_path) refuses with one line naming `fragment`, exit 2, and writes nothing. Run from tmp_path, where the
    default output folder of a case that names none would go."""
    command = [a.format(F=bad, T=TRACE, O=tmp_path / "out") for a in args]
    if args[0] in ("offline", "bench") and "--output-dir" not in args:
        command += ["--output-dir", str(tmp_path / "out")]
    assert_one_line_error(run_in_process(*command), fragment)
    assert not any(tmp_path.rglob("*.*"))  # nothing measured, nothing written


def warning_lines(result) -> list[str]:
    """The lines a run printed on stderr."""
    return [line for line in result.stderr.splitlines() if line.strip()]
