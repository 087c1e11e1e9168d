"""Does measuring two counts back to back change the ratio between them? A check of the search's design.

The adaptive search visits each aligned edge's two counts (a - 1, a) back to back in its coarse passes and
counts those visits as paired rounds of the edge (`pomt.measurement.search`); every confirmation pairs visits the same
way. That is sound only if a visit does not carry over into the next (kernel choice, allocator, caches): the
two counts must read the same ratio back to back as apart. The aligned traces in tests/data left this open
(several edges there read smaller than in the traces recorded without pairs, another day).

One process, one model. Each round measures the same counts twice, in two conditions, their order
alternating from round to round so that drift weighs on both alike: `pair` visits each (a - 1, a) back to
back (A B, then B A the next round) and a + 1 on its own, in a shuffled order; `apart` visits every count
on its own in a shuffled order in which no (a - 1, a) is adjacent. For each a it prints L(a - 1) / L(a) and
L(a + 1) / L(a) in each condition (the geometric mean over rounds, with a 95% interval from
`pomt.measurement.robust.paired_effect`) and a Welch t-test of pair against apart. No timing threshold: it prints what
it measured.

On the 2-core AMD VM (deit_tiny, batch 1, 2 threads, 16 rounds, 2026-11-23) the two conditions agreed at
all 8 edges (p 0.05-0.96; L(65)/L(64) +4.9% both ways, L(17)/L(16) +9.4% back to back and +11.1% apart, the
largest difference); a first run at 16, 32 and 64 agreed too (p 0.20-0.63). The same runs show that the larger
edge of an aligned count lay on its a + 1 side at 16, 32 and 64 (5-11%, against 1-4% on the a - 1 side). At
152-192 (`--aligned 152,160,168,176,184,192 --rounds 12`) the conditions agreed again (p 0.06-0.80), and the a - 1
side was the larger at each count (2.0-7.8%, against 1.6-2.6%).
Usage: python benchmarks/pairing.py [--model deit_tiny] [--batch-size 1] [--aligned 16,32,64,128] [--rounds 16]
       [--threads 2] [--visit-s 0.1]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy import stats as scipy_stats
from tqdm import tqdm

from pomt.measurement.robust import paired_effect
from pomt.measurement.sources import calibrate_reps
from pomt.workload.prepare import Workload, live_run, prepare

Levels = dict[int, float]  # visit median (ms) per count, one round of one condition


def paired_order(aligned: list[int], round_index: int, rng: np.random.Generator) -> list[int]:
    """Each (a - 1, a) back to back (reversed every other round), each a + 1 alone, the units shuffled."""
    units = [(a - 1, a) if round_index % 2 == 0 else (a, a - 1) for a in aligned] + [(a + 1,) for a in aligned]
    return [n for i in rng.permutation(len(units)) for n in units[i]]


def apart_order(aligned: list[int], rng: np.random.Generator) -> list[int]:
    """Every count alone, shuffled until no (a - 1, a) is adjacent."""
    counts = sorted({n for a in aligned for n in (a - 1, a, a + 1)})
    while True:
        order = [counts[i] for i in rng.permutation(len(counts))]
        if not any({p, q} == {a - 1, a} for p, q in zip(order, order[1:], strict=False) for a in aligned):
            return order


def ratio_row(rounds: dict[str, list[Levels]], other: int, a: int) -> str:
    """L(other) / L(a) in each condition, and whether the two conditions differ."""
    cells, logs = [], {}
    for condition, levels in rounds.items():
        effect = paired_effect([r[a] for r in levels], [r[other] for r in levels])
        logs[condition] = [math.log(r[other] / r[a]) for r in levels]
        low, high = (100 * (end - 1) for end in effect.ci)
        cells.append(f"{condition} {100 * (effect.ratio - 1):+5.1f}% [{low:+5.1f}, {high:+5.1f}]")
    differ = scipy_stats.ttest_ind(logs["pair"], logs["apart"], equal_var=False).pvalue
    return f"L({other})/L({a})  " + "   ".join(cells) + f"   pair vs apart p = {differ:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deit_tiny")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--aligned", default="16,32,64,128", help="aligned counts a, each with a - 1 and a + 1")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--visit-s", type=float, default=0.1, help="seconds of timing per visit")
    args = parser.parse_args()
    aligned = sorted(int(a) for a in args.aligned.split(","))
    workload = Workload(model=args.model, batch_size=args.batch_size, device="cpu", threads=args.threads,
                        progress=False)
    source = live_run(workload, prepare(workload))  # as the offline computation measures, nothing written
    reps = calibrate_reps(source.visit(max(aligned) + 1, 3, 0).median_ms / 1e3, args.visit_s)
    rng = np.random.default_rng(0)
    rounds: dict[str, list[Levels]] = {"pair": [], "apart": []}
    for r in tqdm(range(args.rounds), desc="rounds", unit="round"):
        for condition in ("pair", "apart") if r % 2 == 0 else ("apart", "pair"):
            order = paired_order(aligned, r, rng) if condition == "pair" else apart_order(aligned, rng)
            rounds[condition].append({n: source.visit(n, reps, r).median_ms for n in order})
    print(f"\n{args.model}, batch {args.batch_size}, {args.threads} threads, {reps} timed forwards a visit, "
          f"{args.rounds} rounds of each condition (geometric mean over rounds, 95% interval)")
    for a in aligned:
        for other in (a - 1, a + 1):
            print(ratio_row(rounds, other, a))


if __name__ == "__main__":
    main()
