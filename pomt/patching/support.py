"""Which reducers pomt can run on which ViT families, found by trying: patch a small removal, run one forward.

`reducer_support(model)` answers for one built model; `model_support(name)` builds a small random-weight model of
that name first; `support_table()` answers for the representative models of `FAMILIES`. A cell is None where the
reducer ran, else the one line of the refusal (or of the error that stopped it), so the table follows what
`pomt.patching` and `pomt.models` accept now.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pomt.checks import METHODS
from pomt.errors import InputSizeError, PatchError, PomtError
from pomt.models.geometry import model_geometry
from pomt.models.registry import RANDOM_INIT_SEED, create_model
from pomt.patching.api import patch, patch_state, unpatch

PROBE_SIZE = 112  # pixels a side: a multiple of the patch sizes 7, 8, 14, 16, 28 and 56, small enough to run fast
PROBE_BATCH = 2
PROBE_SEED = 0


@dataclass(frozen=True)
class Family:
    """A model family pomt may prune: a label, representative models, the class they are, the package they need."""

    label: str
    models: tuple[str, ...]
    description: str
    package: str | None = None  # None: a name pomt.models.registry.create_model builds


FAMILIES: tuple[Family, ...] = (
    Family("timm VisionTransformer",
           ("vit_base_patch16_clip_224", "deit3_small_patch16_224", "vit_medium_patch16_reg4_gap_256"),
           "timm.models.vision_transformer.VisionTransformer"),
    Family("timm VisionTransformer without class token",
           ("vit_base_patch16_siglip_224", "vit_base_patch16_siglip_gap_224"),
           "timm.models.vision_transformer.VisionTransformer (class_token=False)"),
    Family("timm Eva (RoPE)", ("eva02_tiny_patch14_224", "vit_small_patch16_dinov3", "vit_small_patch16_rope_224"),
           "timm.models.eva.Eva"),
    Family("timm Beit (relative position bias)", ("beit_base_patch16_224",), "timm.models.beit.Beit"),
    Family("timm NaFlexVit", ("naflexvit_base_patch16_siglip",), "timm.models.naflexvit.NaFlexVit"),
    Family("Hugging Face", ("hf-vit-base", "hf-clip-base", "hf-siglip-base", "hf-dinov2-small"),
           "transformers ViT, CLIP, SigLIP and DINOv2 vision models"),
    Family("DINOv2 authors' models", ("vit_small",), "dinov2.models.vision_transformer.DinoVisionTransformer",
           package="dinov2"),
    Family("open_clip VisionTransformer", ("open_clip:ViT-B-16",), "open_clip.transformer.VisionTransformer"),
)


@dataclass(frozen=True)
class Row:
    """One probed model: its family, name, class description, and each method's refusal (None: it runs)."""

    family: str
    model: str
    description: str
    reducers: dict[str, str | None]

    def to_dict(self) -> dict:
        return {"family": self.family, "model": self.model, "class": self.description, "reducers": self.reducers}


def one_line(exc: BaseException) -> str:
    """An error as one line: a pomt refusal as its message, anything else led by its type (it is not a refusal)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if isinstance(exc, PomtError) or not lines else f"{type(exc).__name__}: {text}"


def probe_removal(method: str, depth: int) -> dict[int, int] | int:
    """The small removal each method is tried with: ToMe 1 token at every block, the others 1 at the first block
    and 1 at the middle one."""
    return 1 if method == "tome" else {0: 1, depth // 2: 1}


def _state_of(model: nn.Module) -> tuple:
    """What probing must leave as it found: module classes, their attributes, the tensors and their versions."""
    modules = tuple((name, type(m), m.training, frozenset(vars(m))) for name, m in model.named_modules())
    tensors = tuple((name, t.data_ptr(), t._version) for name, t in (*model.named_parameters(),
                                                                      *model.named_buffers()))
    return modules, tensors


def _probe_input(model: nn.Module, size: tuple[int, int]) -> torch.Tensor:
    first = next(model.parameters(), None)
    dtype, device = (first.dtype, first.device) if first is not None else (torch.float32, torch.device("cpu"))
    generator = torch.Generator().manual_seed(PROBE_SEED)
    return torch.randn(PROBE_BATCH, 3, *size, generator=generator).to(device=device, dtype=dtype)


def _try(model: nn.Module, method: str, depth: int, x: torch.Tensor) -> str | None:
    try:
        patch(model, method, probe_removal(method, depth))
        with torch.inference_mode():
            model(x)
    except Exception as exc:  # a refusal (PomtError) or a crash: either way the reducer does not run here
        return one_line(exc)
    finally:
        unpatch(model)
    return None


def reducer_support(model: nn.Module, methods: Sequence[str] = METHODS) -> dict[str, str | None]:
    """Each method → None when patching `model` with a small removal and one forward of a random batch of its input
    size run, else the one line that refused it. The model is left unpatched and as it was (checked)."""
    if not isinstance(model, nn.Module):
        raise PatchError(f"reducer_support takes a torch module, not {type(model).__name__}")
    if patch_state(model) is not None:
        raise PatchError("reducer_support takes an unpatched model: unpatch it first")
    try:
        geometry = model_geometry(model)
    except Exception as exc:  # no geometry: no method can be tried
        return dict.fromkeys(methods, one_line(exc))
    before = _state_of(model)
    x = _probe_input(model, geometry.input_size)
    support = {method: _try(model, method, geometry.depth, x) for method in methods}
    if patch_state(model) is not None or _state_of(model) != before:
        raise RuntimeError(f"probing the reducers left {type(model).__name__} changed: unpatch did not restore it")
    return support


def _dinov2(name: str, size: int | None) -> nn.Module:
    log = logging.getLogger("dinov2")  # its import logs that xFormers is missing, which pomt does not need
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        module = importlib.import_module("dinov2.models.vision_transformer")
    finally:
        log.setLevel(level)
    return getattr(module, name)(patch_size=14, img_size=size or 224)


BUILDERS: dict[str, Callable[[str, int | None], nn.Module]] = {"dinov2": _dinov2}


def probe_model(name: str, package: str | None = None) -> nn.Module:
    """The model `name` with random (seeded) weights in eval mode, at PROBE_SIZE where it takes that size, else at its
    own; `package` names a builder of BUILDERS, None pomt's `create_model`."""
    if package is not None and importlib.util.find_spec(package) is None:
        raise PatchError(f"{package} is not installed")
    try:
        return _build(name, package, PROBE_SIZE)
    except (InputSizeError, TypeError, ValueError, RuntimeError, AssertionError):  # a model of one fixed size
        return _build(name, package, None)


def _build(name: str, package: str | None, size: int | None) -> nn.Module:
    if package is None:
        return create_model(name, input_size=size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_INIT_SEED)
        return BUILDERS[package](name, size).eval()


def model_support(name: str, package: str | None = None, methods: Sequence[str] = METHODS) -> dict[str, str | None]:
    """`reducer_support` of `probe_model(name, package)`; a model that cannot be built has its reason in every cell."""
    try:
        model = probe_model(name, package)
    except Exception as exc:  # unknown name, unsupported family, missing extra: the same line for every method
        return dict.fromkeys(methods, one_line(exc))
    return reducer_support(model, methods)


def support_table(families: Iterable[Family] = FAMILIES, methods: Sequence[str] = METHODS) -> list[Row]:
    """One row per representative model of each family, each probed now."""
    return [Row(family.label, name, family.description, model_support(name, family.package, methods))
            for family in families for name in family.models]
