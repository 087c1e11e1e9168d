"""A schedule measured against the unpruned model before it ships: here, in a fresh process, and on the GPU
against its host."""
