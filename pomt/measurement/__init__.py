"""Latency on a drifting machine: timing, where visits come from (live or replayed), drift and pooling,
paired tests, step detection, the design of passes and the search that confirms steps."""
