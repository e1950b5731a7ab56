"""The performance model judged against published results (a stage of its own, beside the
step and memory model of ``scalestudy.perf`` that a study's runs use): every row of the
shipped published tables predicted and compared (``published``), the published scaling series
anchored at their smallest N (``series``), the Frontier study at real scale (``frontier``) and
the fit of the model's one fitted constant, out of sample (``fit``)."""
