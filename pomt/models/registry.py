"""Model names and creation: timm's registry with short aliases, pretrained / checkpoint / random weights;
the small architectures pomt registers with timm (`pomt_siglip_tiny_*`, for the digits case and the tests); open_clip
image towers by `open_clip:NAME` (open_clip is imported only when such a name is asked for)."""

from __future__ import annotations

import difflib
import importlib
import logging
import socket
import sys
import warnings
from pathlib import Path

import timm
import torch
from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pomt.errors import InputSizeError, PomtError, UnknownModelError, UnsupportedModelError, WeightsError
from pomt.models import hf
from pomt.models.family import check_family, check_family_by_name
from pomt.models.geometry import Geometry, model_geometry

ALIASES: dict[str, str] = {
    "deit_tiny": "deit_tiny_patch16_224",
    "deit_small": "deit_small_patch16_224",
    "deit_base": "deit_base_patch16_224",
    "deit_tiny_distilled": "deit_tiny_distilled_patch16_224",
    "deit_small_distilled": "deit_small_distilled_patch16_224",
    "deit_base_distilled": "deit_base_distilled_patch16_224",
    "vit_tiny": "vit_tiny_patch16_224",
    "vit_small": "vit_small_patch16_224",
    "vit_base": "vit_base_patch16_224",
    "vit_large": "vit_large_patch16_224",
    "dinov2_small": "vit_small_patch14_dinov2",
    "dinov2_base": "vit_base_patch14_dinov2",
    "dinov2_large": "vit_large_patch14_dinov2",
    "dinov2_small_reg": "vit_small_patch14_reg4_dinov2",
    "dinov2_base_reg": "vit_base_patch14_reg4_dinov2",
    "dinov2_large_reg": "vit_large_patch14_reg4_dinov2",
}

HUB_HOST = ("huggingface.co", 443)
MAX_INPUT_SIZE = 4096  # pixels a side: beyond it a ViT's position embedding alone outgrows any machine's memory
RANDOM_INIT_SEED = 0  # random weights are the same in every process


class PomtWarning(UserWarning):
    """A condition the user must know about, printed once as one line by the CLI."""


def resolve_model_name(name: str) -> str:
    """Alias or timm name (optionally with a pretrained `.tag`) → the registered timm architecture name; an `hf-*`
    name or a local Hugging Face model folder as it stands (`pomt.models.hf`)."""
    if not isinstance(name, str):
        raise UnknownModelError(f"a model name must be a string, got {type(name).__name__} {name!r}")
    if hf.is_hf_name(name.strip()):
        return hf.resolve_hf_name(name.strip())
    if is_open_clip_name(name.strip()):
        return resolve_open_clip_name(name.strip())
    base, _, tag = name.strip().partition(".")
    base = ALIASES.get(base, base)
    if not timm.is_model(base):
        if name.strip() and Path(name.strip()).is_dir():
            hf.resolve_hf_name(name.strip())  # a folder without config.json: raises WeightsError
        close = difflib.get_close_matches(base, list(ALIASES) + timm.list_models(), n=5, cutoff=0.5)
        hint = f"; closest: {', '.join(close)}" if close else ""
        raise UnknownModelError(f"unknown model '{name}'{hint}")
    if tag and f"{base}.{tag}" not in timm.list_pretrained(f"{base}.*"):
        known = ", ".join(name.partition(".")[2] for name in timm.list_pretrained(f"{base}.*")) or "none"
        raise UnknownModelError(f"unknown pretrained tag '{tag}' of {base} (its tags: {known})")
    return f"{base}.{tag}" if tag else base


def architecture(name: str) -> str:
    """The timm architecture without its pretrained tag, an `hf-*` name, or a model folder's name (what outputs are
    named after)."""
    resolved = resolve_model_name(name)
    if is_open_clip_name(resolved):
        return open_clip_architecture(resolved)
    return hf.architecture(resolved) if hf.is_hf_name(resolved) else resolved.partition(".")[0]


def normalise_input_size(input_size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    """An int or (H, W) → (H, W); rejects what is not one or two whole numbers of pixels in [1, MAX_INPUT_SIZE]."""
    if input_size is None:
        return None
    size = (input_size, input_size) if isinstance(input_size, int) else input_size
    if not isinstance(size, (tuple, list)) or not all(isinstance(s, int) and not isinstance(s, bool) for s in size):
        raise InputSizeError(f"input size must be an integer or (height, width) in pixels, got {input_size!r}")
    if len(size) != 2 or min(size) < 1:
        raise InputSizeError(f"input size must be positive, got {input_size}")
    if max(size) > MAX_INPUT_SIZE:
        raise InputSizeError(f"input size {input_size} exceeds {MAX_INPUT_SIZE} pixels a side")
    return tuple(size)  # type: ignore[return-value]


def default_input_size(name: str) -> tuple[int, int]:
    """The input size the model's pretrained config was trained at (H, W)."""
    resolved = resolve_model_name(name)
    if hf.is_hf_name(resolved):
        return hf.default_input_size(resolved)
    if is_open_clip_name(resolved):
        return open_clip_input_size(resolved)
    cfg = timm.get_pretrained_cfg(architecture(name))
    _, height, width = cfg.input_size if cfg is not None else (3, 224, 224)
    return height, width


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the weights hub answers at all, so an offline machine fails fast instead of retrying."""
    try:
        with socket.create_connection(HUB_HOST, timeout=timeout_s):
            return True
    except OSError:
        return False


def _checkpoint_state(path: Path) -> dict:
    if not path.is_file():
        raise WeightsError(f"checkpoint file not found: {path}")
    try:
        return timm.models.load_state_dict(str(path), use_ema=True)
    except Exception as exc:  # torch.load raises many types for corrupt files
        raise WeightsError(f"cannot read checkpoint {path}: {type(exc).__name__}: {exc}") from exc


def _classes_in(state: dict) -> int | None:
    weight = state.get("head.weight")
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.ndim == 2 else None


def _load_state(model: nn.Module, state: dict, path: Path) -> None:
    """Load a state dict, resampling position embeddings to the model's grid with timm's own filter."""
    filter_fn = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
    if filter_fn is not None:
        state = filter_fn(state, model)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[1:3]) if len(first) > 1 else first[0]
        raise WeightsError(f"checkpoint {path} does not fit {type(model).__name__}: {detail}") from exc


def create_model(name: str, input_size: int | tuple[int, int] | None = None, pretrained: bool = False,
                 checkpoint: str | Path | None = None, num_classes: int | None = None) -> nn.Module:
    """Create a timm model in eval mode at `input_size`, with weights from the hub, a file, or random init.

    Where pretrained weights cannot be fetched, falls back to random init with one `PomtWarning`; random init is
    seeded (RANDOM_INIT_SEED), so the same model is built in every process. A checkpoint's classifier size is read
    from the checkpoint. A model pomt cannot patch is refused (UnsupportedModelError) before it is built. `hf-*`
    names and Hugging Face model folders build through `pomt.models.hf` (random weights for names)."""
    resolved = resolve_model_name(name)
    if hf.is_hf_name(resolved):
        return _create_hf(resolved, normalise_input_size(input_size), pretrained, checkpoint, num_classes)
    if is_open_clip_name(resolved):
        return _create_open_clip(resolved, normalise_input_size(input_size), pretrained, checkpoint, num_classes)
    check_family_by_name(architecture(resolved))
    size = normalise_input_size(input_size) or default_input_size(resolved)
    kwargs: dict = {"img_size": size}
    state = None
    if checkpoint is not None:
        state = _checkpoint_state(Path(checkpoint))
        classes = _classes_in(state)
        if num_classes is None and classes is not None:
            num_classes = classes
        pretrained = False
    if num_classes is not None:
        kwargs["num_classes"] = num_classes

    model = None
    if pretrained:
        if hub_reachable():
            try:
                model = timm.create_model(resolved, pretrained=True, **kwargs)
            except Exception as exc:  # hub errors come in many types
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            else:
                reason = ""
        else:
            reason = "the weights hub is not reachable"
        if model is None:
            warnings.warn(
                f"pretrained weights for {resolved} unavailable ({reason}); using random init: "
                "accuracy numbers will be meaningless",
                PomtWarning,
                stacklevel=2,
            )
    if model is None:
        with torch.random.fork_rng(devices=[]):  # seeded here, the caller's generator left as it was
            torch.manual_seed(RANDOM_INIT_SEED)
            model = timm.create_model(resolved.partition(".")[0], pretrained=False, **kwargs)
    check_family(model, resolved)
    check_divisible(size, model)
    if state is not None:
        _load_state(model, state, Path(checkpoint))
    return model.eval()


def _create_hf(name: str, size: tuple[int, int] | None, pretrained: bool, checkpoint: str | Path | None,
               num_classes: int | None) -> nn.Module:
    """A Hugging Face model by pomt's name (seeded random weights; a `pretrained` ask warns) or from its folder."""
    if checkpoint is not None:
        raise WeightsError(f"{name}: Hugging Face weights come from a model folder (--model FOLDER), not --checkpoint")
    if pretrained and name in hf.NAMES:
        warnings.warn(f"pretrained weights for {name} do not exist (a configuration of pomt's); using random init: "
                      "accuracy numbers will be meaningless", PomtWarning, stacklevel=3)
    model = hf.build(name, size, num_classes, seed=RANDOM_INIT_SEED)
    check_family(model, name)
    check_divisible(hf.image_size(model), model)
    return model


def _create_open_clip(name: str, size: tuple[int, int] | None, pretrained: bool, checkpoint: str | Path | None,
                      num_classes: int | None) -> nn.Module:
    """An open_clip image tower with seeded random weights (its pretrained weights load with open_clip itself)."""
    if checkpoint is not None or num_classes is not None:
        raise WeightsError(f"{name}: an open_clip image tower takes neither --checkpoint nor a class count here; load "
                           "its weights with open_clip and patch it with pomt.patch")
    if pretrained:
        warnings.warn(f"pretrained weights for {name} load with open_clip, not here; using random init: accuracy "
                      "numbers will be meaningless", PomtWarning, stacklevel=3)
    model = build_open_clip(name, size, RANDOM_INIT_SEED)
    check_family(model, name)
    check_divisible(model_geometry(model).input_size, model)
    return model


def check_divisible(size: tuple[int, int], model: nn.Module) -> None:
    """Raise when the input size is not a multiple of the model's patch size."""
    patch = model_geometry(model).patch_size
    if size[0] % patch[0] or size[1] % patch[1]:
        raise InputSizeError(f"input size {size[0]}x{size[1]} is not divisible by the patch size {patch[0]}x{patch[1]}")


def geometry_of(name: str, input_size: int | tuple[int, int] | None = None) -> Geometry:
    """The token geometry of model `name` at `input_size`, built on the meta device where it can be."""
    resolved = resolve_model_name(name)
    if hf.is_hf_name(resolved):
        model = hf.skeleton(resolved, normalise_input_size(input_size))
        check_divisible(hf.image_size(model), model)
        return model_geometry(model)
    try:
        with torch.device("meta"):
            return model_geometry(create_model(name, input_size))
    except PomtError:
        raise
    except Exception:  # timm entrypoints fail on the meta device in many ways
        return model_geometry(create_model(name, input_size))

def _siglip_tiny(name: str, pool: str, pretrained: bool, kwargs: dict) -> VisionTransformer:
    if pretrained:
        raise RuntimeError(f"{name} has no pretrained weights")
    for timm_only in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # what timm's factory passes
        kwargs.pop(timm_only, None)
    options = {"patch_size": 16, "embed_dim": 192, "depth": 12, "num_heads": 3, "class_token": False,
               "global_pool": pool, **kwargs}
    model = VisionTransformer(**options)
    model.pretrained_cfg = {"architecture": name, "input_size": (3, 224, 224), "mean": (0.5, 0.5, 0.5),
                            "std": (0.5, 0.5, 0.5)}
    return model


@register_model
def pomt_siglip_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """SigLIP's image tower (no class token, an attention-pool MAP head) at ViT-Ti size: 192 wide, 12 blocks, 3
    heads, 16 px patches."""
    return _siglip_tiny("pomt_siglip_tiny_patch16_224", "map", pretrained, kwargs)


@register_model
def pomt_siglip_tiny_gap_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """The same tower averaging its tokens (SigLIP's `gap` variant)."""
    return _siglip_tiny("pomt_siglip_tiny_gap_patch16_224", "avg", pretrained, kwargs)

OPEN_CLIP_PREFIX = "open_clip:"


def is_open_clip_name(name: str) -> bool:
    return name.startswith(OPEN_CLIP_PREFIX)


def _open_clip():
    try:
        return importlib.import_module("open_clip")
    except ImportError as exc:
        raise UnknownModelError("open_clip models need open_clip: pip install open_clip_torch") from exc


def resolve_open_clip_name(name: str) -> str:
    """`open_clip:NAME` checked against open_clip's model configurations."""
    known = _open_clip().list_models()
    if name[len(OPEN_CLIP_PREFIX):] not in known:
        close = [m for m in known if name[len(OPEN_CLIP_PREFIX):].lower() in m.lower()][:5]
        hint = f"; closest: {', '.join(OPEN_CLIP_PREFIX + m for m in close)}" if close else ""
        raise UnknownModelError(f"unknown model '{name}'{hint}")
    return name


def open_clip_architecture(name: str) -> str:
    """What outputs are named after: `open_clip_NAME`."""
    return name.replace(":", "_")


def open_clip_input_size(name: str) -> tuple[int, int]:
    """The input size of the model's open_clip configuration."""
    size = _open_clip().get_model_config(name[len(OPEN_CLIP_PREFIX):])["vision_cfg"].get("image_size", 224)
    return (size, size) if isinstance(size, int) else tuple(size)


def build_open_clip(name: str, input_size: tuple[int, int] | None, seed: int) -> nn.Module:
    """The image tower of open_clip's model `name` (with its prefix), random weights seeded by `seed`, eval mode."""
    open_clip = _open_clip()
    options = {} if input_size is None else {"force_image_size": tuple(input_size)}
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # open_clip logs that no pretrained weights were loaded, which is the point
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            visual = open_clip.create_model(name[len(OPEN_CLIP_PREFIX):], pretrained=None, **options).visual
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
