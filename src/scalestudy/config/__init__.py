"""Stage 1, the study: loading and validating a study file (``study``), its vocabulary
(``vocab``) and the typed sweep point every later stage reads (``point``)."""
