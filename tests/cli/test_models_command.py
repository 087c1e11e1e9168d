"""`pomt models` (the reducer support table, probed now) and the reducers line of `pomt model`."""

from __future__ import annotations

import json

import pytest

from pomt.cli.commands import reducers_line, short_reason, support_lines
from pomt.patching import METHODS
from pomt.patching.api import FAMILIES, Row

from conftest import assert_one_line_error, run_in_process


def _check_cells(reducers: dict) -> None:
    assert list(reducers) == list(METHODS)
    for reason in reducers.values():
        assert reason is None or (isinstance(reason, str) and reason and "\n" not in reason), reason


def test_models_json_lists_each_model_of_the_family_asked():
    result = run_in_process("models", "--json", "--family", "eva")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    table = json.loads(result.stdout)
    assert table["methods"] == list(METHODS)
    eva = next(f for f in FAMILIES if "eva" in f.label.lower())
    assert [row["model"] for row in table["rows"]] == list(eva.models)
    for row in table["rows"]:
        assert row["family"] == eva.label and row["class"] == eva.description
        _check_cells(row["reducers"])


def test_models_table_prints_a_row_per_model():
    result = run_in_process("models", "--family", "dinov2 authors")
    assert result.returncode == 0, result.stderr
    head, *rows = [line for line in result.stdout.splitlines() if not line.startswith("(")]
    assert head.split()[:3] == ["family", "model", "class"] and head.split()[3:] == list(METHODS)
    assert len(rows) == 1 and "vit_small" in rows[0]
    assert "Traceback" not in result.stderr


def test_models_unknown_family_is_one_line_exit_2():
    assert_one_line_error(run_in_process("models", "--family", "resnet"), "--family", "matches no family")


def test_model_lists_its_reducers():
    result = run_in_process("model", "deit_tiny", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reducers"] == dict.fromkeys(METHODS)
    text = run_in_process("model", "deit_tiny")
    assert text.returncode == 0, text.stderr
    assert f"reducers       {', '.join(METHODS)}" in text.stdout


def test_reducers_line_names_each_refusal():
    assert reducers_line({"pomt": None, "topk": "no class token", "tome": None}) == (
        "pomt, tome; topk refused: no class token")
    assert reducers_line({"pomt": "x"}) == "none; pomt refused: x"


@pytest.mark.parametrize(("line", "short"), [
    ("naflex is a timm.models.naflexvit.NaFlexVit, which pomt cannot prune (no patch embedding: not a transformer "
     "over patch tokens); pomt supports timm's VisionTransformer family (ViT, DeiT, ...)", "no patch embedding"),
    ("cannot patch block timm.models.vision_transformer.ResPostBlock: pomt supports timm Block",
     "cannot patch block ResPostBlock"),
    ("unknown model 'hf-vit-base'; closest: vit_base", "unknown model 'hf-vit-base'"),
    ("RuntimeError: The size of tensor a (37) must match", "RuntimeError"),
    ("a refusal far longer than any table cell can show in full", "a refusal far longer than any table…"),
])
def test_short_reason(line, short):
    assert short_reason(line) == short


def test_support_lines_write_a_refusal_of_every_method_once():
    rows = [Row("fam", "good", "cls", dict.fromkeys(METHODS)),
            Row("fam", "bad", "cls", dict.fromkeys(METHODS, "unknown model 'bad'; closest: x")),
            Row("fam", "part", "cls", {**dict.fromkeys(METHODS), "topk": "topk needs a class token; see docs"})]
    lines = support_lines(rows)
    assert lines[1].split()[3:] == ["ok"] * len(METHODS)
    assert lines[2].endswith("refused: unknown model 'bad'")
    assert "topk needs a class token" in lines[3] and lines[3].split()[3] == "ok"
    verbose = support_lines(rows, verbose=True)
    assert "    every reducer: unknown model 'bad'; closest: x" in verbose
    assert "    topk: topk needs a class token; see docs" in verbose


@pytest.mark.slow
def test_models_json_covers_every_family():
    result = run_in_process("models", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert [row["model"] for row in rows] == [name for family in FAMILIES for name in family.models]
    for row in rows:
        _check_cells(row["reducers"])
