"""Hugging Face transformers vision models as pomt models: `hf-*` names built from a configuration with seeded random
weights, local model folders (config.json and weights, as `save_pretrained` writes them), the `HFVision` wrapper
whose forward returns one tensor, and where a transformers model keeps its layers and tokens.

A folder runs at the input size of its config.json (`image_size`): its position embeddings are for that grid only.
`hf-*` names and folders take square inputs. transformers is the optional [hf] extra: it is imported only inside
the functions that build models, so the rest of pomt runs without it."""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from torch import nn

from pomt.errors import InputSizeError, PatchError, SettingError, UnknownModelError, UnsupportedModelError, WeightsError

PREFIX = "hf-"
EXTRA = 'needs the [hf] extra: pip install "pomt[hf]"'

OUTPUTS = {  # each supported transformers class -> the field of its output HFVision returns
    "ViTForImageClassification": "logits",
    "ViTModel": "pooler_output",
    "CLIPVisionModelWithProjection": "image_embeds",
    "CLIPVisionModel": "pooler_output",
    "SiglipVisionModel": "pooler_output",
    "Dinov2Model": "pooler_output",
    "Dinov2ForImageClassification": "logits",
    "Dinov2WithRegistersModel": "pooler_output",
    "Dinov2WithRegistersForImageClassification": "logits",
}
IMAGE_TOWERS = {"CLIPModel": "CLIPVisionModelWithProjection", "SiglipModel": "SiglipVisionModel"}  # image+text
BY_MODEL_TYPE = {"vit": "ViTModel", "clip": "CLIPVisionModelWithProjection", "clip_vision_model": "CLIPVisionModel",
                 "siglip": "SiglipVisionModel", "siglip_vision_model": "SiglipVisionModel", "dinov2": "Dinov2Model",
                 "dinov2_with_registers": "Dinov2WithRegistersModel"}  # a config.json without `architectures`
TOWERS = ("vit", "vision_model", "dinov2", "dinov2_with_registers")  # where a model keeps its vision transformer
HALF = (0.5, 0.5, 0.5)
NORMALISE = {"vit": (HALF, HALF), "clip_vision_model": (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
             "siglip_vision_model": (HALF, HALF)}  # model_type -> its processor's mean, std; ImageNet's otherwise


SIZES = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12)}  # ViT-Ti/S/B: width, heads (12 layers each)
FAMILIES: tuple[tuple[str, str, dict], ...] = (  # (name pattern, transformers class, its configuration)
    ("hf-vit-{}", "ViTForImageClassification", {"patch_size": 16, "image_size": 224, "num_labels": 1000}),
    ("hf-clip-{}", "CLIPVisionModelWithProjection", {"patch_size": 16, "image_size": 224, "projection_dim": 512}),
    ("hf-siglip-{}", "SiglipVisionModel", {"patch_size": 16, "image_size": 224}),
    ("hf-dinov2-{}", "Dinov2Model", {"patch_size": 14, "image_size": 518}),  # the published grid, 37x37
    ("hf-dinov2-{}-reg", "Dinov2WithRegistersModel", {"patch_size": 14, "image_size": 518, "num_register_tokens": 4}),
)


def _configuration(class_name: str, options: dict, width: int, heads: int) -> dict:
    """12 layers `width` wide with `heads` heads and a 4x MLP (DINOv2's through its own mlp_ratio, 4)."""
    mlp = {} if class_name.startswith("Dinov2") else {"intermediate_size": 4 * width}
    return {"hidden_size": width, "num_attention_heads": heads, "num_hidden_layers": 12, **mlp, **options}


NAMES: dict[str, tuple[str, dict]] = {  # name -> (transformers class, its configuration)
    pattern.format(size): (class_name, _configuration(class_name, options, *SIZES[size]))
    for pattern, class_name, options in FAMILIES for size in SIZES
}


class HFVision(nn.Module):
    """A transformers vision model (`hf`) whose forward takes pixels (B, 3, H, W) and returns one tensor, the field
    `output` of its output: by default the logits of a classifier, CLIP's image embeddings, else the pooled output
    (the token mean where a model has no pooler)."""

    def __init__(self, hf: nn.Module, name: str, output: str | None = None,
                 normalise: tuple[tuple, tuple] | None = None) -> None:
        super().__init__()
        self.hf = hf
        self.output = output or OUTPUTS.get(type(hf).__name__, "pooler_output")
        config = tower(hf).config
        mean, std = normalise or NORMALISE.get(config.model_type, (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD))
        self.num_classes = int(hf.config.num_labels) if self.output == "logits" else 0  # timm's: 0 for features
        self.pretrained_cfg = {"architecture": name, "input_size": (3, *image_size(hf)), "mean": tuple(mean),
                               "std": tuple(std), "interpolation": "bicubic", "crop_pct": 1.0}

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.hf(pixel_values=pixel_values, return_dict=True)
        value = getattr(out, self.output, None)
        return value if value is not None else out.last_hidden_state.mean(dim=1)


def transformers() -> ModuleType:
    """The transformers package (UnknownModelError when the [hf] extra is not installed)."""
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise UnknownModelError(f"Hugging Face models {EXTRA}") from exc


def is_hf_name(name: str) -> bool:
    """Whether `name` is an `hf-*` name or a folder holding a config.json."""
    return name.startswith(PREFIX) or (Path(name) / "config.json").is_file()


def resolve_hf_name(name: str) -> str:
    """An `hf-*` name checked, or a model folder as its absolute path (WeightsError for a folder without config)."""
    if name.startswith(PREFIX):
        if name not in NAMES:
            raise UnknownModelError(f"unknown model '{name}'; the Hugging Face names: {', '.join(NAMES)}")
        return name
    folder = Path(name)
    if not (folder / "config.json").is_file():
        raise WeightsError(f"model folder {folder} holds no config.json (a Hugging Face model folder, as "
                           "save_pretrained writes it)")
    return str(folder.resolve())


def architecture(name: str) -> str:
    """What outputs are named after: the `hf-*` name, or the folder's name."""
    return Path(name).name


def default_input_size(name: str) -> tuple[int, int]:
    """The input size of an `hf-*` name's configuration, or of a folder's config.json."""
    if name in NAMES:
        return _pair(NAMES[name][1]["image_size"])
    _, config = _folder_config(Path(name))
    return _pair(config.image_size)


def build(name: str, input_size: tuple[int, int] | None = None, num_classes: int | None = None,
          seed: int = 0) -> HFVision:
    """In eval mode: an `hf-*` name's model with random weights seeded by `seed` (the caller's generator left as it
    was), or a folder's model with its weights. `num_classes` sizes a classifier's head (a folder's must match)."""
    model_class, config = _config(name, input_size, num_classes)
    if name in NAMES:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            hf = model_class(config)
        return HFVision(hf, name).eval()
    folder = Path(name)
    return HFVision(_load(model_class, config, folder).float(), folder.name, normalise=_processor_stats(folder)).eval()


def skeleton(name: str, input_size: tuple[int, int] | None = None) -> HFVision:
    """The model of `name` on the meta device, without weights: its geometry at no cost."""
    model_class, config = _config(name, input_size, None)
    with torch.device("meta"):
        return HFVision(model_class(config), architecture(name)).eval()


def _config(name: str, input_size: tuple[int, int] | None, num_classes: int | None) -> tuple[type, object]:
    """The transformers class and configuration `name` builds at `input_size`, checked."""
    if input_size is not None and input_size[0] != input_size[1]:
        raise InputSizeError(f"{architecture(name)} takes square inputs, not {input_size[0]}x{input_size[1]}")
    if name not in NAMES:
        model_class, config = _folder_config(Path(name))
        size = _pair(config.image_size)
        if input_size is not None and tuple(input_size) != size:
            raise InputSizeError(f"model folder {name} runs at {size[0]}x{size[1]} (its config.json's image_size), "
                                 f"not {input_size[0]}x{input_size[1]}")
        classes = config.num_labels if OUTPUTS[model_class.__name__] == "logits" else None
        if num_classes is not None and num_classes != classes:
            raise SettingError(f"model folder {name} has {_classes(classes)}; {num_classes} classes do not fit it")
        return model_class, config
    class_name, options = NAMES[name]
    options = dict(options)
    if input_size is not None:
        options["image_size"] = input_size[0]
    if num_classes is not None:
        if OUTPUTS[class_name] != "logits":
            raise SettingError(f"{name} has no classifier: num_classes sizes the head of {_classifier_names()}")
        options["num_labels"] = num_classes
    model_class = getattr(transformers(), class_name)
    return model_class, model_class.config_class(attn_implementation="sdpa", **options)


def _classes(classes: int | None) -> str:
    return "no classifier" if classes is None else f"a classifier of {classes} classes"


def _classifier_names() -> str:
    return ", ".join(name for name, (class_name, _) in NAMES.items() if OUTPUTS[class_name] == "logits")


def _folder_config(folder: Path) -> tuple[type, object]:
    """The supported class a folder's config.json names (by `architectures`, else `model_type`) and its vision
    configuration."""
    module = transformers()
    try:
        config = module.AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # a config transformers cannot read fails in many types
        raise WeightsError(f"cannot read {folder / 'config.json'}: {_first_line(exc)}") from exc
    named = (getattr(config, "architectures", None) or [None])[0]
    class_name = IMAGE_TOWERS.get(named, named) if named else BY_MODEL_TYPE.get(config.model_type)
    if class_name not in OUTPUTS:
        what = named or f"model_type '{config.model_type}'"
        raise UnsupportedModelError(f"model folder {folder} holds a {what}, which pomt does not run; pomt runs "
                                    f"transformers' {', '.join(OUTPUTS)} (and the image tower of CLIPModel, "
                                    "SiglipModel)")
    vision = getattr(config, "vision_config", None)
    if vision is not None:  # an image+text model: its image tower, with the projection it was trained with
        if hasattr(config, "projection_dim"):
            vision.projection_dim = config.projection_dim
        config = vision
    config._attn_implementation = "sdpa"
    return getattr(module, class_name), config


def _load(model_class: type, config: object, folder: Path) -> nn.Module:
    """`model_class` with the folder's weights; WeightsError where they are missing, corrupt or do not fit."""
    try:
        with _quiet(transformers()):
            hf, info = model_class.from_pretrained(folder, config=config, local_files_only=True,
                                                   output_loading_info=True)
    except Exception as exc:  # missing or corrupt weights fail in many types
        raise WeightsError(f"cannot load the weights in {folder} as {model_class.__name__}: {_first_line(exc)}"
                           ) from exc
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise WeightsError(f"the weights in {folder} do not fit {model_class.__name__}: {len(missing)} tensors "
                           f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    return hf


@contextlib.contextmanager
def _quiet(module: ModuleType) -> Iterator[None]:
    """Inside the context transformers neither logs its loading report nor draws progress bars."""
    logging = module.utils.logging
    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _processor_stats(folder: Path) -> tuple[tuple, tuple] | None:
    """The image mean and std of the folder's preprocessor_config.json, where it has one."""
    try:
        processor = json.loads((folder / "preprocessor_config.json").read_text())
        return tuple(processor["image_mean"]), tuple(processor["image_std"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _pair(value) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def is_hf(model: nn.Module) -> bool:
    """Whether `model` is a transformers model or one pomt wrapped (no import of transformers)."""
    return isinstance(model, HFVision) or type(model).__module__.startswith("transformers.")


def tower(model: nn.Module) -> nn.Module:
    """The module of a transformers vision model (or of an HFVision) that holds its embeddings and encoder."""
    module = model.hf if isinstance(model, HFVision) else model
    while module is not None and getattr(module, "embeddings", None) is None:
        module = next((getattr(module, name) for name in TOWERS if isinstance(getattr(module, name, None), nn.Module)),
                      None)
    if module is None:
        raise PatchError(f"{type(model).__name__} has no patch embeddings: not a transformers vision model pomt "
                         "supports")
    return module


def layer_container(model: nn.Module) -> tuple[nn.Module, str]:
    """The module holding a transformers vision model's layers and the attribute they are under: `layers` (ViT in
    transformers 5), `encoder.layer` (DINOv2, ViT before 5), `encoder.layers` (CLIP, SigLIP)."""
    inner = tower(model)
    for owner in (inner, getattr(inner, "encoder", None)):
        for name in ("layers", "layer"):
            if isinstance(getattr(owner, name, None), nn.ModuleList):
                return owner, name
    raise PatchError(f"{type(inner).__name__} has no encoder layers: not a transformers vision model pomt supports")


def image_size(model: nn.Module) -> tuple[int, int]:
    """The input size (H, W) of the model's configuration."""
    return _pair(tower(model).config.image_size)


def prefix_tokens(model: nn.Module) -> int:
    """The class token (ViT, CLIP, DINOv2; none in SigLIP) plus register tokens, as the embeddings hold them."""
    embeddings = tower(model).embeddings
    cls = getattr(embeddings, "cls_token", None) is not None or getattr(embeddings, "class_embedding", None) is not None
    registers = getattr(embeddings, "register_tokens", None)
    return int(cls) + (int(registers.shape[1]) if registers is not None else 0)


def layout(model: nn.Module) -> tuple[tuple[int, int], tuple[int, int], int, int]:
    """Input size, patch size, width and heads of a transformers vision model, from its configuration."""
    config = tower(model).config
    return image_size(model), _pair(config.patch_size), int(config.hidden_size), int(config.num_attention_heads)
