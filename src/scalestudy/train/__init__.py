"""The per-point trainer: ``python -m scalestudy.train POINT_JSON RUN_DIR`` under torchrun
(``loop``), its device helpers (``device``), the synthetic data (``data``), the record it
writes (``run_files``) and an optional step hook (``hooks``)."""
