"""Test data made by the tests: a generated ImageFolder and a tiny ViT trained on it in seconds.

Each image is grey noise with one coloured square (the class) at a random patch-aligned position, so the
label lives in a few tokens: random token pruning removes it more often as fewer tokens are kept, and
accuracy falls with n (towards chance, 1/4).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pomt.accuracy import eval_transform, image_loader, open_image_folder
from pomt.models.registry import create_model

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (220, 220, 30)}
MODEL = "test_vit"  # timm's 6-block, 64-wide ViT with 16 px patches
SIZE = 96  # 6 x 6 patches + class token = 37 tokens
SQUARE = 24


def make_image_folder(root: Path, per_class: int = 40, seed: int = 0, labelled: bool = True) -> Path:
    """Write PNGs as class sub-folders (labelled) or all in one folder (unlabelled)."""
    rng = np.random.default_rng(seed)
    for name, colour in COLOURS.items():
        folder = root / name if labelled else root
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = rng.integers(90, 160, size=(SIZE, SIZE, 3), dtype=np.uint8)
            top, left = rng.integers(8, SIZE - SQUARE - 8, size=2)
            image[top : top + SQUARE, left : left + SQUARE] = colour
            Image.fromarray(image).save(folder / f"{name}_{i:03d}.png")
    return root


def train_tiny_vit(root: Path, checkpoint: Path, steps: int = 150, seed: int = 0) -> float:
    """Train test_vit on the folder for a few seconds; save a checkpoint; return its training accuracy."""
    torch.manual_seed(seed)
    model = create_model(MODEL, input_size=SIZE, num_classes=len(COLOURS)).train()
    dataset, _ = open_image_folder(root, eval_transform(model, (SIZE, SIZE)))
    images = torch.stack([dataset[i][0] for i in range(len(dataset))])
    labels = torch.tensor([dataset[i][1] for i in range(len(dataset))])
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = torch.randint(0, len(images), (32,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(images[batch]), labels[batch])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(images).argmax(-1) == labels).float().mean())
    torch.save({"state_dict": model.state_dict()}, checkpoint)
    return accuracy


def loader_for(root: Path, model, batch_size: int = 40):
    dataset, kind = open_image_folder(root, eval_transform(model, (SIZE, SIZE)))
    return image_loader(dataset, batch_size), kind
