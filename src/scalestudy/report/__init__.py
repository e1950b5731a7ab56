"""Stage 6, what a reader sees: figures (``plots``), ``summary.md`` (``summary``) and the
published references overlaid on them (``references``)."""
