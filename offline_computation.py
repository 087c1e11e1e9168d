"""Offline schedule computation: `python offline_computation.py --model deit_base --batch-size 4`.

The same as `pomt offline ...`; see `--help` for every option.
"""

import sys

from pomt.cli import main

if __name__ == "__main__":
    main(["offline", *sys.argv[1:]])
