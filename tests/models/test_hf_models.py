"""Hugging Face transformers vision models: pomt's `hf-*` names, local model folders, the wrapper's tensor, geometry
of wrapped and raw transformers models, bad input in one line, and an HF ViT holding a timm ViT's weights giving the
timm ViT's logits under every reducer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import timm
import torch

from pomt.errors import InputSizeError, SettingError, UnknownModelError, UnsupportedModelError, WeightsError
from pomt.models import hf
from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.models.registry import (
    PomtWarning,
    architecture,
    create_model,
    default_input_size,
    geometry_of,
    resolve_model_name,
)
from pomt.models.tokens import last_blocks, truncate_tokens
from pomt.patching import METHODS, patched

from conftest import ROOT
from support.hf_models import RAW_CLASSES, raw_model, save_image_text_model

transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install 'pomt[hf]'")

SIZE = 64


def _small(name: str) -> int:
    return 56 if "dinov2" in name else SIZE


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("name", list(hf.NAMES))
def test_each_name_builds_its_class_with_the_geometry_of_its_configuration(name):
    size = _small(name)
    model = create_model(name, size)
    class_name, options = hf.NAMES[name]
    config, geometry = model.hf.config, model_geometry(model)
    assert type(model.hf).__name__ == class_name and not model.training and config._attn_implementation == "sdpa"
    prefix = 0 if "siglip" in name else 1 + options.get("num_register_tokens", 0)
    patch = options["patch_size"]
    grid = size // patch
    assert (geometry.model, geometry.input_size, geometry.patch_size, geometry.grid) == (name, (size, size),
                                                                                       (patch, patch), (grid, grid))
    assert (geometry.prefix_tokens, geometry.num_tokens) == (prefix, prefix + grid * grid)
    assert (geometry.depth, geometry.embed_dim, geometry.num_heads) == (config.num_hidden_layers, config.hidden_size,
                                                                        config.num_attention_heads)
    owner, attribute = hf.layer_container(model)
    assert transformer_blocks(model) == list(getattr(owner, attribute))
    assert geometry_of(name, size) == geometry and architecture(name) == resolve_model_name(name) == name
    assert default_input_size(name) == (options["image_size"],) * 2
    out = model(torch.randn(2, 3, size, size))
    width = {"ViTForImageClassification": 1000, "CLIPVisionModelWithProjection": 512}.get(class_name,
                                                                                          config.hidden_size)
    assert isinstance(out, torch.Tensor) and out.shape == (2, width)


def test_random_weights_are_the_same_in_every_build_and_a_pretrained_ask_warns():
    x = torch.randn(1, 3, SIZE, SIZE)
    state = torch.get_rng_state()
    with pytest.warns(PomtWarning, match="random init"):
        again = create_model("hf-siglip-tiny", SIZE, pretrained=True)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(create_model("hf-siglip-tiny", SIZE)(x), again(x))


def test_num_classes_sizes_a_classifier_and_is_refused_without_one():
    model = create_model("hf-vit-tiny", SIZE, num_classes=10)
    assert model(torch.randn(1, 3, SIZE, SIZE)).shape == (1, 10) and model.num_classes == 10
    assert create_model("hf-clip-tiny", SIZE).num_classes == 0
    with pytest.raises(SettingError, match="has no classifier"):
        create_model("hf-clip-tiny", SIZE, num_classes=10)


def test_tokens_are_cut_in_the_hidden_states_the_layers_take_positionally():
    model = create_model("hf-dinov2-tiny-reg", 56)  # 5 prefix + 16 patch tokens
    seen = []
    transformer_blocks(model)[-1].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad(), truncate_tokens(model, 9, selection="random"):
        cut = model(x)
    with torch.no_grad(), last_blocks(model, 3):
        model(x)
    assert seen == [9, 21] and cut.shape == (2, 192) and len(transformer_blocks(model)) == 12


@pytest.mark.parametrize("name", ["hf-vit-tiny", "hf-clip-tiny", "hf-siglip-tiny", "hf-dinov2-tiny-reg"])
def test_a_saved_folder_loads_as_the_model_it_was(tmp_path, name):
    size = _small(name)
    model = create_model(name, size)
    model.hf.save_pretrained(tmp_path / "mine")
    folder = str(tmp_path / "mine")
    loaded = create_model(folder)
    x = torch.randn(2, 3, size, size)
    assert type(loaded.hf) is type(model.hf) and torch.equal(loaded(x), model(x))
    assert architecture(folder) == model_geometry(loaded).model == "mine" and resolve_model_name(folder) == folder
    assert geometry_of(folder) == model_geometry(loaded) and default_input_size(folder) == (size, size)
    assert model_geometry(loaded).num_tokens == model_geometry(model).num_tokens


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_an_image_text_folder_loads_its_image_tower(tmp_path, kind):
    full = save_image_text_model(kind, tmp_path / kind, SIZE)
    loaded = create_model(str(tmp_path / kind))
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        want = full.get_image_features(pixel_values=x)
    want = want if isinstance(want, torch.Tensor) else want.pooler_output
    torch.testing.assert_close(loaded(x), want)
    assert model_geometry(loaded).prefix_tokens == (1 if kind == "clip" else 0)


def test_a_folders_preprocessor_sets_the_normalisation(tmp_path):
    create_model("hf-dinov2-tiny", 56).hf.save_pretrained(tmp_path)
    assert create_model(str(tmp_path)).pretrained_cfg["mean"] == timm.data.IMAGENET_DEFAULT_MEAN
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0.25] * 3}))
    assert create_model(str(tmp_path)).pretrained_cfg["std"] == (0.25, 0.25, 0.25)


def test_bad_names_and_folders_say_what_is_wrong_in_one_line(tmp_path):
    with pytest.raises(UnknownModelError) as exc:
        resolve_model_name("hf-vit-huge")
    assert "hf-vit-base" in _one_line(exc) and "hf-dinov2-small-reg" in str(exc.value)
    with pytest.raises(WeightsError) as exc:
        create_model(str(tmp_path))
    assert "no config.json" in _one_line(exc)
    with pytest.raises(InputSizeError) as exc:
        create_model("hf-vit-tiny", (64, 96))
    assert "square" in _one_line(exc)
    with pytest.raises(InputSizeError, match="not divisible"):
        create_model("hf-vit-tiny", 60)
    with pytest.raises(WeightsError, match="model folder"):
        create_model("hf-vit-tiny", SIZE, checkpoint=tmp_path / "weights.pth")


def test_bad_folders_say_what_is_wrong_in_one_line(tmp_path):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    with pytest.raises(UnsupportedModelError) as exc:
        create_model(str(bert))
    assert "BertModel" in _one_line(exc) and "ViTForImageClassification" in str(exc.value)
    saved = tmp_path / "vit"
    create_model("hf-vit-tiny", SIZE, num_classes=10).hf.save_pretrained(saved)
    with pytest.raises(InputSizeError) as exc:
        create_model(str(saved), 128)
    assert "runs at 64x64" in _one_line(exc)
    with pytest.raises(SettingError, match="10 classes"):
        create_model(str(saved), num_classes=5)
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((saved / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["Dinov2Model"],
                                                   "model_type": "dinov2", "patch_size": 16}))
    (other / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    with pytest.raises(WeightsError) as exc:
        create_model(str(other))
    assert "do not fit Dinov2Model" in _one_line(exc)
    (saved / "config.json").write_text("{not json")
    with pytest.raises(WeightsError) as exc:
        create_model(str(saved))
    assert "cannot read" in _one_line(exc)
    (saved / "config.json").write_text(json.dumps(config))
    next(saved.glob("*.safetensors")).write_bytes(b"not weights")
    with pytest.raises(WeightsError) as exc:
        create_model(str(saved))
    assert "cannot load the weights" in _one_line(exc)
    next(saved.glob("*.safetensors")).unlink()
    with pytest.raises(WeightsError) as exc:
        create_model(str(saved))
    assert "cannot load the weights" in _one_line(exc)


def test_a_folder_named_like_a_timm_model_without_config_is_still_the_timm_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deit_tiny").mkdir()
    assert resolve_model_name("deit_tiny") == "deit_tiny_patch16_224"


@pytest.mark.parametrize("class_name", RAW_CLASSES)
def test_geometry_reads_a_transformers_model_a_user_built(class_name):
    model = raw_model(class_name)
    config, geometry = model.config, model_geometry(model)
    prefix = {"SiglipVisionModel": 0, "Dinov2WithRegistersModel": 1 + getattr(config, "num_register_tokens", 0)
              }.get(class_name, 1)
    grid = config.image_size // config.patch_size
    assert (geometry.input_size, geometry.grid, geometry.prefix_tokens, geometry.num_tokens) == (
        (config.image_size,) * 2, (grid, grid), prefix, prefix + grid * grid)
    assert (geometry.depth, geometry.embed_dim, geometry.num_heads) == (2, 32, 2) and geometry.model == class_name
    blocks = transformer_blocks(model)
    assert len(blocks) == 2 and all(type(block).__name__.endswith("Layer") for block in blocks)


def test_without_transformers_an_hf_name_is_one_line_naming_the_extra():
    script = "import sys; sys.modules['transformers'] = None; from pomt.cli.app import main; main(sys.argv[1:])"
    result = subprocess.run([sys.executable, "-c", script, "model", "hf-vit-tiny"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
    assert 'needs the [hf] extra: pip install "pomt[hf]"' in result.stderr


def _hf_twin(timm_model: torch.nn.Module) -> torch.nn.Module:
    """A transformers ViTForImageClassification holding the timm ViT's weights (q/k/v split from timm's qkv)."""
    width, heads = timm_model.embed_dim, timm_model.blocks[0].attn.num_heads
    config = transformers.ViTConfig(image_size=SIZE, patch_size=16, hidden_size=width, num_attention_heads=heads,
                                    num_hidden_layers=len(timm_model.blocks), intermediate_size=4 * width,
                                    layer_norm_eps=1e-6, num_labels=timm_model.num_classes, hidden_act="gelu")
    hf = transformers.ViTForImageClassification(config).eval()
    state = {"vit.embeddings.cls_token": timm_model.cls_token,
             "vit.embeddings.position_embeddings": timm_model.pos_embed,
             "vit.embeddings.patch_embeddings.projection.weight": timm_model.patch_embed.proj.weight,
             "vit.embeddings.patch_embeddings.projection.bias": timm_model.patch_embed.proj.bias,
             "vit.layernorm.weight": timm_model.norm.weight, "vit.layernorm.bias": timm_model.norm.bias,
             "classifier.weight": timm_model.head.weight, "classifier.bias": timm_model.head.bias}
    for i, block in enumerate(timm_model.blocks):
        layer = f"vit.layers.{i}"
        weights, biases = block.attn.qkv.weight.chunk(3), block.attn.qkv.bias.chunk(3)
        for part, weight, bias in zip(("q_proj", "k_proj", "v_proj"), weights, biases, strict=True):
            state[f"{layer}.attention.{part}.weight"], state[f"{layer}.attention.{part}.bias"] = weight, bias
        pairs = {"attention.o_proj": block.attn.proj, "layernorm_before": block.norm1, "layernorm_after": block.norm2,
                 "mlp.fc1": block.mlp.fc1, "mlp.fc2": block.mlp.fc2}
        for name, module in pairs.items():
            state[f"{layer}.{name}.weight"], state[f"{layer}.{name}.bias"] = module.weight, module.bias
    hf.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)
    return hf


@pytest.fixture(scope="module")
def twins():
    torch.manual_seed(0)
    timm_model = timm.create_model("vit_tiny_patch16_224", img_size=SIZE, depth=4, num_classes=10).eval()
    return timm_model, _hf_twin(timm_model)


@pytest.mark.parametrize("method", METHODS)
def test_an_hf_vit_with_a_timm_vits_weights_gives_its_logits_under_every_reducer(twins, method):
    timm_model, hf = twins
    x = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    removal = 2 if method == "tome" else {1: 5, 2: 3}
    with torch.no_grad():
        torch.testing.assert_close(hf(pixel_values=x).logits, timm_model(x), atol=1e-4, rtol=1e-4)
        with patched(timm_model, method, removal, seed=3), patched(hf, method, removal, seed=3):
            want, got = timm_model(x), hf(pixel_values=x).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
