"""Shared fixtures: small models built once per test run, CLI runner helpers, a fake sysfs tree and NVML."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import signal
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

# The suite tests pomt where its answers are deterministic, on the CPU: a GPU on the machine stays hidden,
# from the CLI subprocesses too, so that "auto" means cpu everywhere (file names, fingerprints, timings).
# The CUDA paths are run by benchmarks/gpu_check.sh on an NVIDIA machine; POMT_TESTS_GPU=1 leaves the GPU visible
# for the tests written for one (tests/runtimes/test_cudagraph_gpu.py), which skip without it.
GPU_TESTS = os.environ.get("POMT_TESTS_GPU") == "1"
if not GPU_TESTS:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402
import torch  # noqa: E402

from pomt.cli import main  # noqa: E402
from pomt.device.allocator import ALLOCATOR_ENV  # noqa: E402
from pomt.formats.schedule import BlockRemoval, Schedule  # noqa: E402
from pomt.models.geometry import transformer_blocks  # noqa: E402

from support.device_fakes import FakeNvml  # noqa: E402
from support.tiny_data import make_image_folder, train_tiny_vit  # noqa: E402


def pytest_configure(config):
    """The Ctrl-C tests send SIGINT themselves. A harness that starts pytest as a background job of a
    non-interactive shell hands it SIGINT ignored, and every process it starts would inherit that: Python's
    own handler is put back first."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"  # the curve bank and the golden replays


@pytest.fixture(autouse=True)
def _allocator_environment():
    """A CPU run sets the steady allocator in its process's environment (`pomt.device.allocator`); each test
    starts from the environment the suite started with, so fingerprints do not depend on the tests before."""
    saved = {name: os.environ.get(name) for name in ALLOCATOR_ENV}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _few_threads():
    """Keep tests polite on a shared 2-core machine and deterministic in thread count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python -m pomt ...` for real in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "pomt", *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=timeout,
    )


def run_script(script: str, *args: str, cwd: Path | None = None, timeout: int = 900):
    """Run a top-level script (offline_computation.py, benchmark.py) in a subprocess."""
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=timeout,
    )


def _in_this_process(call, argv: list[str]) -> subprocess.CompletedProcess:
    """`call()` with stdout and stderr captured: the exit code, stdout and stderr a subprocess running `argv`
    would give; an exception that escapes is written to stderr as the traceback a user would see."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            call()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc(file=err)
            code = 1
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def run_in_process(*args: str) -> subprocess.CompletedProcess:
    """`pomt ...` through `pomt.cli.main` in this process (no interpreter to start), as `_in_this_process`."""
    return _in_this_process(lambda: main(list(args)), ["pomt", *args])


def run_script_in_process(script: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """A top-level script run as `python SCRIPT ARGS` runs it (as `__main__`, its folder first on sys.path,
    from `cwd`), in this process: starting an interpreter and importing torch and timm costs 5-8 s a test on
    a 2-core VM. Each entry point keeps one test through a real subprocess (`run_script`)."""
    path = ROOT / script
    saved_argv, saved_path, saved_cwd = sys.argv[:], sys.path[:], os.getcwd()
    sys.argv, sys.path[:0] = [str(path), *args], [str(path.parent)]
    try:
        os.chdir(cwd or ROOT)
        return _in_this_process(lambda: runpy.run_path(str(path), run_name="__main__"), [sys.executable, *sys.argv])
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)


def schedule_dict(model: str = "deit_tiny_patch16_224", size: int = 224, **changes) -> dict:
    """A valid schedule of `model` (N = 197 at 224 px) removing 20 tokens at block 3, unverified."""
    tokens = (size // 16) ** 2 + 1
    schedule = Schedule(model=model, input_size=(size, size), batch_size=1, num_tokens=tokens, prefix_tokens=1,
                        depth=12, method="pomt", prune=(BlockRemoval(3, min(20, tokens - 3)),))
    return {**schedule.to_dict(), **changes}


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Bad input: exit code 2, exactly one line on stderr, no traceback, naming the problem."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def verified_record(fingerprint: str | None = None) -> dict:
    """A schedule's `verified` object as the offline computation writes it, by default for this machine."""
    from pomt.deploy.apply import eager_fingerprint
    from pomt.device import fingerprint_hash

    here = fingerprint or fingerprint_hash(eager_fingerprint("cpu"))
    return {"unpruned_ms": 10.0, "pruned_ms": 8.0, "speedup": 1.25, "speedup_ci": [1.2, 1.3], "predicted_ms": 8.1,
            "prediction_error": -0.012, "candidates": [{"remove": 56, "pruned_ms": 8.0, "speedup": 1.25}],
            "samples": 30, "device_fingerprint_hash": here}


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A generated labelled ImageFolder and a tiny ViT checkpoint trained on it (once per test run)."""
    root = make_image_folder(tmp_path_factory.mktemp("data"))
    checkpoint = tmp_path_factory.mktemp("ckpt") / "tiny.pth"
    train_accuracy = train_tiny_vit(root, checkpoint)
    return root, checkpoint, train_accuracy


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where pomt.device reads sysfs and keeps the lock state: empty folders under tmp_path."""
    root = tmp_path / "sysfs"
    monkeypatch.setenv("POMT_SYSFS_ROOT", str(root))
    monkeypatch.setenv("POMT_STATE_DIR", str(tmp_path / "state"))
    return root


@pytest.fixture
def fake_nvml(fake_root, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """NVML answered by `FakeNvml` for CUDA device 0, any device name taken as available."""
    from pomt.device import fingerprint, gpu

    nvml = FakeNvml()
    monkeypatch.setattr(gpu, "_NVML", nvml)
    monkeypatch.setattr(gpu, "_HANDLES", {0: "handle-0"})
    monkeypatch.setattr(fingerprint, "resolve_device", lambda name: name)
    return nvml


def entering_counts(model, fn) -> list[int]:
    """The token count entering each transformer block while `fn()` runs the model (once)."""
    counts = []
    hooks = [block.register_forward_pre_hook(lambda _module, args: counts.append(args[0].shape[1]))
             for block in transformer_blocks(model)]
    try:
        fn()
    finally:
        for hook in hooks:
            hook.remove()
    return counts


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """A folder of bad files of every kind a command reads (`support.bad_files`), once per test module."""
    from support.bad_files import make_bad_files  # it imports this module's helpers
    return make_bad_files(tmp_path_factory.mktemp("bad"))


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    """The bad files with a killed run's journal beside them (`support.bad_files.make_scene`), once per module."""
    from support.bad_files import make_scene
    return make_scene(tmp_path_factory.mktemp("scene"))
