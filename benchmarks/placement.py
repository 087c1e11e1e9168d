"""Why a step near N moves between processes on CPU: memory placement under glibc's dynamic mmap threshold.

In one process, the model and its input are built afresh several times (each after a filler allocation of
random size, so the allocator's history differs), and each placement measures N against N - `--remove` kept
tokens in paired rounds (A B, B A, ...; `pomt.measurement.robust.paired_effect` on the per-round medians).
This runs in a child process per allocator setting: glibc's defaults (its mmap threshold adapts to what was
freed), the threshold fixed low (`MALLOC_MMAP_THRESHOLD_`, which also turns the adaptation off) and pomt's
steady settings (`pomt.device.allocator.STEADY`).

On the 2-core VM (deit_small, batch 4, 2 threads), which placements run slow depends on the heap's whole
history, so on the code that runs before them too. Under glibc's defaults, a loop timing with perf_counter
found one or two of five placements at N / 194 = 1.09-1.11 (N at 210-211 ms, the level of the offline run
whose cliff by N a fresh process did not have, `pomt.verification.fresh`) in each of four runs, a version timing
with `time_calls` one of five at 1.061 [1.040, 1.082], and this version (visits through `LiveSource`) none of
five (1.009-1.034). With the threshold fixed either way (128 KiB, 1 GiB), no placement of any version ran slow
(1.010-1.027). A schedule's steps near N hold only under the allocator settings they were measured with; the
device fingerprint records them (`allocator`). No timing threshold: it prints what it measured.
Usage: python benchmarks/placement.py [--model deit_small] [--batch-size 4] [--remove 3] [--placements 5]
       [--rounds 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np
import torch

from pomt.device.allocator import STEADY
from pomt.measurement.robust import paired_effect
from pomt.measurement.sources import LiveSource, live_forwards
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model, resolve_model_name

SETTINGS = {"glibc defaults": {}, "mmap threshold fixed at 128 KiB": {"MALLOC_MMAP_THRESHOLD_": "131072"},
            "steady (pomt's default since 2026-11-27)": dict(STEADY)}


def placements(args: argparse.Namespace) -> None:
    """The child's side: every placement's paired ratio, one line each."""
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    held: list[torch.Tensor] = []  # the fillers stay alive, so each placement sees another heap
    name = resolve_model_name(args.model)
    for placement in range(args.placements):
        held.append(torch.empty(int(rng.integers(1, 5_000_000)), dtype=torch.uint8))
        model = create_model(name).eval()
        geometry = model_geometry(model)
        n, low = geometry.num_tokens, geometry.num_tokens - args.remove
        x = torch.randn(args.batch_size, 3, *geometry.input_size)
        source = LiveSource(live_forwards(model, x, threads=args.threads), "cpu", args.threads, backend="eager")
        medians: dict[int, list[float]] = {n: [], low: []}
        for r in range(args.rounds):
            for k in (n, low) if r % 2 == 0 else (low, n):
                medians[k].append(source.visit(k, 2, r).median_ms)  # two timed forwards
        effect = paired_effect(medians[low], medians[n])  # N's latency over N - remove's
        print(f"  placement {placement}: N = {n} at {np.median(medians[n]):.1f} ms, {low} at "
              f"{np.median(medians[low]):.1f} ms; N / {low} = {effect.ratio:.3f} [{effect.ci[0]:.3f}, "
              f"{effect.ci[1]:.3f}]", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deit_small")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--remove", type=int, default=3, help="tokens below N compared with N")
    parser.add_argument("--placements", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        placements(args)
        return
    for label, env in SETTINGS.items():
        print(f"{label}:", flush=True)
        subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]], env={**os.environ, **env}, check=True)


if __name__ == "__main__":
    main()
