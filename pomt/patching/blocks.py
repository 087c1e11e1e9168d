"""The patched blocks: the removal plan, the pruning forwards, and the class swaps that install them.

A patched block becomes an instance of a subclass of its own class whose forward runs the block's own modules and
removes tokens after the attention residual, before the MLP. Token order after a pruning block: prefix tokens,
the kept patch tokens in their original order, then (pomt only) the fused token; after a ToMe block the order of
`tome.py`. Every block after the first removal follows it where the model needs it: proportional attention after
a ToMe merge, and the rotary embedding or relative position bias of the tokens left (`pomt.models.tokens`)."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from pomt.errors import PatchError, ScheduleError
from pomt.models.family import PATCHED_FROM
from pomt.models.tokens import PositionKind, gather_bias, gather_rope, relative_bias, select_positions
from pomt.patching import attention
from pomt.patching.parts import Parts, parts_of
from pomt.patching.tome import bipartite_matching, max_merge, merge_index, merge_weighted

STATE_ATTR = "_pomt_patch"


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
    class_token: bool = True  # the first prefix token is a class token (top-k scores by its attention)
    originals: dict[int, type] = field(default_factory=dict)
    pooled: tuple[nn.Module, type] | None = None  # ToMe: the module pooling by size, and its class before
    size: torch.Tensor | None = None  # ToMe: tokens merged into each token (B, T, 1), prefix included
    bias: torch.Tensor | None = None  # ToMe: log(size) as an attention bias (B, 1, 1, T)
    positions: PositionKind | None = None  # what follows the tokens: a rotary embedding, a relative bias
    index: torch.Tensor | None = None  # the original place of each current token (B, T); None: all in place
    _generators: dict[str, torch.Generator] = field(default_factory=dict, repr=False)
    _batch_warned: bool = False

    def generator(self, device: torch.device) -> torch.Generator:
        """One seeded generator per device, created on first use."""
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[key]

    def track(self, tokens: int, patches: torch.Tensor) -> None:
        """Record that the patch tokens at `patches` (B, K) of `tokens` are those left (positional models)."""
        if self.positions is not None:
            self.index = select_positions(self.index, self.prefix_tokens, patches, tokens)

    def check_batch(self, batch: int) -> None:
        """Warn once (or raise, when strict) if the batch differs from the schedule's."""
        if self.batch_size is None or batch == self.batch_size or (self._batch_warned and not self.strict):
            return
        message = f"schedule was made for batch size {self.batch_size}, the model now runs batch {batch}"
        if self.strict:
            raise ScheduleError(message + " (strict)")
        self._batch_warned = True
        warnings.warn(message, stacklevel=4)


@dataclass(frozen=True)
class BlockInputs:
    """What a block's attention needs besides its tokens: the rotary embedding of its patch tokens and the
    attention bias between its tokens (relative positions), each for the tokens it now holds."""

    rope: torch.Tensor | None = None
    bias: torch.Tensor | None = None


PLAIN = BlockInputs()
Run = Callable[[nn.Module, torch.Tensor, "BlockPlan", BlockInputs], torch.Tensor]


@dataclass(eq=False)
class BlockPlan:
    """What one patched block does: `run(block, x, plan, inputs)` removing `remove` tokens, reaching the block's
    pieces through `parts` (set when the plan is installed)."""

    run: Run
    remove: int
    state: PatchState
    first: bool = False
    resets: bool = False
    parts: Parts = field(default_factory=Parts)


def _attention(block: nn.Module, y: torch.Tensor, plan: BlockPlan, inputs: BlockInputs,
               bias: torch.Tensor | None = None, keys: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention output on normed tokens `y` (fused) with `bias` added, and the keys when computed here; the
    layer's own forward where neither keys nor a bias are needed, so a plain block keeps its model's path."""
    parts = plan.parts
    if inputs is PLAIN and bias is None and not keys:
        return parts.attention(block, y), None
    q, k, v = parts.heads(block, y, inputs.rope)
    total = inputs.bias if bias is None else bias if inputs.bias is None else inputs.bias + bias
    return parts.project(block, attention.fused(q, k, v, parts.scale(block), total), y), k


def _explicit_attention(block: nn.Module, plan: BlockPlan, qkv: tuple[torch.Tensor, ...], bias: torch.Tensor | None,
                        received: Callable[[torch.Tensor, int, int], torch.Tensor]
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention per head in chunks of query rows, and `received(probs, prefix, first_row)` summed over them."""
    (q, k, v), scale, dropout = qkv, plan.parts.scale(block), plan.parts.dropout(block)
    outs, total = [], None
    for start, stop in attention.query_chunks(q, k.shape[2]):
        probs = attention.probabilities(q[:, :, start:stop], k, scale, attention.bias_rows(bias, start, stop))
        outs.append(attention.apply_probabilities(attention.call_layer(dropout, probs), v))
        part = received(probs, plan.state.prefix_tokens, start)
        total = part if total is None else total + part
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)), total


def _kept(x: torch.Tensor, plan: BlockPlan) -> int:
    patch_tokens = x.shape[1] - plan.state.prefix_tokens
    return patch_tokens - removed_at(plan.state.method, patch_tokens, plan.remove)


def run_pomt(block: nn.Module, x: torch.Tensor, plan: BlockPlan, inputs: BlockInputs) -> torch.Tensor:
    """Explicit attention in chunks of query rows; keep the best patch tokens, fuse the other R + 1 into their mean."""
    prefix, parts, tokens = plan.state.prefix_tokens, plan.parts, x.shape[1]
    keep = _kept(x, plan) - 1
    y = parts.norm1(block, x)
    qkv = parts.heads(block, y, inputs.rope)
    out, received = _explicit_attention(block, plan, qkv, inputs.bias, attention.attention_received)
    x = parts.attn_residual(block, x, parts.project(block, out, y))
    kept, dropped = attention.split_best(attention.pomt_scores(received, qkv[2], prefix), keep)
    plan.state.track(tokens, torch.cat([kept, dropped[:, :1]], dim=1))
    return parts.mlp_residual(block, attention.keep_and_fuse(x, prefix, kept, dropped))


def run_topk(block: nn.Module, x: torch.Tensor, plan: BlockPlan, inputs: BlockInputs) -> torch.Tensor:
    """Keep the most attended tokens: by the class token's attention (fused attention plus its one row computed
    explicitly), or without a class token by the attention each token receives (explicit attention in chunks)."""
    prefix, parts, tokens = plan.state.prefix_tokens, plan.parts, x.shape[1]
    keep = _kept(x, plan)
    y = parts.norm1(block, x)
    q, k, v = parts.heads(block, y, inputs.rope)
    if plan.state.class_token:
        scale = parts.scale(block)
        cls_probs = attention.probabilities(q[:, :, :1], k, scale, attention.bias_rows(inputs.bias, 0, 1))
        out = attention.fused(q, k, v, scale, inputs.bias)
        importance = attention.class_attention_scores(cls_probs, prefix)
    else:
        out, importance = _explicit_attention(block, plan, (q, k, v), inputs.bias, attention.mean_attention_received)
    x = parts.attn_residual(block, x, parts.project(block, out, y))
    kept = attention.best_indices(importance, keep)
    plan.state.track(tokens, kept)
    return parts.mlp_residual(block, attention.gather_kept(x, prefix, kept))


def _keep_best(block: nn.Module, x: torch.Tensor, plan: BlockPlan, inputs: BlockInputs,
               score: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The block's own attention, then the patch tokens of the highest `score(x)` kept."""
    parts, state, tokens = plan.parts, plan.state, x.shape[1]
    keep = _kept(x, plan)
    x = parts.attn_residual(block, x, _attention(block, parts.norm1(block, x), plan, inputs)[0])
    kept = attention.best_indices(score(x), keep)
    state.track(tokens, kept)
    return parts.mlp_residual(block, attention.gather_kept(x, state.prefix_tokens, kept))


def run_l2norm(block: nn.Module, x: torch.Tensor, plan: BlockPlan, inputs: BlockInputs) -> torch.Tensor:
    """The block's own attention; keep the patch tokens with the largest feature norm."""
    return _keep_best(block, x, plan, inputs, lambda x: attention.l2norm_scores(x, plan.state.prefix_tokens))


def run_random(block: nn.Module, x: torch.Tensor, plan: BlockPlan, inputs: BlockInputs) -> torch.Tensor:
    """The block's own attention; keep a seeded uniform random subset of patch tokens per sample."""
    state = plan.state

    def noise(x: torch.Tensor) -> torch.Tensor:
        patches = x.shape[1] - state.prefix_tokens
        return attention.random_scores(x.shape[0], patches, state.generator(x.device), x.device)

    return _keep_best(block, x, plan, inputs, noise)


def _following_attention(block: nn.Module, x: torch.Tensor, plan: BlockPlan, inputs: BlockInputs
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention residual with ToMe's proportional attention (log token size added to the logits) and what follows
    the tokens; returns the keys too (as the attention sees them, rotated where the model rotates them)."""
    out, k = _attention(block, plan.parts.norm1(block, x), plan, inputs, plan.state.bias, keys=True)
    return plan.parts.attn_residual(block, x, out), k


def run_tome(block: nn.Module, x: torch.Tensor, plan: BlockPlan, inputs: BlockInputs) -> torch.Tensor:
    """Merge up to `remove` token pairs after the attention residual (bipartite soft matching on the keys)."""
    state, prefix = plan.state, plan.state.prefix_tokens
    if plan.resets:
        state.size = state.bias = None
    x, k = _following_attention(block, x, plan, inputs)
    r = removed_at("tome", x.shape[1] - prefix, plan.remove)
    if r:
        size = state.size if state.size is not None else torch.ones_like(x[..., :1])
        matching = bipartite_matching(k.mean(dim=1), r, prefix)
        if state.positions is not None:
            state.index = merge_index(state.index, matching, x.shape[0], x.shape[1])
        x, size = merge_weighted(x, size, matching)
        state.size, state.bias = size, size.log().transpose(1, 2).unsqueeze(1)
    return plan.parts.mlp_residual(block, x)


def run_follow(block: nn.Module, x: torch.Tensor, plan: BlockPlan, inputs: BlockInputs) -> torch.Tensor:
    """A block after a removal that removes nothing: attention weighted by token size after a ToMe merge, with the
    positions of the tokens left."""
    x, _ = _following_attention(block, x, plan, inputs)
    return plan.parts.mlp_residual(block, x)


RUNS: dict[str, Run] = {
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
    if state.method == "tome" or state.positions is not None:
        for block in range(first + 1, depth):
            plans.setdefault(block, BlockPlan(run_follow, 0, state))
    plans[first].first = True
    return dict(sorted(plans.items()))


_ARGUMENTS: dict[type, tuple[str, ...]] = {}  # a block class's forward parameters after the tokens


def _arguments(block: nn.Module, args: tuple, kwargs: dict) -> dict:
    """The block's forward arguments after the tokens, by name."""
    original = vars(type(block))[PATCHED_FROM]
    if original not in _ARGUMENTS:
        _ARGUMENTS[original] = tuple(inspect.signature(original.forward).parameters)[2:]
    return {**dict(zip(_ARGUMENTS[original], args, strict=False)), **kwargs}


def _inputs(block: nn.Module, state: PatchState, given: dict) -> BlockInputs:
    """The rotary embedding and relative position bias of the tokens the block holds now."""
    if state.positions is None:
        return PLAIN
    rope, index = given.get("rope"), state.index
    if rope is not None and index is not None:
        rope = gather_rope(rope, index, state.prefix_tokens)
    bias = relative_bias(block.attn, given.get("shared_rel_pos_bias"))
    if bias is not None and index is not None:
        bias = gather_bias(bias, index)
    return BlockInputs(rope, bias)


def _pruning_forward(self, x, *args, **kwargs):
    """Forward of a patched block: one (B, N, C) tensor in, fewer tokens out."""
    given = _arguments(self, args, kwargs) if args or kwargs else {}
    masked = given.get("attn_mask") is not None or given.get("attention_mask") is not None or given.get("is_causal")
    if not isinstance(x, torch.Tensor) or masked:
        raise PatchError("a pruning block takes one (B, N, C) tensor: attention masks and nested lists are unsupported")
    plan = self._pomt_plan
    if plan.first:
        plan.state.check_batch(x.shape[0])
        plan.state.index = None
    return plan.run(self, x, plan, _inputs(self, plan.state, given))


_PATCHED_CLASSES: dict[type, type] = {}


def is_patched(block: nn.Module) -> bool:
    """Whether `block` runs a pomt pruning forward now."""
    return type(block) in _PATCHED_CLASSES.values()


def install(block: nn.Module, plan: BlockPlan) -> type:
    """Swap `block` to the pruning subclass of its class; returns the original class."""
    original = type(block)
    if is_patched(block):
        raise PatchError("block is already patched; unpatch the model first")
    plan.parts = parts_of(block)
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
