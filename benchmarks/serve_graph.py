"""A schedule served as a user serves it: `pomt.apply_schedule` with its warnings as errors (a schedule verified on
this device and runtime applies silently), then, where it was measured as CUDA graphs, `pomt.cuda_graph`:
new batches against the patched model eager (largest logit difference, top-1 agreement), and the unpruned
graph, the schedule eager and the schedule as a graph timed in interleaved rounds (CUDA events, 10 replays a
round). Random weights: latency does not depend on them.
Usage: python benchmarks/serve_graph.py bin/<stem>.schedule.json [--rounds 15]
"""

from __future__ import annotations

import argparse
import warnings

import torch

import pomt
from pomt.cli.app import fail
from pomt.errors import PomtError
from pomt.measurement.timing import summarise, time_calls
from pomt.runtimes import Backend

CALLS = 10  # timed replays a round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("schedule")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        fail("serve_graph.py serves on an NVIDIA GPU, and none is present")
    try:
        schedule = pomt.load_schedule(args.schedule)
        model = pomt.create_model(schedule.model, input_size=schedule.input_size)
    except PomtError as exc:
        fail(str(exc))
    dtype = getattr(torch, schedule.dtype)
    model = model.to("cuda", dtype)
    example = torch.randn(schedule.batch_size, 3, *schedule.input_size, device="cuda", dtype=dtype)
    graphs = schedule.backend_name == Backend.CUDAGRAPH.value
    unpruned = pomt.cuda_graph(model, example) if graphs else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pomt.apply_schedule(model, schedule)
    print(f"applied {schedule.method} {schedule.removal} ({schedule.backend_name}, {schedule.dtype}, batch "
          f"{schedule.batch_size}) without a warning")
    if not graphs:
        return
    graphed = pomt.cuda_graph(model, example)
    for seed in range(3):
        x = torch.randn(example.shape, generator=torch.Generator().manual_seed(seed)).to("cuda", dtype)
        with torch.inference_mode():
            eager = model(x).float()
        graph = graphed(x).float()
        print(f"batch {seed}: largest |graph - eager| logit {(graph - eager).abs().max().item():.4g}, top-1 "
              f"agreement {(graph.argmax(-1) == eager.argmax(-1)).float().mean().item():.3f}")
    calls = {"unpruned graph": unpruned, "schedule eager": lambda: model(example), "schedule graph": graphed}
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, call in calls.items():
                times[name] += time_calls(call, "cuda", CALLS)
    base = summarise(times["unpruned graph"]).median_ms
    for name, samples in times.items():
        stats = summarise(samples)
        print(f"{name:15s} {stats.median_ms:7.3f} ms (IQR {stats.iqr_ms:.3f})  "
              f"{base / stats.median_ms:.3f}x the unpruned graph")


if __name__ == "__main__":
    main()
