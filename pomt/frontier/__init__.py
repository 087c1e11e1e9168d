"""The speed-accuracy frontier of schedules across blocks and reducers: what a schedule costs, how
accurate it is, the search, the choice and the report."""
