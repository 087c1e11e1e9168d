"""A seeded background load for recording traces on a noisy stretch (the curve bank's noisy traces).

It plays a neighbour on a shared VM: bursts of work of random length and pause, each burst either streaming
a large array through memory (contending for memory bandwidth and the last-level cache) or spinning on
arithmetic (contending for a core). Run it beside `pomt record` and stop it afterwards:

    python benchmarks/noisy_neighbour.py --duty 0.5 --seed 0 &  pomt record ...;  kill %1
"""

from __future__ import annotations

import time

import numpy as np
import typer


def main(duty: float = typer.Option(0.5, help="Share of the time busy, on average."),
         mean_burst_s: float = typer.Option(1.0, help="Mean length of a burst (exponential)."),
         memory_share: float = typer.Option(0.5, help="Share of the bursts that stream memory, not arithmetic."),
         megabytes: int = typer.Option(256, help="Size of the streamed array."),
         seed: int = typer.Option(0, help="Seed of the burst lengths and kinds.")) -> None:
    """Alternate busy bursts and pauses until killed."""
    rng = np.random.default_rng(seed)
    block = np.ones(megabytes * 2**20 // 8)
    small = np.ones(256)
    while True:
        busy = rng.exponential(mean_burst_s)
        idle = rng.exponential(mean_burst_s * (1 - duty) / duty)
        stream = rng.random() < memory_share
        end = time.perf_counter() + busy
        while time.perf_counter() < end:
            if stream:
                block += 1.0
            else:
                small *= 1.0000001
        time.sleep(idle)


if __name__ == "__main__":
    typer.run(main)
