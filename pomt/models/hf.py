"""Hugging Face transformers vision models: ViT (and ViTForImageClassification), CLIP's and SigLIP's vision towers,
DINOv2 (with registers too). Names that build each from its default configuration with random weights (`hf-*`), a
local model folder (config.json and weights, as `save_pretrained` writes them), and where their tokens live.

pomt builds them wrapped in `HFVision`, whose forward returns one tensor (logits, image embeddings or the pooled
output); `pomt.patch` also takes a transformers model a user built. transformers is the optional `[hf]` extra,
imported only here and only when an HF model is asked for."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from pomt.errors import PatchError, UnknownModelError, WeightsError

PREFIX = "hf-"
EXTRA = 'needs the [hf] extra: pip install "pomt[hf]"'
SIZES = {"tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12)}  # width, depth, heads


@dataclass(frozen=True)
class Spec:
    """One supported transformers class: its config class, its model class, what its forward's tensor is."""

    config: str
    model: str
    output: str  # the field of the model's output that HFVision returns
    options: dict = field(default_factory=dict)


SPECS = {
    "vit": Spec("ViTConfig", "ViTForImageClassification", "logits"),
    "clip": Spec("CLIPVisionConfig", "CLIPVisionModelWithProjection", "image_embeds", {"patch_size": 16}),
    "siglip": Spec("SiglipVisionConfig", "SiglipVisionModel", "pooler_output"),
    "dinov2": Spec("Dinov2Config", "Dinov2Model", "pooler_output", {"patch_size": 14}),
    "dinov2-reg": Spec("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel", "pooler_output",
                       {"patch_size": 14, "num_register_tokens": 4}),
}
NAMES = {f"{PREFIX}{family}-{size}": (family, size) for family in SPECS for size in SIZES}
MODEL_TYPES = {"vit": "vit", "clip_vision_model": "clip", "clip": "clip", "siglip_vision_model": "siglip",
               "siglip": "siglip", "dinov2": "dinov2", "dinov2_with_registers": "dinov2-reg"}
OUTPUTS = ("logits", "image_embeds", "pooler_output")


def transformers():
    """The transformers module (UnknownModelError when the [hf] extra is not installed)."""
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise UnknownModelError(f"Hugging Face models {EXTRA}") from exc


class HFVision(nn.Module):
    """A transformers vision model whose forward takes pixels and returns one tensor (`output` of its output)."""

    def __init__(self, hf: nn.Module, name: str, output: str) -> None:
        super().__init__()
        self.hf, self.output = hf, output
        self.pretrained_cfg = {"architecture": name, "input_size": (3, *image_size(hf)),
                               "mean": _processor_stat(hf, "mean"), "std": _processor_stat(hf, "std")}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.hf(pixel_values=x), self.output)


def _processor_stat(hf: nn.Module, which: str) -> tuple[float, float, float]:
    """The image normalisation its family is trained with (CLIP's own; 0.5 for SigLIP; ImageNet's otherwise)."""
    family = family_of(hf)
    if family == "clip":
        return {"mean": (0.4815, 0.4578, 0.4082), "std": (0.2686, 0.2613, 0.2758)}[which]
    if family == "siglip":
        return (0.5, 0.5, 0.5)
    return {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}[which]


def is_hf_name(name: str) -> bool:
    """Whether `name` is an `hf-*` name or a local model folder."""
    return name.startswith(PREFIX) or Path(name).is_dir()


def resolve_hf_name(name: str) -> str:
    """An `hf-*` name checked, or a local folder as its resolved path (UnknownModelError otherwise)."""
    if name.startswith(PREFIX):
        if name not in NAMES:
            raise UnknownModelError(f"unknown model '{name}'; the Hugging Face names: {', '.join(NAMES)}")
        return name
    folder = Path(name)
    if not (folder / "config.json").is_file():
        raise WeightsError(f"model folder {folder} holds no config.json (a Hugging Face model folder, as "
                           "save_pretrained writes it)")
    return str(folder.resolve())


def _config(family: str, size: str, input_size: tuple[int, int] | None, num_classes: int | None):
    spec, (width, depth, heads) = SPECS[family], SIZES[size]
    options = {"hidden_size": width, "num_hidden_layers": depth, "num_attention_heads": heads,
               "intermediate_size": 4 * width, **spec.options}
    if input_size is not None:
        if input_size[0] != input_size[1]:
            raise UnknownModelError(f"Hugging Face vision models take square inputs, not {input_size}")
        options["image_size"] = input_size[0]
    if family == "vit":
        options["num_labels"] = 1000 if num_classes is None else num_classes
    config = getattr(transformers(), spec.config)(**options)
    config._attn_implementation = "sdpa"
    return config


def default_image_size(name: str) -> tuple[int, int]:
    """The input size of an `hf-*` name's default configuration, or of a folder's."""
    if name in NAMES:
        size = _config(*NAMES[name], None, None).image_size
    else:
        config = transformers().AutoConfig.from_pretrained(name, local_files_only=True)
        size = getattr(config, "vision_config", config).image_size
    return (size, size) if isinstance(size, int) else tuple(size)


def build(name: str, input_size: tuple[int, int] | None = None, num_classes: int | None = None,
          seed: int = 0) -> HFVision:
    """The model of an `hf-*` name with seeded random weights, or a local folder's model, in eval mode."""
    if name in NAMES:
        family, _ = NAMES[name]
        config = _config(*NAMES[name], input_size, num_classes)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            hf = getattr(transformers(), SPECS[family].model)(config)
        return HFVision(hf.eval(), name, SPECS[family].output)
    return _from_folder(Path(name), input_size)


def _from_folder(folder: Path, input_size: tuple[int, int] | None) -> HFVision:
    module = transformers()
    try:
        config = module.AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # a config transformers cannot read comes in many types
        raise WeightsError(f"cannot read {folder / 'config.json'}: {type(exc).__name__}: {exc}") from exc
    family = MODEL_TYPES.get(config.model_type)
    if family is None:
        raise UnknownModelError(f"model folder {folder} holds a '{config.model_type}' model; pomt supports "
                                f"{', '.join(sorted(set(MODEL_TYPES)))}")
    size = getattr(getattr(config, "vision_config", config), "image_size", None)
    if input_size is not None and tuple(input_size) != (size, size):
        raise UnknownModelError(f"model folder {folder} is for {size}x{size} px inputs, not {input_size[0]}x"
                                f"{input_size[1]}")
    spec = SPECS[family]
    classes = {"clip": "CLIPVisionModelWithProjection", "siglip": "SiglipVisionModel"}
    model_class = getattr(module, classes.get(family, spec.model))
    try:
        hf = model_class.from_pretrained(folder, local_files_only=True, attn_implementation="sdpa")
    except Exception as exc:  # missing or corrupt weights come in many types
        raise WeightsError(f"cannot load the model in {folder}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
                           ) from exc
    output = spec.output if hasattr(hf, "classifier") or family != "vit" else "pooler_output"
    return HFVision(hf.eval(), folder.name, output)


def is_hf(model: nn.Module) -> bool:
    """Whether `model` is a transformers model or one pomt wrapped."""
    return isinstance(model, HFVision) or type(model).__module__.startswith("transformers.")


def core(model: nn.Module) -> nn.Module:
    """The module of a transformers vision model that holds its embeddings and layers."""
    model = model.hf if isinstance(model, HFVision) else model
    for candidate in (model, getattr(model, "vit", None), getattr(model, "vision_model", None),
                      getattr(model, "dinov2", None)):
        if candidate is not None and getattr(candidate, "embeddings", None) is not None:
            return candidate
    raise PatchError(f"{type(model).__name__} has no embeddings: not a transformers vision model pomt supports")


def layer_container(model: nn.Module) -> tuple[nn.Module, str]:
    """The module holding a transformers vision model's layers and the attribute they are under."""
    inner = core(model)
    for owner in (inner, getattr(inner, "encoder", None)):
        for name in ("layers", "layer"):
            if isinstance(getattr(owner, name, None), nn.ModuleList):
                return owner, name
    raise PatchError(f"{type(inner).__name__} has no layers: not a transformers vision model pomt supports")


def family_of(model: nn.Module) -> str:
    """"vit", "clip", "siglip", "dinov2" or "dinov2-reg"."""
    config = core(model).config
    return MODEL_TYPES.get(config.model_type, config.model_type)


def image_size(model: nn.Module) -> tuple[int, int]:
    size = core(model).config.image_size
    return (size, size) if isinstance(size, int) else tuple(size)


def layout(model: nn.Module) -> tuple[tuple[int, int], tuple[int, int], int, int, int]:
    """Input size, patch size, width, heads and prefix tokens (class token, registers) of a transformers model."""
    config = core(model).config
    patch = config.patch_size if isinstance(config.patch_size, (tuple, list)) else (config.patch_size,) * 2
    family = family_of(model)
    prefix = 0 if family == "siglip" else 1 + (config.num_register_tokens if family == "dinov2-reg" else 0)
    return image_size(model), tuple(patch), config.hidden_size, config.num_attention_heads, prefix
