"""Benchmark the unpruned model against a pruning schedule and other token reducers (see `--help`)."""

import sys

from pomt.cli import main

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]])
