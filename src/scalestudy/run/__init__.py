"""Stage 3, running a point: the launch lines (``launch``: torchrun; ``nodes``: several nodes),
Slurm resources and site settings (``slurm``), the runner with its watchdog (``runner``) and
the classification of what happened (``outcome``)."""
