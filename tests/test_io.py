"""Atomic writes: complete files with the usual permissions, nothing left behind on failure."""

from __future__ import annotations

import os
import stat

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from pomt.io import atomic_save_figure, atomic_write_csv, atomic_write_json, staged_folder  # noqa: E402


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_results_get_the_permissions_of_an_ordinary_file(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    expected = 0o666 & ~umask
    figure, axes = plt.subplots()
    axes.plot([1, 2], [3, 4])
    png = atomic_save_figure(tmp_path / "plot.png", figure)
    plt.close(figure)
    json_path = atomic_write_json(tmp_path / "a.json", {"x": 1})
    csv_path = atomic_write_csv(tmp_path / "a.csv", [{"x": 1}], ["x"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {_mode(png), _mode(json_path), _mode(csv_path)} == {expected}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "a.json", "plot.png"]


def test_failed_figure_leaves_no_file(tmp_path):
    class Broken:
        def savefig(self, *args, **kwargs):
            raise RuntimeError("renderer failed")

    with pytest.raises(RuntimeError):
        atomic_save_figure(tmp_path / "plot.png", Broken())
    assert list(tmp_path.iterdir()) == []


def test_a_staged_folder_replaces_the_root_whole_or_leaves_it_as_it_was(tmp_path):
    root = tmp_path / "built"
    root.mkdir()
    (root / "half").write_text("an earlier half-built folder")
    with staged_folder(root) as staging:
        (staging / "MANIFEST").write_text("whole")
        assert not (root / "MANIFEST").exists()  # nothing in place before leaving
    assert sorted(p.name for p in root.iterdir()) == ["MANIFEST"]
    with pytest.raises(RuntimeError), staged_folder(root) as staging:
        (staging / "other").write_text("never in place")
        raise RuntimeError("build failed")
    assert sorted(p.name for p in root.iterdir()) == ["MANIFEST"]
    assert [p.name for p in tmp_path.iterdir()] == ["built"]  # no staging left beside it
