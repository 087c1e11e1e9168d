"""Side-by-side benchmarks of the unpruned model, a schedule and other token reducers."""

from pomt.bench.flops import count_flops
from pomt.bench.report import COLUMNS, format_sweep, format_table, write_benchmark, write_sweep
from pomt.bench.run import BenchConfig, BenchResult, SweepResult, run_benchmark, run_sweep

__all__ = [
    "COLUMNS",
    "BenchConfig",
    "BenchResult",
    "SweepResult",
    "count_flops",
    "format_sweep",
    "format_table",
    "run_benchmark",
    "run_sweep",
    "write_benchmark",
    "write_sweep",
]
