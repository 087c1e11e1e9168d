"""pomt.runtimes.forward: timed forwards through eager, torch.compile, ONNX Runtime and OpenVINO on this CPU.

A tiny curve (timm's test_vit cut to 2 blocks, 101 tokens at 160 px) is measured through every backend with
pomt.measurement.timing; the per-count programs must appear in the cache once and be reused by a second process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from pomt.measurement.timing import time_callable
from pomt.models.tokens import truncate_tokens
from pomt.runtimes.backend import Backend, resolve_dtype
from pomt.runtimes.forward import Forward, ProgramCache, ProgramFiles, build_forward

from conftest import ROOT
from support.runtime_data import COUNTS, DEPTH, SIZE, example, first_output, tiny_vit


def test_bfloat16_curve_through_eager():
    dtype = resolve_dtype("bfloat16", "cpu")
    model, x = tiny_vit().to(dtype), example().to(dtype)
    block = model.blocks[0]
    for n in (101, 31):
        with build_forward(model, x, backend="eager", tokens=n) as forward:
            stats, _ = time_callable(forward, min_run_s=0.01, warmup=1)
            out = forward()
            assert len(block._forward_pre_hooks) == (0 if n == 101 else 1)
        assert out.dtype == torch.bfloat16 and forward.tokens == n and stats.median_ms > 0
    assert not block._forward_pre_hooks  # closing the Forward removed the token hook


def test_model_and_example_must_share_a_dtype():
    with pytest.raises(ValueError, match="cast both"):
        build_forward(tiny_vit(), example().to(torch.bfloat16), backend="eager")


def test_a_closed_forward_refuses_to_run():
    forward = Forward(lambda: 1, Backend.EAGER, None)
    assert forward() == 1
    forward.close()
    with pytest.raises(RuntimeError, match="closed"):
        forward()


def _recording_builder(built: list[int], closed: list[int]):
    def build(n: int) -> Forward:
        built.append(n)
        return Forward(lambda: n, Backend.EAGER, n, release=lambda: closed.append(n))

    return build


def test_program_cache_keeps_the_last_forwards_open():
    built, closed = [], []
    cache = ProgramCache(_recording_builder(built, closed), keep=2)
    for n in (1, 2, 1, 3, 1):
        with cache(n) as forward:
            assert forward() == n
    assert built == [1, 2, 3] and closed == [2]  # 2 was the least recently used when 3 came


def test_program_cache_without_keep_closes_each_forward():
    built, closed = [], []
    cache = ProgramCache(_recording_builder(built, closed))
    for n in (1, 1):
        with cache(n) as forward:
            assert forward() == n and closed == built[:-1]
    assert built == [1, 1] and closed == [1, 1]


SECOND_RUN = """
import json, sys, timm, torch
from pomt.runtimes import ProgramFiles, build_forward
torch.set_num_threads(1)
torch.manual_seed(0)
model = timm.create_model("test_vit", depth={depth}).eval()
x = torch.randn(1, 3, {size}, {size}, generator=torch.Generator().manual_seed(0))
hits = {{}}
for backend in {backends}:
    for n in {counts}:
        with build_forward(model, x, backend=backend, tokens=n, files=ProgramFiles(sys.argv[1])) as forward:
            forward()
            hits[f"{{backend}}/{{n}}"] = forward.cache_hit
print(json.dumps(hits))
"""


@pytest.mark.slow
def test_curve_through_each_backend_exports_once_per_count_and_reuses_the_cache(tmp_path):
    backends = ["onnxruntime", "openvino", "compile"]
    model, x = tiny_vit(), example()
    hits, latency = {}, {}
    for backend in ["eager", *backends]:
        for n in COUNTS:
            with build_forward(model, x, backend=backend, tokens=n, files=ProgramFiles(tmp_path)) as forward:
                stats, _ = time_callable(forward, min_run_s=0.01, warmup=1)
                with truncate_tokens(model, n), torch.no_grad():
                    expected = model(x)
                assert (first_output(forward()) - expected).abs().max() <= 1e-4, (backend, n)
            hits[f"{backend}/{n}"], latency[f"{backend}/{n}"] = forward.cache_hit, stats.median_ms
    assert all(ms > 0 for ms in latency.values())
    # One ONNX export per count: onnxruntime exported, openvino found the same programs in the cache.
    assert [hits[f"onnxruntime/{n}"] for n in COUNTS] == [False] * 3
    assert [hits[f"openvino/{n}"] for n in COUNTS] == [True] * 3
    onnx_files = sorted((tmp_path / "onnx").glob("*.onnx"))
    assert len(onnx_files) == len(COUNTS)
    assert sorted(f"n{n}_" in f.name for n in COUNTS for f in onnx_files).count(True) == len(COUNTS)
    assert any((tmp_path / "inductor").rglob("*")), "torch.compile's caches were not pointed into cache_dir"
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "onnx").rglob("*")}

    script = SECOND_RUN.format(size=SIZE, depth=DEPTH, backends=backends, counts=list(COUNTS))
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                            cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    second = json.loads(result.stdout.strip().splitlines()[-1])
    assert second == {key: True for key in second} and len(second) == len(backends) * len(COUNTS)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "onnx").rglob("*")} == before  # nothing rewritten
