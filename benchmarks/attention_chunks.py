"""What the pomt reducer's chunked attention costs: speed and peak memory against the chunk budget.

The pomt reducer scores tokens on the attention matrix at its block, computed explicitly (timm's fused
attention never holds it). It does so over chunks of query rows whose probabilities take at most a budget of
bytes each (`pomt.patching.attention.query_chunks`): a small budget keeps peak memory near the unpruned
model's, a large one issues fewer, larger kernels. This times pomt at its default budget for the device
(`probs_budget`) and at fixed budgets (0 = the whole matrix in one piece) beside the unpruned model and top-k
removing the same tokens, in interleaved rounds (CUDA events on a GPU), and reads each variant's peak memory
and kernels (GPU) or aten ops (CPU) per forward.
Usage:
    python benchmarks/attention_chunks.py [--model deit_base] [--batch-size 16] [--input-size 448]
        [--remove 392] [--block 3] [--device cuda] [--dtype float32] [--budgets-mb 4 16 64 256 0]
        [--rounds 30] [--calls 3]
"""

from __future__ import annotations

import argparse

import torch
from patch_overhead import twin

from pomt.bench.costs import MB, peak_memory
from pomt.device import resolve_device
from pomt.measurement.timing import interleaved, profile_forward
from pomt.models.registry import create_model
from pomt.patching import attention, patch
from pomt.runtimes import DTYPES

WHOLE = 2**62  # a budget every matrix fits in


def with_budget(fn, budget: int):
    """`fn` run with the chunk budget fixed at `budget` bytes, then the default back."""

    def call():
        default = attention.probs_budget
        attention.probs_budget = lambda _q: budget
        try:
            return fn()
        finally:
            attention.probs_budget = default

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deit_base")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--input-size", type=int, default=448)
    parser.add_argument("--remove", type=int, default=392)
    parser.add_argument("--block", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--budgets-mb", type=float, nargs="+", default=[4, 16, 64, 256, 0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=3, help="calls per timed round")
    args = parser.parse_args()
    device = resolve_device(args.device)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    model = create_model(args.model, pretrained=False, input_size=args.input_size).eval().to(device, dtype)
    x = torch.randn(args.batch_size, 3, args.input_size, args.input_size, device=device, dtype=dtype)
    removal = {args.block: args.remove}
    models = {"unpruned": twin(model), "topk": patch(twin(model), "topk", removal)}
    pomt_model = patch(twin(model), "pomt", removal)
    models["pomt default"] = pomt_model
    fns = {name: (lambda m=m: m(x)) for name, m in models.items()}
    budgets = {"pomt whole" if not mb else f"pomt {mb:g} MB": int(mb * MB) or WHOLE for mb in args.budgets_mb}
    for name, budget in budgets.items():
        fns[name] = with_budget(lambda: pomt_model(x), budget)
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    attn = model.blocks[args.block].attn
    q = torch.empty(args.batch_size, attn.num_heads, tokens, attn.head_dim, dtype=dtype, device=device)
    budgets["pomt default"] = attention.probs_budget(q)
    print(f"{args.model} {args.input_size} px, batch {args.batch_size}, {args.dtype} on {device}; "
          f"remove {args.remove} of {tokens} at block {args.block}; default budget "
          f"{budgets['pomt default'] / MB:.1f} MB; {args.rounds} interleaved rounds x {args.calls} calls")
    stats = interleaved(fns, device, None, args.rounds, args.calls).stats
    base = stats["unpruned"].median_ms
    print(f"{'variant':<16} {'chunks':>6} {'median ms':>10} {'IQR ms':>8} {'speedup':>8} {'vs topk':>8} "
          f"{'peak MB':>8} {'ops/fwd':>8}")
    for name, fn in fns.items():
        chunks = str(len(attention.query_chunks(q, tokens, budgets[name]))) if name in budgets else "-"
        s = stats[name]
        memory = peak_memory(fn, model, device).peak_mb
        ops = profile_forward(fn, device, forwards=1, warmup=1).ops_per_forward
        print(f"{name:<16} {chunks:>6} {s.median_ms:>10.3f} {s.iqr_ms:>8.3f} {base / s.median_ms:>7.3f}x "
              f"{stats['topk'].median_ms / s.median_ms:>7.3f}x {memory or float('nan'):>8.0f} {ops:>8.0f}")


if __name__ == "__main__":
    main()
