"""pomt.workload.prepare: the workload made concrete (model in its dtype, seeded input, grid, fingerprint)."""

from __future__ import annotations

from dataclasses import fields

import torch

from pomt.runtimes import BACKENDS, DTYPES
from pomt.workload.prepare import Workload, prepare
from pomt.workload.setup import prepare_run


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
