# scalestudy: the workflow lives in workflow/Snakefile (Snakemake's standard place); this
# top-level file lets `snakemake` run from the repository root.
include: "workflow/Snakefile"


rule default:
    """Everything the study produces: workflow/Snakefile's `all` (an included file's first
    rule is not Snakemake's default target, so the root names it)."""
    default_target: True
    input:
        rules.all.input,
