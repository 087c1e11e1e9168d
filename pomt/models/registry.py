"""Model names and creation: timm's registry with short aliases, pretrained / checkpoint / random weights."""

from __future__ import annotations

import difflib
import socket
import sys
import warnings
from pathlib import Path

import timm
import torch
from torch import nn

from pomt.errors import InputSizeError, PomtError, UnknownModelError, WeightsError
from pomt.models import architectures, hf, openclip  # noqa: F401  (architectures: registered with timm on import)
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
    if openclip.is_open_clip_name(name.strip()):
        return openclip.resolve_open_clip_name(name.strip())
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
    if openclip.is_open_clip_name(resolved):
        return openclip.architecture(resolved)
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
    if openclip.is_open_clip_name(resolved):
        return openclip.default_input_size(resolved)
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
    if openclip.is_open_clip_name(resolved):
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
    model = openclip.build(name, size, RANDOM_INIT_SEED)
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
