"""pomt.workload.prepare: the run resolved before any model is built (names, sizes, device, clocks, stem), and the
workload made concrete (model in its dtype, seeded input, grid, fingerprint)."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from pomt.device import device_fingerprint
from pomt.errors import BatchSizeError, DeviceError, InputSizeError, UnknownModelError
from pomt.runtimes import BACKENDS, DTYPES
from pomt.workload.prepare import Workload, output_stem, prepare, prepare_run

from conftest import assert_one_line_error, run_script_in_process


def test_dtype_and_backend_options_are_the_runtimes_names():
    meta = {f.name: f.metadata for f in fields(Workload)}
    assert meta["dtype"]["choices"] == tuple(DTYPES) and meta["backend"]["choices"] == BACKENDS


def test_prepare_builds_the_model_and_input_of_the_run_it_is_given():
    workload = Workload(model="test_vit", batch_size=1, input_size=96, device="cpu", threads=1, dtype="bfloat16",
                        seed=3)
    run = prepare_run("test_vit", "cpu", 1, 1, 96).at(2, 64)  # a sweep's cell
    prepared = prepare(workload, run=run)
    assert prepared.setup.batch_size == 2 and prepared.geometry.input_size == (64, 64)
    assert prepared.x.shape == (2, 3, 64, 64) and prepared.x.dtype == torch.bfloat16
    assert next(prepared.model.parameters()).dtype == torch.bfloat16
    fingerprint = prepared.setup.fingerprint
    assert fingerprint.dtype == "bfloat16" and fingerprint.backend["name"] == "eager"
    assert prepared.grid == list(range(prepared.geometry.min_tokens, prepared.geometry.num_tokens + 1))
    again = prepare(workload, run=run)
    assert torch.equal(again.x, prepared.x)  # the input is seeded


def test_stem_names_model_device_batch_and_size():
    assert output_stem("deit_small", "cuda:1", [4], [(224, 224)]) == "deit_small_patch16_224_cuda_bs4_is224"
    assert output_stem("deit_tiny_patch16_224.fb_in1k", "cpu", [1], [(224, 320)]) == (
        "deit_tiny_patch16_224_cpu_bs1_is224x320"
    )
    assert output_stem("deit_tiny", "cpu", [1, 2], [(32, 32), (64, 64)]) == "deit_tiny_patch16_224_cpu_bs1-2_is32-64"


def test_prepare_run_resolves_before_any_model_is_built():
    setup = prepare_run("dinov2_small", "cpu", threads=1, batch_size=2)
    assert (setup.model, setup.device, setup.batch_size) == ("vit_small_patch14_dinov2", "cpu", 2)
    assert setup.input_size == (518, 518)  # the pretrained config's size, read without building the model
    assert setup.fingerprint.threads == 1 and setup.stem == "vit_small_patch14_dinov2_cpu_bs2_is518"
    assert setup.at(8, 224).stem == "vit_small_patch14_dinov2_cpu_bs8_is224"
    with pytest.raises(BatchSizeError):
        setup.at(0, 224)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"model": "deit_smal"}, UnknownModelError),
        ({"model": "deit_tiny", "batch_size": 0}, BatchSizeError),
        ({"model": "deit_tiny", "input_size": -3}, InputSizeError),
        ({"model": "deit_tiny", "device": "tpu"}, DeviceError),
    ],
)
def test_prepare_run_rejects_bad_settings(kwargs, error):
    with pytest.raises(error):
        prepare_run(**kwargs)


@pytest.mark.parametrize("script", ["offline_computation.py", "benchmark.py"])
def test_both_entry_points_refuse_unlocked_clocks(script, tmp_path):
    if device_fingerprint("cpu").clocks_locked is True:
        pytest.skip("this machine's CPU clocks are locked")
    result = run_script_in_process(script, "--model", "deit_tiny", "--device", "cpu", "--require-locked-clocks",
                        "--output-dir", str(tmp_path))
    assert_one_line_error(result, "clocks")
    assert not any(tmp_path.iterdir())
