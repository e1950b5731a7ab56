"""Measurements of the building blocks on the study's own device: the matmul ceiling and the
study's product shapes (``calibrate``), and microbenchmarks, one module per kind of
measurement (``matmul``, ``attention``, ``bandwidth``, ``collectives``, ``memory``,
``overhead``, ``blocks``, ``host_sharing``, ``validate``), with ``microbench`` their command
line."""
