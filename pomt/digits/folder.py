"""sklearn's bundled digits written as two ImageFolders (train / calibration), upscaled to a ViT's input.

Deterministic: the same arguments write the same PNGs (a seeded, per-class split). A folder is written
under a temporary name and renamed into place with its manifest, so a half-written folder is never used.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

from pomt.errors import DatasetError

CLASSES = 10
LEVELS = 16  # sklearn's digits hold grey levels 0..16
MANIFEST = "manifest.json"
SPLITS = ("train", "calibration")


@dataclass(frozen=True)
class DigitsSpec:
    """What a digits folder holds: image size, images per class (None: all), the calibration share, seed."""

    size: int = 112
    per_class: int | None = None
    calibration: float = 0.25
    seed: int = 0

    def key(self) -> str:
        """A short digest of the spec: the folder's name, so other specs never share a folder."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def render(pixels: np.ndarray, size: int) -> Image.Image:
    """One 8 x 8 digit (grey levels 0..16) as a `size` x `size` greyscale image (bilinear upscale)."""
    grey = np.clip(np.rint(pixels * (255 / LEVELS)), 0, 255).astype(np.uint8)
    return Image.fromarray(grey, mode="L").resize((size, size), Image.BILINEAR)


def split_per_class(targets: np.ndarray, spec: DigitsSpec) -> dict[str, list[int]]:
    """Indices of the train and calibration images: per class, a seeded shuffle, `per_class` kept, the
    calibration share taken from its end (at least one image each side)."""
    if not 0.0 < spec.calibration < 1.0:
        raise DatasetError(f"the calibration share must lie in (0, 1), got {spec.calibration}")
    rng = np.random.default_rng(spec.seed)
    picked: dict[str, list[int]] = {name: [] for name in SPLITS}
    for label in range(CLASSES):
        members = rng.permutation(np.flatnonzero(targets == label))[: spec.per_class]
        if len(members) < 2:
            raise DatasetError(f"digits class {label} needs at least 2 images, got {len(members)}")
        held = min(len(members) - 1, max(1, round(len(members) * spec.calibration)))
        picked["train"] += sorted(members[: len(members) - held].tolist())
        picked["calibration"] += sorted(members[len(members) - held :].tolist())
    return picked


def write_digits(cache_dir: str | Path, spec: DigitsSpec = DigitsSpec()) -> Path:
    """The folder `<cache_dir>/digits_<size>px_<key>` with `train/<class>/*.png` and
    `calibration/<class>/*.png`; written once, reused while its manifest is there."""
    root = Path(cache_dir) / f"digits_{spec.size}px_{spec.key()}"
    if (root / MANIFEST).is_file():
        return root
    digits = load_digits()
    splits = split_per_class(digits.target, spec)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}."))
    try:
        for name, indices in splits.items():
            for index in indices:
                folder = staging / name / str(int(digits.target[index]))
                folder.mkdir(parents=True, exist_ok=True)
                render(digits.images[index], spec.size).save(folder / f"{index:04d}.png")
        counts = {name: len(indices) for name, indices in splits.items()}
        (staging / MANIFEST).write_text(json.dumps({"spec": asdict(spec), "images": counts}, indent=2) + "\n")
        shutil.rmtree(root, ignore_errors=True)  # a folder without its manifest is incomplete
        staging.rename(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root
