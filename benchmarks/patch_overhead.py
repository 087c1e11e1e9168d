"""Overhead of the pruning patches on this CPU (random-weight deit_small, interleaved timing).

(a) pomt removing R tokens at block 3 vs the ideal: the same model with the tokens simply truncated
    before block 4 (a forward pre-hook on blocks[4]); the gap is the cost of scoring and selecting.
(b) block 3 forced through the pomt pruning path with R = 0 vs the unpatched model. The public API never
    patches a block that removes nothing (so its outputs stay exact); this installs the plan directly.
Every variant is called through `model(x)` on its own deep copy. Usage:
    .venv/bin/python benchmarks/patch_overhead.py [--batch 1 4] [--rounds 40] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy

import timm
import torch
from torch import nn

from pomt.measure import interleaved
from pomt.patching import patch
from pomt.patching.blocks import BlockPlan, PatchState, install, run_pomt

MODEL = "deit_small_patch16_224"
BLOCK = 3
REMOVE = 56


def truncated(model: nn.Module, keep: int, at: int) -> nn.Module:
    """A copy whose block `at` and later see only the first `keep` tokens."""
    model = copy.deepcopy(model)
    model.blocks[at].register_forward_pre_hook(lambda _m, args: (args[0][:, :keep], *args[1:]))
    return model


def forced_pomt_r0(model: nn.Module, at: int) -> nn.Module:
    """A copy whose block `at` runs the pomt pruning path removing 0 tokens."""
    model = copy.deepcopy(model)
    state = PatchState(method="pomt", removal={at: 0}, prefix_tokens=model.num_prefix_tokens)
    install(model.blocks[at], BlockPlan(run_pomt, 0, state, first=True))
    return model


def variants(model: nn.Module, x: torch.Tensor) -> dict[str, object]:
    num_tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    models = {
        "unpatched": copy.deepcopy(model),
        "ideal": truncated(model, num_tokens - REMOVE, BLOCK + 1),
        "pomt": patch(copy.deepcopy(model), "pomt", {BLOCK: REMOVE}),
        "topk": patch(copy.deepcopy(model), "topk", {BLOCK: REMOVE}),
        "pomt_r0": forced_pomt_r0(model, BLOCK),
    }
    return {name: (lambda m=m: m(x)) for name, m in models.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=3, help="calls per timed round")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = timm.create_model(MODEL, pretrained=False).eval()
    comparisons = [("pomt", "ideal"), ("topk", "ideal"), ("pomt_r0", "unpatched")]
    print(f"{MODEL} random weights, cpu, threads={args.threads}, rounds={args.rounds} x {args.calls} calls, "
          f"remove {REMOVE} at block {BLOCK}; goal ratio <= 1.01")
    header = ("batch", "variant / baseline", "median ms", "min ms", "ratio med", "ratio min")
    print("{:>5}  {:<22} {:>18} {:>18} {:>9} {:>9}".format(*header))
    for batch in args.batch:
        x = torch.randn(batch, 3, 224, 224)
        stats = interleaved(variants(model, x), "cpu", args.threads, args.rounds, args.calls).stats
        for name, base in comparisons:
            a, b = stats[name], stats[base]
            print(
                f"{batch:>5}  {name + ' / ' + base:<22} {a.median_ms:>8.2f} / {b.median_ms:<7.2f} "
                f"{a.min_ms:>8.2f} / {b.min_ms:<7.2f} "
                f"{a.median_ms / b.median_ms:>9.4f} {a.min_ms / b.min_ms:>9.4f}"
            )


if __name__ == "__main__":
    main()
