"""Stage 4, the run record: the files of a run folder and the states a run ends in
(``states``), written atomically (``io``)."""
