"""Benchmark the unpruned model against a pruning schedule and other token reducers (see `--help`)."""

import logging
import sys

# torch.utils.benchmark (used by pomt.measure) imports cpp_extension, which logs "No CUDA runtime is
# found" on CPU-only machines: noise, and a second stderr line beside a one-line error.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

from pomt.cli import main  # noqa: E402

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]])
