"""Small transformers vision models built directly from their classes (random weights, no pomt in between), and
image+text models saved as their folders."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
         "image_size": 32, "patch_size": 8}
RAW_CLASSES = ("ViTModel", "ViTForImageClassification", "CLIPVisionModel", "CLIPVisionModelWithProjection",
               "SiglipVisionModel", "Dinov2Model", "Dinov2WithRegistersModel")


def raw_model(class_name: str) -> nn.Module:
    """transformers' `class_name` at a 2-layer, 32-wide configuration, 32 px with 8 px patches, in eval mode."""
    import transformers

    model_class = getattr(transformers, class_name)
    torch.manual_seed(0)
    return model_class(model_class.config_class(**SMALL)).eval()


def save_image_text_model(kind: str, folder: Path, image_size: int) -> nn.Module:
    """A small CLIPModel ("clip") or SiglipModel ("siglip") saved to `folder` with save_pretrained; returned."""
    import transformers

    text = {key: SMALL[key] for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                        "intermediate_size")}
    vision = {**text, "image_size": image_size, "patch_size": 16}
    torch.manual_seed(0)
    if kind == "clip":
        model = transformers.CLIPModel(transformers.CLIPConfig(vision_config=vision, text_config=text,
                                                               projection_dim=16))
    else:
        model = transformers.SiglipModel(transformers.SiglipConfig(vision_config=vision, text_config=text))
    model.eval().save_pretrained(folder)
    return model
