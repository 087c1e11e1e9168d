"""benchmarks/accuracy_spread.py: its seeded schedules, and its parts end to end on the tiny digits recipe (--smoke),
the ranks part through a real torchrun job of 2 ranks on the CPU."""

import csv
import importlib.util
import json
import sys

import pytest

from pomt.checks import check_removals
from pomt.digits import FRONTIER, SMALL
from pomt.models.registry import geometry_of

from conftest import ROOT, run_script

SCRIPT = "benchmarks/accuracy_spread.py"


@pytest.fixture(scope="module")
def module():
    spec = importlib.util.spec_from_file_location("accuracy_spread", ROOT / SCRIPT)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded  # its dataclasses look their module up
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports benchmarks/frontier.py, as a run of the script does
    try:
        spec.loader.exec_module(loaded)
        yield loaded
    finally:
        sys.modules.pop(spec.name, None)
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One folder both parts run in: the tiny digits model trains once, into its bin/cache."""
    return tmp_path_factory.mktemp("spread")


@pytest.mark.parametrize("recipe", [SMALL, FRONTIER], ids=["small", "frontier"])
def test_the_schedules_are_distinct_seeded_and_valid_for_the_model_counted(module, recipe):
    geometry = geometry_of(recipe.model, recipe.data.size)
    schedules = module.candidate_schedules(geometry, 12, seed=0)
    assert len(set(schedules)) == 12 and schedules == module.candidate_schedules(geometry, 12, seed=0)
    assert schedules != module.candidate_schedules(geometry, 12, seed=1)
    assert {c.method for c in schedules} == {"tome", "topk", "pomt"}
    assert max(len(c.removal) for c in schedules) > 1  # some at several blocks
    for c in schedules:
        check_removals(c.method, c.as_dict(), geometry.num_tokens, geometry.prefix_tokens, geometry.depth)


def test_the_spread_is_the_median_and_range_of_the_paired_speedups(module):
    found = module.spread([2.0, 3.0, 4.0], [1.0, 2.0, 1.0])
    assert found["speedups"] == [2.0, 1.5, 4.0]
    assert found["median_speedup"] == 2.0 and found["speedup_range"] == [1.5, 4.0]
    assert (found["one_rank_median_s"], found["ranks_median_s"]) == (3.0, 1.0)


def run_part(workdir, part: str):
    """The benchmark's `part` with --smoke in `workdir`: the finished run, its output folder and its JSON."""
    result = run_script(SCRIPT, "--part", part, "--smoke", cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    out = workdir / "bin" / "accuracy-spread"
    return result, out, json.loads((out / f"{part}.json").read_text())


@pytest.mark.slow
def test_two_ranks_count_what_one_process_counts_byte_for_byte(workdir):
    result, out, doc = run_part(workdir, "ranks")
    assert doc["counts_identical"] and doc["counts"]["1"] == doc["counts"]["2"] and len(doc["counts"]["1"]) == 1
    counts = json.loads(doc["counts"]["1"][0])
    assert sorted(counts) == sorted(doc["candidates"]) and len(counts) == 12
    assert {images for _, images, _, _ in counts.values()} == {doc["images"]}  # every image, no stop
    assert "counts byte-identical between 1 and 2 ranks: True" in result.stdout
    with (out / "ranks.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(int(r["ranks"]) for r in rows) == [1, 2] and all(float(r["seconds"]) > 0 for r in rows)
    assert len(doc["speedups"]) == doc["repeats"] == 1
    assert (out / "ranks.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_the_second_run_reads_accuracies_the_first_measured_from_the_shared_cache(workdir):
    result, out, doc = run_part(workdir, "cache")
    first, second = doc["runs"]
    assert (first["batch_size"], second["batch_size"]) == (1, 16)
    assert first["measured"] == first["asked"] and first["from_cache"] == 0  # the cache file starts empty
    assert second["measured"] < first["measured"] and second["from_cache"] > 0
    assert doc["cache_share"] == pytest.approx(second["from_cache"] / second["asked"])
    assert doc["time_share"] == pytest.approx(second["accuracy_s"] / first["accuracy_s"])
    assert "of its accuracies read from the cache" in result.stdout
    with (out / "cache.csv").open() as handle:
        assert [int(r["measured"]) for r in csv.DictReader(handle)] == [first["measured"], second["measured"]]
    assert (out / "cache.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_images_held_and_read_again_give_the_same_counts_side_by_side(workdir):
    result, out, doc = run_part(workdir, "held")
    assert doc["counts_identical"] and len(doc["candidates"]) == 12
    assert len(doc["seconds"]["held"]) == len(doc["seconds"]["read again"]) == len(doc["ratios"]) == 1
    assert doc["median_ratio"] == pytest.approx(doc["seconds"]["held"][0] / doc["seconds"]["read again"][0])
    assert "counts identical: True" in result.stdout
    with (out / "held.csv").open() as handle:
        assert sorted(r["images"] for r in csv.DictReader(handle)) == ["held", "read again"]
    assert (out / "held.png").read_bytes().startswith(b"\x89PNG")
