"""open_clip image towers as pomt models: `open_clip:NAME` builds `open_clip.create_model(NAME).visual` with seeded
random weights (open_clip's pretrained tags load with open_clip itself). open_clip is not a dependency of pomt; it is
imported only when such a name is asked for."""

from __future__ import annotations

import importlib
import logging

import torch
from torch import nn

from pomt.errors import UnknownModelError, UnsupportedModelError

PREFIX = "open_clip:"


def is_open_clip_name(name: str) -> bool:
    return name.startswith(PREFIX)


def _open_clip():
    try:
        return importlib.import_module("open_clip")
    except ImportError as exc:
        raise UnknownModelError("open_clip models need open_clip: pip install open_clip_torch") from exc


def resolve_open_clip_name(name: str) -> str:
    """`open_clip:NAME` checked against open_clip's model configurations."""
    known = _open_clip().list_models()
    if name[len(PREFIX):] not in known:
        close = [m for m in known if name[len(PREFIX):].lower() in m.lower()][:5]
        hint = f"; closest: {', '.join(PREFIX + m for m in close)}" if close else ""
        raise UnknownModelError(f"unknown model '{name}'{hint}")
    return name


def architecture(name: str) -> str:
    """What outputs are named after: `open_clip_NAME`."""
    return name.replace(":", "_")


def default_input_size(name: str) -> tuple[int, int]:
    """The input size of the model's open_clip configuration."""
    size = _open_clip().get_model_config(name[len(PREFIX):])["vision_cfg"].get("image_size", 224)
    return (size, size) if isinstance(size, int) else tuple(size)


def build(name: str, input_size: tuple[int, int] | None, seed: int) -> nn.Module:
    """The image tower of open_clip's model `name` (with its prefix), random weights seeded by `seed`, eval mode."""
    open_clip = _open_clip()
    options = {} if input_size is None else {"force_image_size": tuple(input_size)}
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # open_clip logs that no pretrained weights were loaded, which is the point
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            visual = open_clip.create_model(name[len(PREFIX):], pretrained=None, **options).visual
    finally:
        logging.disable(previous)
    if type(visual).__name__ != "VisionTransformer":
        raise UnsupportedModelError(f"{name}'s image tower is a {type(visual).__module__}.{type(visual).__name__}; "
                                    "pomt prunes open_clip's VisionTransformer towers (a timm tower: prune its "
                                    "`trunk`, a timm model)")
    visual.pretrained_cfg = {"architecture": architecture(name), "input_size": (3, *visual.image_size),
                             "mean": visual.preprocess_cfg.get("mean", (0.4815, 0.4578, 0.4082)),
                             "std": visual.preprocess_cfg.get("std", (0.2686, 0.2613, 0.2758))}
    return visual.eval()
