"""Stage 2, the plan: the study's sweep points (``planner``) and every feasibility rule
(``constraints``)."""
