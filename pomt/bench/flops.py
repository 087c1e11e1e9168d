"""FLOPs of a forward, counted by `torch.utils.flop_counter`, and the amount that matches a FLOP target.

A matmul of (M, K) by (K, N) counts 2·M·N·K; element-wise work (norms, softmax, GELU, gathers) counts 0.
CPU attention (`_scaled_dot_product_flash_attention_for_cpu`) is not in torch's FLOP registry, so it is
registered here with torch's own SDPA formula. The tests check the counts against a hand-written formula.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.utils import flop_counter

_ATEN = torch.ops.aten


def _extra_formulas() -> dict:
    """FLOP formulas for attention ops that torch's registry lacks (CPU flash attention)."""
    extra = {}
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_fused_attention_overrideable",
    ):
        op = getattr(_ATEN, name, None)
        if op is not None and op not in flop_counter.flop_registry:
            extra[op] = _sdpa_flops
    return extra


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's SDPA count (q·kᵀ and probs·v); FlopCounterMode passes shapes, not tensors."""
    return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of `model(x)` as counted by `FlopCounterMode` (with CPU attention included)."""
    with (
        torch.inference_mode(),
        flop_counter.FlopCounterMode(display=False, custom_mapping=_extra_formulas()) as mode,
    ):
        model(x)
    return int(mode.get_total_flops())


def meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy whose parameters and buffers are on the meta device: shapes without data, so counting
    its FLOPs does no arithmetic (the same cost at any model or input size) and copies no weights."""
    tensors = [*model.parameters(), *model.buffers()]
    memo = {
        id(t): nn.Parameter(t.detach().to("meta"), t.requires_grad) if isinstance(t, nn.Parameter) else t.to("meta")
        for t in tensors
    }
    return copy.deepcopy(model, memo)


def match_amount(flops_at: Callable[[int], float], target: float, low: int, high: int) -> int:
    """The amount in [low, high] whose FLOPs are closest to `target`, for FLOPs non-increasing in amount.

    Bisection: about log2(high - low) calls of `flops_at`.
    """
    if low > high:
        raise ValueError(f"empty amount range [{low}, {high}]")
    lo, hi = low, high
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if flops_at(mid) > target:
            lo = mid
        else:
            hi = mid
    return min((lo, hi), key=lambda amount: abs(flops_at(amount) - target))
