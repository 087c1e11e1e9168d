"""What to ship: accuracy against kept tokens, the policies that rank removals, and the verification of the
patched model (here and in a fresh process)."""
