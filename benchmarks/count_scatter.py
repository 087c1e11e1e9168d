"""Whether the counts within reach scatter from one to the next beyond their visits' noise, on each bank trace's
dense record: the truth against which a run's "the counts there scatter X%" is judged.

Every visit of the recording within reach (the top `--reach` counts), drift divided out over the whole trace, its
count's level on the trace's smooth trend divided out (`detection_limits.loaded`, as the bank scores), then per
trace: visits a count, a visit's noise (the pooled within-count SD), tau (the count-level SD the counts' means
show beyond that noise, by moments), and a one-way analysis of variance of the counts (p: the counts' means this
far apart by their visits' spread alone) beside Kruskal-Wallis (the same without the normal tails). A run's own
windows see 2-6 visits a count; the record's 8-34 tell chance scatter from the device's. No timing. Usage:
    python benchmarks/count_scatter.py [--reach 48]
"""

from __future__ import annotations

import argparse

import numpy as np
from detection_limits import bank, loaded
from scipy import stats

from pomt.measurement.drift import corrected_values


def scatter_row(name: str, reach_below: int) -> str:
    trace, trend = loaded(name)
    values = corrected_values(list(trace.visits))
    counts = [n for n in sorted(values) if n >= trace.num_tokens - reach_below]
    groups = [np.log(np.asarray(values[n]) / trend[n]) for n in counts]
    visits = float(np.mean([g.size for g in groups]))
    within = float(np.mean([g.var(ddof=1) for g in groups]))
    tau = np.sqrt(max(0.0, float(np.var([g.mean() for g in groups], ddof=1)) - within / visits))
    anova_p = stats.f_oneway(*groups).pvalue
    kruskal_p = stats.kruskal(*groups).pvalue
    return (f"{name:38s} {visits:5.1f} visits a count  noise {100 * np.sqrt(within):5.1f}%  tau {100 * tau:4.1f}%  "
            f"anova p = {anova_p:.1e}  kruskal p = {kruskal_p:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reach", type=int, default=48, help="the top counts tested (the step policy's reach)")
    args = parser.parse_args()
    for name in bank():
        print(scatter_row(name, args.reach))


if __name__ == "__main__":
    main()
