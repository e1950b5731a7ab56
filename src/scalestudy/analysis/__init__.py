"""Stage 5, the tables: statistics (``stats``), efficiency and speedup (``efficiency``), and
the aggregation of run records into ``runs.csv`` / ``efficiency.csv`` (``aggregate``)."""
