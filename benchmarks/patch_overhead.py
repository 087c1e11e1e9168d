"""Overhead of the pruning patches on this CPU (random-weight models, interleaved timing).

Two workloads: deit_small at 224 px removing 56 tokens at block 3 (batches 1 and 4), and the small one
where a reducer's own overhead decides whether pruning pays: deit_tiny at 112 px (N = 50) at batch 1
removing 10 tokens at block 3. For each:
(a) pomt (and topk) removing R tokens at block 3 vs truncation: the same model with the tokens simply
    dropped before block 4 (a forward pre-hook on blocks[4]); the gap is the cost of scoring and selecting.
(b) block 3 forced through the pomt pruning path with R = 0 vs the unpatched model. The public API never
    patches a block that removes nothing (so its outputs stay exact); this installs the plan directly.
Every variant is called through `model(x)` on its own copy; the copies share the weight tensors, so that
no variant gains from where its weights landed in memory (deep copies of one deit_tiny differed by up to
5% here). The aten operators per forward
(torch.profiler, nested calls included) are printed first: unlike times, they do not depend on load.

With `--family`, per model family (deit_small, eva02_small, SigLIP-B, HF ViT-B at their own input size): a method
(pomt by default) removing a quarter of the patch tokens at block 3 against ideal truncation, the same model with
the same token counts dropped (`pomt.models.tokens.dropped_to`, what the latency curve measures), at batches 1 and
16: each side's median and IQR, and the paired ratio with its 95% interval over the interleaved rounds. A family
pomt cannot build or patch prints its one-line refusal. `--family` alone runs every family and no `--case`.
Usage:
    .venv/bin/python benchmarks/patch_overhead.py [--case deit_small deit_tiny_112] [--batch 1 4]
        [--rounds 40] [--calls 3] [--threads 1]
    .venv/bin/python benchmarks/patch_overhead.py --family [deit_small eva02_small siglip_b hf_vit_b]
        [--method pomt] [--batch 1 16] [--rounds 40] [--calls 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
from dataclasses import dataclass

import timm
import torch
from torch import nn

from pomt.checks import METHODS
from pomt.errors import PomtError
from pomt.measurement.robust import paired_effect
from pomt.measurement.timing import interleaved, profile_forward, summarise
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.models.tokens import dropped_to
from pomt.patching import patch, token_counts
from pomt.patching.blocks import BlockPlan, PatchState, install, run_pomt


@dataclass(frozen=True)
class Case:
    """One workload: a model at an input size, R tokens removed at one block, the pomt/truncated goal."""

    model: str
    img_size: int
    block: int
    remove: int
    batches: tuple[int, ...]
    goal: float


CASES = {
    "deit_small": Case("deit_small_patch16_224", 224, 3, 56, (1, 4), 1.01),
    "deit_tiny_112": Case("deit_tiny_patch16_224", 112, 3, 10, (1,), 1.02),
}
COMPARISONS = [("pomt", "truncated"), ("topk", "truncated"), ("pomt_r0", "unpatched")]
FAMILIES = {
    "deit_small": "deit_small_patch16_224",
    "eva02_small": "eva02_small_patch14_224",
    "siglip_b": "vit_base_patch16_siglip_224",
    "hf_vit_b": "hf-vit-base",
}
FAMILY_BLOCK = 3
FAMILY_SHARE = 0.25  # of the patch tokens removed at FAMILY_BLOCK
FAMILY_BATCHES = (1, 16)


def twin(model: nn.Module) -> nn.Module:
    """A deep copy of the modules that shares the parameter and buffer tensors of `model`."""
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def truncated(model: nn.Module, keep: int, at: int) -> nn.Module:
    """A copy whose block `at` and later see only the first `keep` tokens."""
    model = twin(model)
    model.blocks[at].register_forward_pre_hook(lambda _m, args: (args[0][:, :keep], *args[1:]))
    return model


def forced_pomt_r0(model: nn.Module, at: int) -> nn.Module:
    """A copy whose block `at` runs the pomt pruning path removing 0 tokens."""
    model = twin(model)
    state = PatchState(method="pomt", removal={at: 0}, prefix_tokens=model.num_prefix_tokens)
    install(model.blocks[at], BlockPlan(run_pomt, 0, state, first=True))
    return model


def variants(model: nn.Module, case: Case, x: torch.Tensor) -> dict[str, object]:
    num_tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    models = {
        "unpatched": twin(model),
        "truncated": truncated(model, num_tokens - case.remove, case.block + 1),
        "pomt": patch(twin(model), "pomt", {case.block: case.remove}),
        "topk": patch(twin(model), "topk", {case.block: case.remove}),
        "pomt_r0": forced_pomt_r0(model, case.block),
    }
    return {name: (lambda m=m: m(x)) for name, m in models.items()}


def run_case(case: Case, batches: list[int], args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = timm.create_model(case.model, pretrained=False, img_size=case.img_size).eval()
    print(
        f"\n{case.model} at {case.img_size} px, random weights, cpu, threads={args.threads}, "
        f"remove {case.remove} at block {case.block}; goal pomt / truncated <= {case.goal}"
    )
    for batch in batches:
        x = torch.randn(batch, 3, case.img_size, case.img_size)
        fns = variants(model, case, x)
        ops = {name: profile_forward(fn, "cpu", forwards=1, warmup=1).ops_per_forward for name, fn in fns.items()}
        print(f"batch {batch}: aten ops per forward: " + ", ".join(f"{n} {c:.0f}" for n, c in ops.items()))
        stats = interleaved(fns, "cpu", args.threads, args.rounds, args.calls).stats
        print(f"  {'variant / baseline':<22} {'median ms':>18} {'min ms':>18} {'ratio med':>9} {'ratio min':>9}")
        for name, base in COMPARISONS:
            a, b = stats[name], stats[base]
            print(
                f"  {name + ' / ' + base:<22} {a.median_ms:>8.3f} / {b.median_ms:<7.3f} "
                f"{a.min_ms:>8.3f} / {b.min_ms:<7.3f} "
                f"{a.median_ms / b.median_ms:>9.4f} {a.min_ms / b.min_ms:>9.4f}"
            )
        pomt, base = stats["pomt"], stats["truncated"]
        verdict = {
            kind: "met" if ratio <= case.goal else "not met"
            for kind, ratio in (("median", pomt.median_ms / base.median_ms), ("min", pomt.min_ms / base.min_ms))
        }
        print(
            f"  goal pomt / truncated <= {case.goal} over {args.rounds} interleaved rounds x {args.calls} calls: "
            f"median {verdict['median']}, min {verdict['min']}"
        )


def paired_rounds(fns: dict[str, object], threads: int, rounds: int, calls: int) -> dict[str, list[float]]:
    """Per-round mean call time (ms) of each variant: one `interleaved` round at a time, the order reversed every
    round, so that round i of one variant pairs with round i of the others."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        stats = interleaved({name: fns[name] for name in order}, "cpu", threads, 1, calls,
                            warmup=2 if r == 0 else 0).stats
        for name in order:
            times[name].append(stats[name].mean_ms)
    return times


@contextlib.contextmanager
def family_variants(model: nn.Module, method: str, remove: int, x: torch.Tensor):
    """The patched model and its ideal truncation (same counts per block, the tokens simply dropped) as callables."""
    geometry = model_geometry(model)
    removal = {FAMILY_BLOCK: remove}
    counts = token_counts(geometry.num_tokens, geometry.prefix_tokens, geometry.depth, method, removal)
    patched_model = patch(twin(model), method, removal)
    with dropped_to(twin(model), counts[: geometry.depth]) as truncated_model:
        yield {method: lambda: patched_model(x), "truncated": lambda: truncated_model(x)}


def run_family(label: str, args: argparse.Namespace, batches: list[int]) -> None:
    name, method = FAMILIES[label], args.method
    try:
        model = create_model(name)
        geometry = model_geometry(model)
        remove = round(FAMILY_SHARE * geometry.patch_tokens)
        with family_variants(model, method, remove, torch.randn(1, 3, *geometry.input_size)):
            pass  # patching and truncation both accepted before anything is timed
    except PomtError as exc:
        print(f"\n{label} ({name}): refused: {str(exc).splitlines()[0]}")
        return
    size = "x".join(str(s) for s in geometry.input_size)
    print(f"\n{label} ({name}) at {size} px, random weights, cpu, threads={args.threads}: {method} removing "
          f"{remove} of {geometry.num_tokens} tokens at block {FAMILY_BLOCK} vs the same counts truncated")
    print(f"  {'batch':>5}  {method + ' ms (IQR)':>18}  {'truncated ms (IQR)':>18}  "
          f"{method + ' / truncated [95% CI]':>30}")
    for batch in batches:
        x = torch.randn(batch, 3, *geometry.input_size, generator=torch.Generator().manual_seed(0))
        with family_variants(model, method, remove, x) as fns:
            times = paired_rounds(fns, args.threads, args.rounds, args.calls)
        a, b = summarise(times[method]), summarise(times["truncated"])
        effect = paired_effect(times["truncated"], times[method])
        print(f"  {batch:>5}  {a.median_ms:>9.3f} ({a.iqr_ms:>6.3f})  {b.median_ms:>9.3f} ({b.iqr_ms:>6.3f})  "
              f"{effect.ratio:>11.4f} [{effect.ci[0]:.4f}, {effect.ci[1]:.4f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", choices=list(CASES),
                        help="workloads (default: all, or none when --family is given)")
    parser.add_argument("--family", nargs="*", choices=list(FAMILIES),
                        help="model families to compare against ideal truncation (no name: all)")
    parser.add_argument("--method", choices=list(METHODS), default="pomt",
                        help="the reducer of --family (default pomt)")
    parser.add_argument("--batch", type=int, nargs="+", help="batch sizes (default: each case's own; families 1 16)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=3, help="calls per timed round")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    cases = args.case if args.case is not None else ([] if args.family is not None else list(CASES))
    for name in cases:
        case = CASES[name]
        run_case(case, args.batch or list(case.batches), args)
    families = (args.family or list(FAMILIES)) if args.family is not None else []
    for label in families:
        run_family(label, args, args.batch or list(FAMILY_BATCHES))


if __name__ == "__main__":
    main()
