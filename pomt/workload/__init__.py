"""What is measured: the resolved run (model, device, sizes, output stem) and the workload made concrete
(model in its dtype, input, grid, journal, live measurement run)."""
