# scalestudy: the workflow lives in workflow/Snakefile (Snakemake's standard place); this
# top-level file lets `snakemake` run from the repository root.
include: "workflow/Snakefile"
