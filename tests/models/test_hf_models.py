"""Hugging Face transformers vision models: pomt's `hf-*` names, local model folders, their geometry, bad input, and
an HF ViT holding a timm ViT's weights giving the timm ViT's logits under every reducer."""

from __future__ import annotations

import subprocess
import sys

import pytest
import timm
import torch

from pomt.errors import UnknownModelError, WeightsError
from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.models.registry import PomtWarning, architecture, create_model, default_input_size, resolve_model_name
from pomt.patching import METHODS, patched

from conftest import ROOT

transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install 'pomt[hf]'")

SIZE = 64


@pytest.mark.parametrize(("name", "prefix", "output"), [
    ("hf-vit-tiny", 1, (2, 10)), ("hf-clip-tiny", 1, (2, 512)), ("hf-siglip-tiny", 0, (2, 192)),
])
def test_each_name_builds_its_class_from_the_default_configuration(name, prefix, output):
    model = create_model(name, SIZE, num_classes=10)
    geometry = model_geometry(model)
    assert (geometry.input_size, geometry.prefix_tokens, geometry.embed_dim, geometry.depth) == ((SIZE, SIZE), prefix,
                                                                                                  192, 12)
    assert geometry.model == name == architecture(name) and len(transformer_blocks(model)) == 12
    assert default_input_size(name) == (224, 224)
    assert model(torch.randn(2, 3, SIZE, SIZE)).shape == output


def test_dinov2_with_registers_counts_them_as_prefix_tokens():
    geometry = model_geometry(create_model("hf-dinov2-reg-tiny", 56))
    assert (geometry.patch_size, geometry.prefix_tokens, geometry.num_tokens) == ((14, 14), 5, 21)


def test_random_weights_are_the_same_in_every_build_and_a_pretrained_ask_warns():
    x = torch.randn(1, 3, SIZE, SIZE)
    with pytest.warns(PomtWarning, match="random init"):
        again = create_model("hf-siglip-tiny", SIZE, pretrained=True)
    assert torch.equal(create_model("hf-siglip-tiny", SIZE)(x), again(x))


def test_a_saved_folder_loads_as_the_model_it_was(tmp_path):
    model = create_model("hf-dinov2-tiny", 56)
    model.hf.save_pretrained(tmp_path / "mine")
    loaded = create_model(str(tmp_path / "mine"))
    x = torch.randn(2, 3, 56, 56)
    assert torch.equal(loaded(x), model(x)) and architecture(str(tmp_path / "mine")) == "mine"
    assert model_geometry(loaded).model == "mine"
    with pytest.raises(UnknownModelError, match="for 56x56 px inputs"):
        create_model(str(tmp_path / "mine"), 112)


def test_bad_names_and_folders_say_what_is_wrong(tmp_path):
    with pytest.raises(UnknownModelError, match="hf-vit-base"):
        resolve_model_name("hf-vit-huge")
    with pytest.raises(WeightsError, match="no config.json"):
        create_model(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(UnknownModelError, match="'bert' model; pomt supports"):
        create_model(str(tmp_path))
    saved = tmp_path / "broken"
    create_model("hf-vit-tiny", SIZE).hf.save_pretrained(saved)
    next(saved.glob("*.safetensors")).write_bytes(b"not weights")
    with pytest.raises(WeightsError, match="cannot load the model"):
        create_model(str(saved))
    with pytest.raises(WeightsError, match="model folder"):
        create_model("hf-vit-tiny", SIZE, checkpoint=tmp_path / "weights.pth")


def test_without_transformers_an_hf_name_is_one_line_naming_the_extra():
    script = "import sys; sys.modules['transformers'] = None; from pomt.cli.app import main; main(sys.argv[1:])"
    result = subprocess.run([sys.executable, "-c", script, "model", "hf-vit-tiny"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
    assert 'pip install "pomt[hf]"' in result.stderr


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
