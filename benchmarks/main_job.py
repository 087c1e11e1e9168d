"""Time and peak memory of the default main job (`python offline_computation.py --model deit_base
--batch-size 4`) on this machine, run as a child process exactly as a user runs it.

Goal (offline issue): finishes within 10 minutes on a 2-core CPU with peak RSS under 2 GiB.
Usage: python benchmarks/main_job.py [extra offline_computation.py options]
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 600.0
GOAL_RSS_GIB = 2.0


def main(extra: list[str]) -> int:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, str(ROOT / "offline_computation.py"), "--model", "deit_base",
                   "--batch-size", "4", "--output-dir", out, "--no-progress", *extra]
        start = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, text=True, capture_output=True)
        wall = time.perf_counter() - start
        peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # ru_maxrss is KiB
    print(result.stdout, end="")
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        return result.returncode
    print(f"main job: wall {wall:.0f} s (goal <= {GOAL_S:.0f} s: {'met' if wall <= GOAL_S else 'MISSED'}); "
          f"peak RSS {peak_gib:.2f} GiB (goal < {GOAL_RSS_GIB} GiB: "
          f"{'met' if peak_gib < GOAL_RSS_GIB else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
