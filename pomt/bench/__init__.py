"""Side-by-side benchmarks of the unpruned model, a schedule and other token reducers.

Modules: `config` (what to compare, checked once), `variants` (the reductions and their models), `costs` (FLOPs,
memory, power), `latency` (predicted from the schedule's curve, and reducers tuned to its measured latency),
`accuracy` (paired on the same images), `run` (the measurement), `report` (tables and files).
"""

from pomt.bench.config import BenchConfig
from pomt.bench.costs import count_flops
from pomt.bench.report import COLUMNS, format_sweep, format_table, write_benchmark, write_sweep
from pomt.bench.run import BenchResult, SweepResult, run_benchmark, run_sweep

__all__ = [
    "COLUMNS", "BenchConfig", "BenchResult", "SweepResult", "count_flops", "format_sweep", "format_table",
    "run_benchmark", "run_sweep", "write_benchmark", "write_sweep",
]
