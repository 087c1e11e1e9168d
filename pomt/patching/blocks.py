"""Forwards of the blocks that prune, and the class swap that installs them on one block instance.

A patched block becomes an instance of a subclass of its own class (timm `Block`, the DINOv2 authors'
`Block`/`NestedTensorBlock`) whose forward runs the block's own modules (norm1, attn, ls1, drop_path1,
norm2, mlp, ls2, drop_path2) and removes tokens after the attention residual, before the MLP.
Token order after a pruning block: prefix tokens, then the kept patch tokens in their original order,
then (pomt only) the fused token. ToMe (the published algorithm, see tome.py): prefix tokens, the
unmerged set-A tokens, then the set-B tokens, sets alternating over all tokens; every block after the
first merge runs proportional attention (log token size added to its attention logits).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from pomt.errors import PatchError, ScheduleError
from pomt.models.family import PATCHED_FROM, check_block
from pomt.patching import attention, scores
from pomt.patching.plan import removed_at
from pomt.patching.tome import bipartite_matching, merge_weighted

STATE_ATTR = "_pomt_patch"


@dataclass(eq=False)
class PatchState:
    """Everything the patches of one model share; hung on the model as `STATE_ATTR`."""

    method: str
    removal: dict[int, int]
    prefix_tokens: int
    seed: int = 0
    batch_size: int | None = None
    strict: bool = False
    originals: dict[int, type] = field(default_factory=dict)
    model_class: type | None = None  # ToMe: the model's class before its pooling was weighted by size
    size: torch.Tensor | None = None  # ToMe: tokens merged into each token (B, T, 1), prefix included
    bias: torch.Tensor | None = None  # ToMe: log(size) as an attention bias (B, 1, 1, T)
    _generators: dict[str, torch.Generator] = field(default_factory=dict, repr=False)
    _batch_warned: bool = False

    def generator(self, device: torch.device) -> torch.Generator:
        """One seeded generator per device, created on first use."""
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[key]

    def check_batch(self, batch: int) -> None:
        """Warn once (or raise, when strict) if the batch differs from the schedule's."""
        if self.batch_size is None or batch == self.batch_size or (self._batch_warned and not self.strict):
            return
        message = f"schedule was made for batch size {self.batch_size}, the model now runs batch {batch}"
        if self.strict:
            raise ScheduleError(message + " (strict)")
        self._batch_warned = True
        warnings.warn(message, stacklevel=4)


@dataclass(eq=False)
class BlockPlan:
    """What one patched block does: `run(block, x, plan)` removing `remove` tokens."""

    run: Callable[[nn.Module, torch.Tensor, BlockPlan], torch.Tensor]
    remove: int
    state: PatchState
    first: bool = False
    resets: bool = False


def _mlp_residual(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = block.mlp(block.norm2(x))
    return x + attention.call_layer(block.drop_path2, attention.call_layer(block.ls2, out))


def _attn_residual(block: nn.Module, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return x + attention.call_layer(block.drop_path1, attention.call_layer(block.ls1, out))


def _kept(x: torch.Tensor, plan: BlockPlan) -> int:
    patch_tokens = x.shape[1] - plan.state.prefix_tokens
    return patch_tokens - removed_at(plan.state.method, patch_tokens, plan.remove)


def run_pomt(block: nn.Module, x: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """Explicit attention, over chunks of query rows where the whole matrix would be large
    (`attention.query_chunks`); keep the best patch tokens, fuse the other R + 1 into their mean."""
    prefix, attn = plan.state.prefix_tokens, block.attn
    keep = _kept(x, plan) - 1
    y = block.norm1(x)
    q, k, v = attention.split_heads(attn, y)
    outs, received = [], None
    for start, stop in attention.query_chunks(q, k.shape[2]):
        probs = attention.probabilities(attn, q[:, :, start:stop], k)
        outs.append(attention.apply_probabilities(attention.call_layer(attn.attn_drop, probs), v))
        part = scores.attention_received(probs, prefix, start)
        received = part if received is None else received + part
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    x = _attn_residual(block, x, attention.project(attn, out, y))
    kept, dropped = scores.split_best(scores.pomt_scores(received, v, prefix), keep)
    return _mlp_residual(block, scores.keep_and_fuse(x, prefix, kept, dropped))


def run_topk(block: nn.Module, x: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """Fused attention plus the class-token row computed explicitly; keep the most attended tokens."""
    prefix, attn = plan.state.prefix_tokens, block.attn
    keep = _kept(x, plan)
    y = block.norm1(x)
    q, k, v = attention.split_heads(attn, y)
    cls_probs = attention.probabilities(attn, q[:, :, :1], k)
    x = _attn_residual(block, x, attention.project(attn, attention.fused(attn, q, k, v), y))
    kept = scores.best_indices(scores.class_attention_scores(cls_probs, prefix), keep)
    return _mlp_residual(block, scores.gather_kept(x, prefix, kept))


def run_l2norm(block: nn.Module, x: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """The block's own attention; keep the patch tokens with the largest feature norm."""
    prefix = plan.state.prefix_tokens
    keep = _kept(x, plan)
    x = _attn_residual(block, x, block.attn(block.norm1(x)))
    kept = scores.best_indices(scores.l2norm_scores(x, prefix), keep)
    return _mlp_residual(block, scores.gather_kept(x, prefix, kept))


def run_random(block: nn.Module, x: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """The block's own attention; keep a seeded uniform random subset of patch tokens per sample."""
    state = plan.state
    keep = _kept(x, plan)
    x = _attn_residual(block, x, block.attn(block.norm1(x)))
    prefix = state.prefix_tokens
    noise = scores.random_scores(x.shape[0], x.shape[1] - prefix, state.generator(x.device), x.device)
    return _mlp_residual(block, scores.gather_kept(x, prefix, scores.best_indices(noise, keep)))


def _tome_attention(
    block: nn.Module, x: torch.Tensor, state: PatchState
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention residual with proportional attention (log token size added to the logits); returns keys."""
    attn = block.attn
    y = block.norm1(x)
    q, k, v = attention.split_heads(attn, y)
    out = attention.fused(attn, q, k, v, state.bias)
    return _attn_residual(block, x, attention.project(attn, out, y)), k


def run_tome(block: nn.Module, x: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """Merge up to `remove` token pairs after the attention residual (bipartite soft matching on the
    keys, mean over heads; prefix tokens protected; size-weighted average)."""
    state, prefix = plan.state, plan.state.prefix_tokens
    if plan.resets:
        state.size = state.bias = None
    x, k = _tome_attention(block, x, state)
    r = removed_at("tome", x.shape[1] - prefix, plan.remove)
    if r:
        size = state.size if state.size is not None else torch.ones_like(x[..., :1])
        x, size = merge_weighted(x, size, bipartite_matching(k.mean(dim=1), r, prefix))
        state.size, state.bias = size, size.log().transpose(1, 2).unsqueeze(1)
    return _mlp_residual(block, x)


def run_proportional(block: nn.Module, x: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """A block after a ToMe merge: no removal, but attention weighted by token size."""
    x, _ = _tome_attention(block, x, plan.state)
    return _mlp_residual(block, x)


RUNS: dict[str, Callable[[nn.Module, torch.Tensor, BlockPlan], torch.Tensor]] = {
    "pomt": run_pomt,
    "topk": run_topk,
    "tome": run_tome,
    "l2norm": run_l2norm,
    "random": run_random,
}


def build_plans(state: PatchState, depth: int) -> dict[int, BlockPlan]:
    """The blocks to patch: those that remove tokens, plus (ToMe) every block after the first merge."""
    if not state.removal:
        return {}
    first = min(state.removal)
    plans = {block: BlockPlan(RUNS[state.method], remove, state) for block, remove in state.removal.items()}
    if state.method == "tome":
        plans[first].resets = True
        for block in range(first + 1, depth):
            plans.setdefault(block, BlockPlan(run_proportional, 0, state))
    plans[first].first = True
    return dict(sorted(plans.items()))


def _pruning_forward(self, x, attn_mask=None, is_causal=False):
    """Forward of a patched block: one (B, N, C) tensor in, fewer tokens out."""
    if not isinstance(x, torch.Tensor) or attn_mask is not None or is_causal:
        raise PatchError(
            "a pruning block takes one (B, N, C) tensor: attention masks and nested lists are unsupported"
        )
    plan = self._pomt_plan
    if plan.first:
        plan.state.check_batch(x.shape[0])
    return plan.run(self, x, plan)


_PATCHED_CLASSES: dict[type, type] = {}


def is_patched(block: nn.Module) -> bool:
    """Whether `block` runs a pomt pruning forward now."""
    return type(block) in _PATCHED_CLASSES.values()


def install(block: nn.Module, plan: BlockPlan) -> type:
    """Swap `block` to the pruning subclass of its class; returns the original class."""
    original = type(block)
    if is_patched(block):
        raise PatchError("block is already patched; unpatch the model first")
    check_block(block)
    if original not in _PATCHED_CLASSES:
        name = f"Pruning{original.__name__}"
        _PATCHED_CLASSES[original] = type(name, (original,), {"forward": _pruning_forward, PATCHED_FROM: original})
    block._pomt_plan = plan
    block.__class__ = _PATCHED_CLASSES[original]
    return original


def uninstall(block: nn.Module, original: type) -> None:
    """Give `block` back its original class and remove the plan."""
    block.__class__ = original
    if "_pomt_plan" in block.__dict__:
        del block.__dict__["_pomt_plan"]
