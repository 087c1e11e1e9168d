"""What to ship: accuracy against kept tokens, the policies that rank removals, the verification of the
patched model (here and in a fresh process), and the speed-accuracy frontier of schedules across blocks and
reducers (measured accuracy, predicted latency, the search and the choices on it)."""
