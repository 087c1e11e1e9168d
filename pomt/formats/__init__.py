"""The files pomt writes and reads back: the schedule JSON, the latency trace, the curve CSV."""
