"""What a visit's untimed forward buys on this machine: the first forward at a token count against the next ones.

Each visit times three forwards back to back at a count drawn at random (`--low` to N), in the runtime the offline
computation times (eager, `live_forwards`, the steady allocator, `--threads`). Printed: the first over the
second forward and the third over the second (geometric mean with a 2-SE interval, the median and the spread), for
visits to counts new to the process and to counts visited before (`--pool K` draws the counts from K of them, so
that most visits are repeats). Where the first forward is no slower and no noisier than the second, the untimed
forward only doubles the cost of a one-forward visit (docs/results/amd-epyc-2core.md). On the 2-core
AMD VM (2026-11-30): +1.5% [+0.4, +2.5] on deit_tiny at batch 1 (23 ms) at counts mostly new, +0.3% [-0.4, +1.1] at
counts seen before; +0.5% [-0.9, +2.0] on deit_small at batch 4, -0.6% [-3.6, +2.4] on deit_base at batch 4 (1.2 s a
forward), and at counts seen before -1.1% [-2.7, +0.6], SD 6.7% against 7.3% for the third over the second.

Usage: python benchmarks/settle.py --model deit_base --batch-size 4 [--visits 40] [--low 148] [--pool 10]
       [--json PATH]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from tqdm import tqdm

from pomt.device.allocator import steady_allocator
from pomt.io import atomic_write_json
from pomt.measurement.sources import live_forwards
from pomt.measurement.timing import fixed_threads, time_calls
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model


def ratio(logs: list[float]) -> str:
    """A geometric mean ratio in percent with its 2-SE interval, the median, and the log ratios' spread (SD, %):
    a first forward noisier than the next ones shows as a wider spread of first / second than of third / second."""
    if len(logs) < 2:
        return f"{len(logs)} visits: too few"
    a = np.asarray(logs)
    mean, se = a.mean(), a.std(ddof=1) / np.sqrt(a.size)
    pct = [100 * np.expm1(v) for v in (mean, mean - 2 * se, mean + 2 * se, np.median(a))]
    return (f"{pct[0]:+.2f}% [{pct[1]:+.2f}, {pct[2]:+.2f}], median {pct[3]:+.2f}%, SD {100 * a.std(ddof=1):.2f}% "
            f"({a.size} visits)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="deit_base")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--input-size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--visits", type=int, default=40)
    parser.add_argument("--low", type=int, default=148, help="fewest tokens kept")
    parser.add_argument("--pool", type=int, default=0, help="draw the counts from this many (0: from all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write every visit's count and three times (ms) here")
    args = parser.parse_args()

    steady_allocator()
    model = create_model(args.model, args.input_size).eval()
    n = model_geometry(model).num_tokens
    x = torch.randn(args.batch_size, 3, args.input_size, args.input_size)
    forward_at = live_forwards(model, x, threads=args.threads)
    rng = np.random.default_rng(args.seed)
    counts = rng.integers(args.low, n + 1, size=args.pool) if args.pool else None
    seen, first, third = {n}, {False: [], True: []}, {False: [], True: []}
    visits = []
    with fixed_threads(args.threads) as threads, torch.inference_mode():
        with forward_at(n) as forward:  # the reference, as a search's first visits
            time_calls(forward, "cpu", 2, threads)
        for _ in tqdm(range(args.visits), desc="visits", unit="visit"):
            tokens = int(rng.choice(counts) if counts is not None else rng.integers(args.low, n + 1))
            with forward_at(tokens) as forward:
                times = time_calls(forward, "cpu", 3, threads)
            visits.append({"tokens": tokens, "ms": times})
            again = tokens in seen
            seen.add(tokens)
            first[again].append(float(np.log(times[0] / times[1])))
            third[again].append(float(np.log(times[2] / times[1])))
    print(f"{args.model} at batch {args.batch_size}, {args.input_size} px, {args.threads} threads, counts "
          f"{args.low}-{n}")
    for again, words in ((False, "counts new to the process"), (True, "counts visited before")):
        print(f"  {words}: first / second {ratio(first[again])}; third / second {ratio(third[again])}")
    if args.json:
        atomic_write_json(args.json, {"args": vars(args), "visits": visits})


if __name__ == "__main__":
    main()
