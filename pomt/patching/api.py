"""patch / unpatch: put pruning blocks into a ViT and take them out.

Only the blocks that remove tokens are patched, plus the blocks after the first removal where they must follow it
(ToMe's proportional attention; the rotary embedding or relative position bias of the tokens left) and, for ToMe,
the pooling of models that average their tokens or pool them by attention, which ToMe weights by token size;
every other block keeps its class and its model's fused attention. A block
asked to remove 0 tokens is left alone, so the outputs equal the unpatched model's exactly.
Patching a model that is already patched first unpatches it (the new plan replaces the old one).
`support_table()` says which reducers run on which families, found by patching a small removal and running it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pomt.checks import METHODS, check_batch_size, check_method, check_prune_block, check_seed
from pomt.errors import InputSizeError, PatchError, PomtError
from pomt.models.geometry import model_geometry, transformer_blocks
from pomt.models.registry import RANDOM_INIT_SEED, create_model
from pomt.models.tokens import position_kind
from pomt.patching import blocks, pooling
from pomt.patching.blocks import token_counts

STATE_ATTR = blocks.STATE_ATTR


def patch_state(model: nn.Module) -> blocks.PatchState | None:
    """The model's patch state, or None when it is not patched."""
    return model.__dict__.get(STATE_ATTR)


def patch(model: nn.Module, method: str, prune: Mapping[int, int] | int, *, seed: int = 0,
          batch_size: int | None = None, strict: bool = False) -> nn.Module:
    """Patch `model` in place so that block b removes prune[b] tokens with `method`; returns it.

    `prune` maps block index -> tokens to remove there; an int removes that many at every block
    (ToMe style; ToMe merges at most (tokens - prefix tokens) // 2 pairs per block, clamped as ToMe does).
    `seed` seeds the `random` method. With `batch_size`, a forward at another batch size warns once
    (raises PatchError when `strict`).
    """
    check_method(method)
    check_seed(seed)
    if batch_size is not None:
        check_batch_size(batch_size)
    geometry = model_geometry(model)
    removal = resolve_removal(prune, geometry.depth)
    token_counts(geometry.num_tokens, geometry.prefix_tokens, geometry.depth, method, removal)
    model_blocks = transformer_blocks(model)
    state = blocks.PatchState(
        method=method, removal=removal, prefix_tokens=geometry.prefix_tokens, seed=seed,
        batch_size=batch_size, strict=strict, positions=position_kind(model),
        class_token=geometry.prefix_tokens > 0 and getattr(model, "cls_token", True) is not None,
    )
    plans = blocks.build_plans(state, geometry.depth)
    unpatch(model)
    try:
        for index, plan in plans.items():
            state.originals[index] = blocks.install(model_blocks[index], plan)
        if method == "tome" and plans:
            state.pooled = pooling.install_pooling(model)
    except BaseException:
        _restore(model, model_blocks, state)
        raise
    model.__dict__[STATE_ATTR] = state
    return model


def _restore(model: nn.Module, model_blocks: list[nn.Module], state: blocks.PatchState) -> None:
    for index, original in state.originals.items():
        blocks.uninstall(model_blocks[index], original)
    state.originals.clear()
    if state.pooled is not None:
        pooling.uninstall_pooling(*state.pooled)
        state.pooled = None


def resolve_removal(prune: Mapping[int, int] | int, depth: int) -> dict[int, int]:
    """`patch`'s `prune`, checked: {block: tokens removed}, zero entries dropped; an int means every block."""
    if isinstance(prune, bool) or not isinstance(prune, (int, Mapping)):
        raise PatchError(f"prune must be an int or a {{block: remove}} mapping, got {type(prune).__name__}")
    items = {block: prune for block in range(depth)} if isinstance(prune, int) else dict(prune)
    removal: dict[int, int] = {}
    for block, remove in sorted(items.items()):
        check_prune_block(block, depth)
        if isinstance(remove, bool) or not isinstance(remove, int) or remove < 0:
            raise PatchError(f"tokens to remove at block {block} must be an integer >= 0, got {remove!r}")
        if remove:
            removal[block] = remove
    return removal


@contextlib.contextmanager
def patched(model: nn.Module, method: str, prune: Mapping[int, int] | int, **options) -> Iterator[nn.Module]:
    """`model` patched as `patch(model, method, prune, **options)` inside the context, unpatched on leaving."""
    patch(model, method, prune, **options)
    try:
        yield model
    finally:
        unpatch(model)


def unpatch(model: nn.Module) -> nn.Module:
    """Restore the original block and model classes and remove every attribute pomt added; returns it."""
    if not isinstance(model, nn.Module):
        raise PatchError(f"unpatch takes the model patch() was given, a torch module, not {type(model).__name__}")
    state = model.__dict__.pop(STATE_ATTR, None)
    if state is not None:
        _restore(model, transformer_blocks(model), state)
    return model

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
