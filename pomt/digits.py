"""A real-data case built without a download: sklearn's bundled 8 x 8 digits as two ImageFolders (train /
calibration, upscaled to a ViT's input) and a ViT trained on them a few epochs, cached by its recipe's digest.
The checkpoint (`{"state_dict": ...}`) loads with `create_model(..., checkpoint=...)`; a JSON sidecar records the
recipe, the training time and the calibration top-1. Needs scikit-learn (dev extra)."""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn
from tqdm.auto import tqdm

from pomt.accuracy import eval_transform, image_loader, open_image_folder
from pomt.errors import DatasetError
from pomt.io import atomic_write_bytes, atomic_write_json, staged_folder
from pomt.models.registry import create_model

CACHE_DIR = Path("bin/cache")
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
    """Indices of the train and calibration images: a seeded per-class shuffle, `per_class` kept, split at its end."""
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
    """The folder `<cache_dir>/digits_<size>px_<key>` with `train/` and `calibration/`, written once."""
    root = Path(cache_dir) / f"digits_{spec.size}px_{spec.key()}"
    if (root / MANIFEST).is_file():
        return root
    digits = load_digits()
    splits = split_per_class(digits.target, spec)
    with staged_folder(root) as staging:
        for name, indices in splits.items():
            for index in indices:
                folder = staging / name / str(int(digits.target[index]))
                folder.mkdir(parents=True, exist_ok=True)
                render(digits.images[index], spec.size).save(folder / f"{index:04d}.png")
        counts = {name: len(indices) for name, indices in splits.items()}
        (staging / MANIFEST).write_text(json.dumps({"spec": asdict(spec), "images": counts}, indent=2) + "\n")
    return root


@dataclass(frozen=True)
class Recipe:
    """What makes a digits model: architecture, data, and the training settings."""

    model: str = "deit_tiny_patch16_224"
    data: DigitsSpec = DigitsSpec()
    epochs: int = 8
    batch_size: int = 16
    lr: float = 5e-4
    weight_decay: float = 0.05
    warmup: float = 0.1  # share of the steps with a linear learning-rate warm-up, then cosine to 0
    seed: int = 0

    def key(self) -> str:
        """A digest of the recipe and of timm's version (its model code makes the weights' meaning)."""
        text = json.dumps({**asdict(self), "timm": timm.__version__}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


FRONTIER = Recipe(data=DigitsSpec(calibration=0.45))  # benchmarks/frontier.py: 404 search images, a 1-point drop
SMALL = Recipe(model="test_vit", data=DigitsSpec(size=64, per_class=20), epochs=2, batch_size=16, lr=3e-3,
               weight_decay=0.0)  # for tests: trains in seconds, to about chance


@dataclass(frozen=True)
class DigitsCase:
    """A trained digits model: its checkpoint, its folders, how long it trained and how well it does."""

    recipe: Recipe
    checkpoint: Path
    root: Path
    accuracy: float  # top-1 on the calibration images
    calibration_images: int
    train_s: float
    threads: int
    reused: bool

    @property
    def train_root(self) -> Path:
        return self.root / "train"

    @property
    def calibration_root(self) -> Path:
        return self.root / "calibration"

    def load(self) -> nn.Module:
        """The trained model, in eval mode, as any pomt entry point would load it."""
        return create_model(self.recipe.model, self.recipe.data.size, checkpoint=self.checkpoint)


def digits_case(recipe: Recipe = Recipe(), cache_dir: str | Path = CACHE_DIR, progress: bool = False,
                device: str = "cpu") -> DigitsCase:
    """The digits model of `recipe`: read from the cache, else trained (on `device`) and saved."""
    cache_dir = Path(cache_dir)
    root = write_digits(cache_dir, recipe.data)
    return trained_case(recipe, root, cache_dir / f"digits_{timm_name(recipe.model)}_{recipe.key()}", progress, device)


def trained_case(recipe: Recipe, root: Path, stem: Path, progress: bool = False, device: str = "cpu",
                 extra: dict | None = None) -> DigitsCase:
    """The model of `recipe` trained on `root`'s folders: read from `stem`.pth/.json, else trained and saved
    there (`extra`: more facts for the sidecar)."""
    checkpoint, sidecar = stem.with_suffix(".pth"), stem.with_suffix(".json")
    if checkpoint.is_file() and sidecar.is_file():
        facts = json.loads(sidecar.read_text(encoding="utf-8"))
        return DigitsCase(recipe, checkpoint, root, facts["accuracy"], facts["calibration_images"],
                          facts["train_s"], facts["threads"], reused=True)
    model, train_s = train(recipe, root / "train", progress, device)
    accuracy, images = calibration_accuracy(model, root / "calibration", recipe.data.size, device=device)
    buffer = io.BytesIO()
    torch.save({"state_dict": {k: v.cpu() for k, v in model.state_dict().items()}}, buffer)
    atomic_write_bytes(checkpoint, buffer.getvalue())
    threads = torch.get_num_threads()
    atomic_write_json(sidecar, {"recipe": asdict(recipe), "timm": timm.__version__, **(extra or {}),
                                "accuracy": accuracy, "calibration_images": images, "train_s": round(train_s, 2),
                                "threads": threads, "device": device})
    return DigitsCase(recipe, checkpoint, root, accuracy, images, round(train_s, 2), threads, reused=False)


def timm_name(model: str) -> str:
    return model.replace("/", "_")


def _images(model: nn.Module, root: Path, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every image of an ImageFolder through the model's eval transform, and the labels."""
    dataset, _ = open_image_folder(root, eval_transform(model, (size, size)))
    pairs = [dataset[i] for i in range(len(dataset))]
    return torch.stack([image for image, _ in pairs]), torch.tensor([label for _, label in pairs])


def learning_rate(step: int, steps: int, recipe: Recipe) -> float:
    """Linear warm-up over the first `recipe.warmup` of the steps, then cosine decay to 0."""
    warm = max(1, round(steps * recipe.warmup))
    if step < warm:
        return recipe.lr * (step + 1) / warm
    return recipe.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def train(recipe: Recipe, train_root: Path, progress: bool = False, device: str = "cpu") -> tuple[nn.Module, float]:
    """Train the recipe's model from its seeded random init on the train folder, on `device` (float32); returns it
    (eval mode) and the seconds training took (image loading not counted). The caller's CPU RNG is untouched."""
    size = recipe.data.size
    model = create_model(recipe.model, size, num_classes=10)
    images, labels = _images(model, train_root, size)
    model = model.to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    per_epoch = math.ceil(len(images) / recipe.batch_size)
    steps = recipe.epochs * per_epoch
    generator = torch.Generator().manual_seed(recipe.seed)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)  # dropout / drop-path draws, where the model has them
        model.train()
        bar = tqdm(total=steps, desc="train digits", unit="step", disable=not progress, leave=False)
        for epoch in range(recipe.epochs):
            order = torch.randperm(len(images), generator=generator)
            for i in range(per_epoch):
                batch = order[i * recipe.batch_size : (i + 1) * recipe.batch_size]
                for group in optimiser.param_groups:
                    group["lr"] = learning_rate(epoch * per_epoch + i, steps, recipe)
                logits = model(images[batch].to(device))
                loss = nn.functional.cross_entropy(logits, labels[batch].to(device))
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                bar.update(1)
        bar.close()
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return model.eval(), time.perf_counter() - start


def calibration_accuracy(model: nn.Module, root: Path, size: int, batch_size: int = 64,
                         device: str = "cpu") -> tuple[float, int]:
    """Top-1 of `model` (on `device`) on an ImageFolder, and how many images it holds."""
    dataset, _ = open_image_folder(root, eval_transform(model, (size, size)))
    correct = 0
    with torch.inference_mode():
        for images, labels in image_loader(dataset, batch_size):
            correct += int((model(images.to(device)).argmax(-1).cpu() == labels).sum())
    return correct / len(dataset), len(dataset)
