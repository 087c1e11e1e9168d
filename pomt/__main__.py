"""`python -m pomt` runs the console script."""

from pomt.cli import main

main()
