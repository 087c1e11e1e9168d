"""The patched blocks: the removal plan, the pruning forwards, and the class swaps that install them.

A patched block becomes an instance of a subclass of its own class whose forward runs the block's own modules and
removes tokens after the attention residual, before the MLP. Token order after a pruning block: prefix tokens,
the kept patch tokens in their original order, then (pomt only) the fused token; after a ToMe block the order of
`tome.py`, and every block after the first merge runs proportional attention. ToMe on a timm model that averages
its tokens also swaps the model's class, to pool by token size."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from pomt.errors import PatchError, ScheduleError
from pomt.models.family import PATCHED_FROM, check_block
from pomt.patching import attention, scores
from pomt.patching.tome import bipartite_matching, max_merge, merge_weighted

STATE_ATTR = "_pomt_patch"
AVERAGING = ("avg", "avgmax")  # timm's global_pool values that average tokens, which ToMe weights by size


def removed_at(method: str, patch_tokens: int, remove: int) -> int:
    """Tokens actually removed by one block that sees `patch_tokens` patch tokens: ToMe clamps to half the patch
    tokens (its published cap); every other method raises PatchError when no patch token would be left."""
    if method == "tome":
        return min(remove, max_merge(patch_tokens))
    if remove >= patch_tokens:
        raise PatchError(
            f"cannot remove {remove} tokens from {patch_tokens} patch tokens: at least one must stay "
            f"(remove at most {patch_tokens - 1})"
        )
    return remove


def token_counts(num_tokens: int, prefix_tokens: int, depth: int, method: str, removal: Mapping[int, int]) -> list[int]:
    """Tokens entering each block, then the count leaving the last one (depth + 1 values)."""
    counts = [num_tokens]
    for block in range(depth):
        tokens = counts[-1]
        remove = removal.get(block, 0)
        counts.append(tokens - removed_at(method, tokens - prefix_tokens, remove) if remove else tokens)
    return counts


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
    """Explicit attention in chunks of query rows; keep the best patch tokens, fuse the other R + 1 into their mean."""
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


def _tome_attention(block: nn.Module, x: torch.Tensor, state: PatchState) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention residual with proportional attention (log token size added to the logits); returns keys."""
    attn = block.attn
    y = block.norm1(x)
    q, k, v = attention.split_heads(attn, y)
    out = attention.fused(attn, q, k, v, state.bias)
    return _attn_residual(block, x, attention.project(attn, out, y)), k


def run_tome(block: nn.Module, x: torch.Tensor, plan: BlockPlan) -> torch.Tensor:
    """Merge up to `remove` token pairs after the attention residual (bipartite soft matching on the keys)."""
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
        raise PatchError("a pruning block takes one (B, N, C) tensor: attention masks and nested lists are unsupported")
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


_POOLED_CLASSES: dict[type, type] = {}


def _size_weighted_pool(self, x: torch.Tensor, pool_type: str | None = None) -> torch.Tensor:
    """timm's `pool` with the token mean weighted by the sizes of the last ToMe forward."""
    pool_type = self.global_pool if pool_type is None else pool_type
    size = self.__dict__[STATE_ATTR].size
    if size is None or pool_type not in AVERAGING or self.attn_pool is not None or size.shape[1] != x.shape[1]:
        return super(type(self), self).pool(x, pool_type)
    start = 0 if self.pool_include_prefix else self.num_prefix_tokens
    x, size = x[:, start:], size[:, start:].to(x.dtype)
    mean = (x * size).sum(dim=1) / size.sum(dim=1)
    return mean if pool_type == "avg" else 0.5 * (x.amax(dim=1) + mean)


def averages_tokens(model: nn.Module) -> bool:
    """Whether `model` is a timm VisionTransformer whose head averages its tokens."""
    from timm.models.vision_transformer import VisionTransformer

    return (
        isinstance(model, VisionTransformer)
        and getattr(model, "global_pool", None) in AVERAGING
        and getattr(model, "attn_pool", None) is None
    )


def install_pooling(model: nn.Module) -> type | None:
    """Swap `model` to its size-weighted pooling subclass; returns the original class, or None if unchanged."""
    if not averages_tokens(model):
        return None
    original = type(model)
    if original not in _POOLED_CLASSES:
        name = f"SizePooled{original.__name__}"
        _POOLED_CLASSES[original] = type(name, (original,), {"pool": _size_weighted_pool})
    model.__class__ = _POOLED_CLASSES[original]
    return original


def uninstall_pooling(model: nn.Module, original: type) -> None:
    """Give `model` back its original class."""
    model.__class__ = original
