"""A second real-data case without a download: crops of the photographs installed packages ship (scikit-learn's
`china.jpg` and `flower.jpg`, matplotlib's `grace_hopper.jpg`), each photo cut into regions that are the classes.
A sample is a seeded random crop of its region (scale, aspect, a position that may reach past the region's borders,
a horizontal flip, mild colour jitter) resized to the model's input; train / calibration ImageFolders of PNG files
with a manifest of the spec and of every file's digest, cached by a digest of the spec and the photos. The model
trains with `pomt.digits.train` and is cached by its recipe as the digits model is. Needs scikit-learn (dev extra)."""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from matplotlib import cbook
from PIL import Image, ImageEnhance, ImageOps
from sklearn.datasets import load_sample_images

from pomt.digits import CACHE_DIR, MANIFEST, SPLITS, DigitsCase, Recipe, timm_name, trained_case
from pomt.errors import DatasetError
from pomt.io import staged_folder

# Each photo's grid of regions (rows, columns): one class per region, `CLASSES` in all (`digits.train`'s classifier).
GRIDS = {"china": (2, 2), "flower": (2, 2), "grace_hopper": (2, 1)}
Box = tuple[float, float, float, float]  # left, top, right, bottom in pixels


@dataclass(frozen=True)
class CropsSpec:
    """What a crops folder holds: image size, images per class in each split, how crops are drawn, the seed."""

    size: int = 160
    train: int = 300  # images per class
    calibration: int = 240
    scale: tuple[float, float] = (0.15, 0.6)  # a crop's area as a share of its region's
    aspect: tuple[float, float] = (0.75, 4 / 3)  # width over height, drawn log-uniform
    overlap: float = 0.3  # how far past its region's borders a crop may reach, as a share of the region's side
    jitter: float = 0.2  # brightness, contrast and saturation factors drawn in [1 - jitter, 1 + jitter]
    seed: int = 0

    def key(self, photos: dict[str, str]) -> str:
        """A short digest of the spec and of the photos' digests: the folder's name."""
        text = json.dumps({"spec": asdict(self), "photos": photos}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


FRONTIER = Recipe(data=CropsSpec(), epochs=4, batch_size=32, lr=1e-3)  # 3,000 train and 2,400 calibration images
SMALL = Recipe(model="test_vit", data=CropsSpec(size=64, train=8, calibration=4), epochs=2, batch_size=16, lr=3e-3,
               weight_decay=0.0)  # for tests: trains in seconds


def photo_paths() -> dict[str, Path]:
    """The source photographs by name: the files scikit-learn and matplotlib install."""
    paths = {Path(name).stem: Path(name) for name in load_sample_images().filenames}
    paths["grace_hopper"] = Path(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    missing = sorted(set(GRIDS) - set(paths))
    if missing:
        raise DatasetError(f"the installed packages ship no photo {', '.join(missing)}")
    return {name: paths[name] for name in GRIDS}


def regions(width: int, height: int, grid: tuple[int, int]) -> list[Box]:
    """The boxes of a `rows` x `columns` grid over a `width` x `height` photo, row by row."""
    rows, columns = grid
    return [(width * c / columns, height * r / rows, width * (c + 1) / columns, height * (r + 1) / rows)
            for r in range(rows) for c in range(columns)]


def crop_box(draws: np.ndarray, region: Box, bounds: tuple[int, int], spec: CropsSpec) -> Box:
    """The crop that four uniform draws in [0, 1) pick (area, aspect, left, top): inside `region` grown by
    `spec.overlap` on each side (centred on it where larger) and inside the photo's `bounds` (width, height)."""
    left, top, right, bottom = region
    width, height = right - left, bottom - top
    area = (spec.scale[0] + draws[0] * (spec.scale[1] - spec.scale[0])) * width * height
    low, high = math.log(spec.aspect[0]), math.log(spec.aspect[1])
    ratio = math.exp(low + draws[1] * (high - low))
    crop_w, crop_h = min(math.sqrt(area * ratio), bounds[0]), min(math.sqrt(area / ratio), bounds[1])
    x = place(draws[2], left - spec.overlap * width, right + spec.overlap * width, crop_w, bounds[0])
    y = place(draws[3], top - spec.overlap * height, bottom + spec.overlap * height, crop_h, bounds[1])
    return (x, y, x + crop_w, y + crop_h)


def place(draw: float, low: float, high: float, length: float, bound: float) -> float:
    """The start of a `length` span drawn uniformly inside [low, high] clipped to [0, bound] (centred where it does
    not fit)."""
    low, high = max(0.0, low), min(bound, high)
    slack = high - low - length
    return min(max(0.0, low + (draw * slack if slack >= 0 else slack / 2)), bound - length)


def render_crop(photo: Image.Image, box: Box, flip: bool, factors: np.ndarray, size: int) -> Image.Image:
    """The `box` of `photo` resized to `size` x `size`, mirrored where `flip`, then its brightness, contrast and
    saturation scaled by `factors`."""
    image = photo.resize((size, size), Image.BILINEAR, box=box)
    if flip:
        image = ImageOps.mirror(image)
    for enhancer, factor in zip((ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color), factors,
                                strict=True):
        image = enhancer(image).enhance(float(factor))
    return image


def samples(photo: Image.Image, region: Box, count: int, seed: list[int], spec: CropsSpec) -> list[bytes]:
    """`count` PNG-encoded crops of one region, drawn from the generator seeded by `seed`."""
    rng = np.random.default_rng(seed)
    encoded = []
    for _ in range(count):
        draws = rng.random(8)
        factors = 1.0 + spec.jitter * (2.0 * draws[5:] - 1.0)
        image = render_crop(photo, crop_box(draws[:4], region, photo.size, spec), bool(draws[4] < 0.5), factors,
                            spec.size)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    return encoded


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_crops(cache_dir: str | Path, spec: CropsSpec = CropsSpec()) -> Path:
    """The folder `<cache_dir>/crops_<size>px_<key>` with `train/<class>/` and `calibration/<class>/` (a class
    `<photo>_<region>`), written once; its manifest records the spec and the photos' and every image's digests."""
    if spec.train < 1 or spec.calibration < 1:
        raise DatasetError(f"each split needs at least 1 image per class, got {spec.train} and {spec.calibration}")
    if not 0.0 < spec.scale[0] <= spec.scale[1] or not 0.0 < spec.aspect[0] <= spec.aspect[1]:
        raise DatasetError(f"crop scale and aspect need 0 < low <= high, got {spec.scale} and {spec.aspect}")
    paths = photo_paths()
    photo_digests = {name: digest(path.read_bytes()) for name, path in paths.items()}
    root = Path(cache_dir) / f"crops_{spec.size}px_{spec.key(photo_digests)}"
    if (root / MANIFEST).is_file():
        return root
    counts = {"train": spec.train, "calibration": spec.calibration}
    files: dict[str, str] = {}
    with staged_folder(root) as staging:
        label = 0
        for name, path in paths.items():
            with Image.open(path) as opened:
                photo = opened.convert("RGB")
            for index, region in enumerate(regions(*photo.size, GRIDS[name])):
                for split_index, split in enumerate(SPLITS):
                    folder = staging / split / f"{name}_{index}"
                    folder.mkdir(parents=True)
                    for number, data in enumerate(samples(photo, region, counts[split],
                                                          [spec.seed, split_index, label], spec)):
                        (folder / f"{number:04d}.png").write_bytes(data)
                        files[f"{split}/{folder.name}/{number:04d}.png"] = digest(data)
                label += 1
        images = {split: label * counts[split] for split in SPLITS}
        manifest = {"spec": asdict(spec), "photos": photo_digests, "images": images, "files": files}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return root


def crops_case(recipe: Recipe = FRONTIER, cache_dir: str | Path = CACHE_DIR, progress: bool = False,
               device: str = "cpu") -> DigitsCase:
    """The crops model of `recipe`: read from the cache, else trained (on `device`) and saved."""
    cache_dir = Path(cache_dir)
    root = write_crops(cache_dir, recipe.data)
    key = hashlib.sha256(f"{recipe.key()}/{root.name}".encode()).hexdigest()[:12]
    stem = cache_dir / f"crops_{timm_name(recipe.model)}_{key}"
    return trained_case(recipe, root, stem, progress, device, extra={"data": root.name})
