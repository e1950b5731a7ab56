"""Measurements of the building blocks on the study's own device: the matmul ceiling and the
study's product shapes (``calibrate``), and microbenchmarks of matmuls, attention,
collectives, memory and framework overhead (``microbench``)."""
