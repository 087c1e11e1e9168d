"""pomt.runtimes.programs: what keys an exported program, and the ONNX file cached under that key."""

from __future__ import annotations

import torch

from pomt.patching import patch
from pomt.runtimes.forward import ProgramFiles, build_forward
from pomt.runtimes.programs import key_name, program_key

from support.runtime_data import example, first_output, tiny_vit


def test_patched_model_runs_untruncated_and_its_patch_keys_the_program(tmp_path):
    model, x = tiny_vit(), example()
    plain = key_name(program_key(model, x, None))
    patch(model, "pomt", {1: 40})
    assert key_name(program_key(model, x, None)) != plain and "_pomt-1r40_" in key_name(program_key(model, x, None))
    with torch.no_grad():
        expected = model(x)
    with build_forward(model, x, backend="onnxruntime", files=ProgramFiles(tmp_path)) as forward:
        got = first_output(forward())
    assert (got - expected).abs().max() <= 1e-4
    assert [p.name for p in (tmp_path / "onnx").glob("*.onnx")] == [forward.artifact.name]


def test_weights_key_the_program_unless_a_fixed_string_stands_for_them():
    model, x = tiny_vit(), example()
    before = program_key(model, x, 51)
    with torch.no_grad():
        model.head.bias.add_(1.0)
    after = program_key(model, x, 51)
    assert before["weights"] != after["weights"] and key_name(before) != key_name(after)
    assert program_key(model, x, 51, "latency")["weights"] == "latency"
    assert key_name(before).startswith("test_vit_bs1_is160x160_float32_n51_")
