"""The jobs that string the stages together: the offline computation and `pomt record`."""
