"""Top-1 predictions of many candidates on one image batch, sharing the blocks before each one prunes.

For a timm `VisionTransformer` (its own forward), the embedding and the blocks before a candidate's first
pruning block are what the unpruned model computes: they run once per batch, and every candidate whose
first pruning block is b continues from the hidden state entering b, patched (`pomt.patch`), through the
rest of the model (blocks b.., final norm, head). The blocks are the model's own modules called in the
model's own order, so the logits equal the patched model's own forward exactly. Only one hidden state is
held at a time. Other models run each candidate through its own patched forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from pomt.errors import DatasetError
from pomt.frontier.candidates import NONE, Candidate
from pomt.models.geometry import transformer_blocks
from pomt.patching import patch, unpatch
from pomt.stats import Proportion


def shares_prefix(model: nn.Module) -> bool:
    """Whether the model's forward is timm VisionTransformer's own (embedding, blocks, norm, head)."""
    kind = type(model)
    return (isinstance(model, VisionTransformer) and kind.forward is VisionTransformer.forward
            and kind.forward_features is VisionTransformer.forward_features
            and not getattr(model, "grad_checkpointing", False))


def _embed(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:
    """What `forward_features` computes before its blocks."""
    x = model._pos_embed(model.patch_embed(images))
    return model.norm_pre(model.patch_drop(x))


def _finish(model: VisionTransformer, hidden: torch.Tensor, block: int) -> torch.Tensor:
    """Logits of the model from the hidden state entering `block` (blocks `block`.., norm, head)."""
    for layer in model.blocks[block:]:
        hidden = layer(hidden)
    return model.forward_head(model.norm(hidden))


def _logits(model: nn.Module, candidate: Candidate, run) -> torch.Tensor:
    """`run()` on the model patched with the candidate (unpatched again afterwards)."""
    if not candidate.unpruned:
        patch(model, candidate.method, candidate.as_dict())
    try:
        out = run()
    finally:
        unpatch(model)
    return out[0] if isinstance(out, (tuple, list)) else out


def candidate_logits(model: nn.Module, candidates: Sequence[Candidate], images: torch.Tensor,
                     share: bool | None = None) -> dict[Candidate, torch.Tensor]:
    """{candidate: logits} of the model patched with each candidate on `images` (inference mode is the
    caller's). `share` (default: `shares_prefix(model)`) computes the blocks candidates share once."""
    unique = list(dict.fromkeys(candidates))
    if not (shares_prefix(model) if share is None else share):
        return {c: _logits(model, c, lambda: model(images)) for c in unique}
    depth = len(transformer_blocks(model))
    starts: dict[int, list[Candidate]] = {}
    for candidate in unique:
        starts.setdefault(depth if candidate.unpruned else candidate.first_block, []).append(candidate)
    predictions: dict[Candidate, torch.Tensor] = {}
    hidden = _embed(model, images)
    for block in range(depth + 1):
        for candidate in starts.get(block, ()):
            predictions[candidate] = _logits(model, candidate, lambda b=block, h=hidden: _finish(model, h, b))
        if block < depth and any(start > block for start in starts):
            hidden = model.blocks[block](hidden)
        elif block < depth:
            break
    return {c: predictions[c] for c in unique}


def _outcomes_of_batch(model: nn.Module, candidates: Sequence[Candidate], images: torch.Tensor,
                       labels: torch.Tensor, agreement: bool, device: str,
                       dtype: torch.dtype | None) -> dict[Candidate, torch.Tensor]:
    """{candidate: whether each image's top-1 is right} on one batch; `NONE` among the candidates."""
    classes = getattr(model, "num_classes", None)
    if not agreement and classes is not None and int(labels.max()) >= classes:
        raise DatasetError(f"the images have more classes than the model's {classes} outputs; use a "
                           "matching checkpoint or unlabelled images (agreement)")
    logits = candidate_logits(model, candidates, images.to(device, dtype))
    top1 = {c: out.argmax(dim=-1) for c, out in logits.items()}
    target = top1[NONE] if agreement else labels.to(device)
    return {c: (top1[c] == target).cpu() for c in candidates}


def image_outcomes(model: nn.Module, candidates: Sequence[Candidate], batches: Iterable, agreement: bool,
                   device: str = "cpu", dtype: torch.dtype | None = None,
                   stop: Callable[[Proportion], bool] | None = None) -> dict[Candidate, torch.Tensor]:
    """{candidate: for each image in order, whether its top-1 equals the label, or with `agreement` the
    unpruned model's top-1} over (images, labels) batches, one batch in memory at a time; the unpruned
    model (`NONE`) always among them. After each batch a candidate whose counts so far (`paired_counts`)
    `stop` accepts is measured no further: its outcomes are those of the images it saw; once every candidate
    asked for has stopped, so does the pass."""
    wanted = list(dict.fromkeys([*candidates, NONE]))
    right: dict[Candidate, list[torch.Tensor]] = {c: [] for c in wanted}
    asked, active = set(candidates), list(wanted)
    with torch.inference_mode():
        for images, labels in batches:
            for candidate, outcome in _outcomes_of_batch(model, active, images, labels, agreement, device,
                                                         dtype).items():
                right[candidate].append(outcome)
            if stop is not None:
                seen = torch.cat(right[NONE])
                active = [c for c in active if c.unpruned or not stop(paired_counts(torch.cat(right[c]), seen))]
                if not any(c in asked for c in active):  # the unpruned model ran only as their reference
                    break
    return {c: torch.cat(r) if r else torch.zeros(0, dtype=torch.bool) for c, r in right.items()}


def paired_counts(outcomes: torch.Tensor, reference: torch.Tensor) -> Proportion:
    """Images right of those seen, with those lost and gained against the `reference` outcomes (the
    unpruned model's on the same images; only as many of them as `outcomes` holds)."""
    reference = reference[: len(outcomes)]
    return Proportion(int(outcomes.sum()), len(outcomes), int((reference & ~outcomes).sum()),
                      int((outcomes & ~reference).sum()))


def count_correct(model: nn.Module, candidates: Sequence[Candidate], batches: Iterable, agreement: bool,
                  device: str = "cpu", dtype: torch.dtype | None = None,
                  stop: Callable[[Proportion], bool] | None = None) -> dict[Candidate, Proportion]:
    """{candidate: its `paired_counts` against the unpruned model} over (images, labels) batches
    (`image_outcomes`, with its `stop`)."""
    right = image_outcomes(model, candidates, batches, agreement, device, dtype, stop)
    return {c: paired_counts(right[c], right[NONE]) for c in dict.fromkeys(candidates)}
